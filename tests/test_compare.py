"""``convbench compare``: two runs side by side, and a gate on slowdowns beyond the noise."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from convbench.commands import compare

RUN = (Path(__file__).resolve().parent.parent / "results/cpu/epyc_f26m2_avx512/"
       "bench_cpu_cosmoflow_mlperf_s64_b2_winograd/bwd_filter")


def _copy(tmp_path, name, slow=None, factor=1.2, **meta):
    """A copy of a committed bench run; ``slow``: the backend whose conv3 row is scaled."""
    out = tmp_path / name
    shutil.copytree(RUN, out)
    with open(out / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["layer"] == "conv3" and row["backend"] == slow:
            for col in ("median_ms", "q1_ms", "q3_ms"):
                row[col] = str(float(row[col]) * factor)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if meta:
        data = json.loads((out / "metadata.json").read_text())
        data.update(meta)
        (out / "metadata.json").write_text(json.dumps(data))
    return out


def test_the_same_run_is_the_same(tmp_path, capsys):
    a = _copy(tmp_path, "a")
    assert compare.main([str(a), str(a), "--fail-above", "0"]) == 0
    out = capsys.readouterr().out
    assert "slower" not in out and "faster" not in out and "note:" not in out


def test_a_planted_slowdown_fails_the_gate_and_names_the_difference(tmp_path, capsys):
    a = _copy(tmp_path, "a")
    b = _copy(tmp_path, "b", slow="winogradF2BwdFilter", precision="bfloat16")
    assert compare.main([str(a), str(b), "--fail-above", "10"]) == compare.SLOWER_EXIT
    out = capsys.readouterr().out
    assert "1.200" in out and "slower" in out and "worst conv3 winogradF2BwdFilter" in out
    assert "precision differs: float32 (A) against bfloat16 (B)" in out
    assert compare.main([str(a), str(b), "--fail-above", "25"]) == 0  # 20% is below 25%
    faster = _copy(tmp_path, "c", slow="winogradF2BwdFilter", factor=0.8)
    assert compare.main([str(a / "summary.csv"), str(faster), "--fail-above", "0"]) == 0
    assert "faster" in capsys.readouterr().out


@pytest.mark.parametrize("make, words", [
    ("missing", "no summary.csv"),
    ("empty", "not a result summary"),
])
def test_bad_runs_are_one_line(tmp_path, make, words):
    run = tmp_path / "r"
    if make == "empty":
        run.mkdir()
        (run / "summary.csv").write_text("a,b\n")
    proc = subprocess.run([sys.executable, "-m", "convbench.main", "compare", str(run),
                           str(run)], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


def test_two_sweeps_are_compared_folder_by_folder(tmp_path, capsys):
    """Two folders of runs (sweeps) are compared by their result folders of the same name;
    a planted slowdown in one of them fails the gate."""
    for sweep, slow in (("A", None), ("B", "winogradF2BwdFilter")):
        (tmp_path / sweep).mkdir()
        _copy(tmp_path / sweep, "set-bwd_filter-float32", slow=slow)
        _copy(tmp_path / sweep, "set-fwd-float32")
    _copy(tmp_path / "B", "only-in-b")
    status = compare.main([str(tmp_path / "A"), str(tmp_path / "B"), "--fail-above", "10"])
    out = capsys.readouterr().out
    assert status == compare.SLOWER_EXIT
    assert "== set-bwd_filter-float32" in out and "== set-fwd-float32" in out
    assert "only-in-b" not in out
    assert sum(line.endswith(" slower") for line in out.splitlines()) == 1
    (tmp_path / "C").mkdir()
    _copy(tmp_path / "C", "other")
    assert compare.main([str(tmp_path / "A"), str(tmp_path / "C")]) == 2
    assert "no result folder of the same name" in capsys.readouterr().err
