"""The maintenance and benchmark scripts run end to end on a tiny layer set."""

import json
import statistics
import subprocess

import pytest

from conftest import ENV, PYTHON, ROOT
from convbench.commands import validate_timing
from convbench.commands import precompile as precompile_command

CSV = ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
       "tiny,1,3,4,6,5,7,3,3,3,1,1\ntiny2,2,2,3,5,5,5,3,3,3,2,0\n")


@pytest.fixture
def layer_csv(tmp_path):
    path = tmp_path / "layers.csv"
    path.write_text(CSV)
    return path


def script(name, *args, timeout=900):
    return subprocess.run([PYTHON, str(ROOT / "scripts" / name), *map(str, args)],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)


def test_precompile_then_require_precompiled(tmp_path, layer_csv, capsys):
    cache = tmp_path / "cache"
    precompile = precompile_command.main
    args = ["--implementation", "implicitGemm", "--paramscsv", str(layer_csv), "--cachedir",
            str(cache)]
    assert precompile(args + ["--jobs", "2"]) == 0
    assert "2 built, 0 already cached, 0 failed" in capsys.readouterr().out
    assert precompile(args) == 0
    assert "0 built, 2 already cached" in capsys.readouterr().out
    # A fresh process loads what the workers built, compiling nothing.
    run = subprocess.run([PYTHON, str(ROOT / "profile_conv3d.py"), "--implementation",
                          "implicitGemm", "--device", "cpu", "--paramscsv", str(layer_csv),
                          "--cachedir", str(cache), "--verify", "--require-precompiled"],
                         capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" loaded ") == 2 and run.stdout.count("PASS") == 2


@pytest.mark.parametrize("args, words", [
    (["--target", "tpu"], "--target: unknown target 'tpu'"),
    (["--implementation", "nosuch"], "unknown implementation 'nosuch'"),
    (["--param", "CTAtileM=64"], "--param: give exactly one --implementation"),
    (["--jobs", "0"], "--jobs: must be an integer >= 1"),
])
def test_precompile_bad_input(args, words, capsys):
    assert precompile_command.main(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precompile.py: error: ") and words in lines[0]
    assert out == ""


def test_bench_cache_reports_cold_and_warm(tmp_path, layer_csv):
    out = tmp_path / "bench.json"
    result = script("bench_cache.py", "--implementation", "implicitGemm", "--paramscsv", layer_csv,
                    "--layer", "tiny", "--target", "cpu", "--cold", "1", "--warm", "1",
                    "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    rec = json.loads(out.read_text())["records"][0]
    assert rec["target"] == "cpu" and rec["cold_s"][0] > rec["warm_load_s"][0] > 0


def test_validate_timing_compares_with_dace_instrumentation(tmp_path, layer_csv, capsys):
    out = tmp_path / "validate.json"
    status = validate_timing.main([
        "--implementation", "implicitGemm", "--paramscsv", str(layer_csv), "--layer", "tiny",
        "--rounds", "2", "--warmupiter", "1", "--totaliter", "4", "--no-flush", "--out", str(out)])
    assert status == 0, capsys.readouterr()
    rec = json.loads(out.read_text())["records"][0]
    assert len(rec["profiler_ms"]) == 2 and all(len(r) == 4 for r in rec["dace_ms"])
    # Every call is timed from outside and inside: DaCe's inner timer sees part of the call,
    # never more (0.05 ms of slack for the clocks' granularity).  A preempted call only
    # widens the gap, so this holds on a loaded machine too.
    diffs = [a - b for ours, theirs in zip(rec["profiler_ms"], rec["dace_ms"])
             for a, b in zip(ours, theirs)]
    assert all(b > 0 for r in rec["dace_ms"] for b in r)
    assert min(diffs) > -0.05, diffs
    # The reported overhead is computed from exactly these pairs.
    assert rec["overhead_ms"] == {"median": statistics.median(diffs), "min": min(diffs),
                                  "max": max(diffs)}
    assert rec["round_medians_ms"] == [statistics.median(r) for r in rec["profiler_ms"]]


@pytest.mark.parametrize("args, words", [
    (["--pass", "sideways"], "--pass: unknown pass 'sideways'"),
    (["--layer", "conv99"], "--layer: unknown layer(s) conv99"),
    (["--batch", "0"], "--batch: must be an integer >= 1"),
])
def test_check_power_bad_input(args, words, capsys):
    from convbench.commands import check_power
    assert check_power.main(["--paramscsv", "cosmoflow"] + args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("check_power.py: error: ") and words in lines[0]


def test_check_power_writes_its_table(tmp_path, capsys):
    from convbench.commands import check_power
    assert check_power.main(["--paramscsv", "cosmoflow", "--layer", "conv7", "--pass",
                             "bwd_filter", "--outdir", str(tmp_path)]) == 0
    rows = (tmp_path / "power.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and "0 with a wrong verdict" in capsys.readouterr().out
    assert rows[0].endswith(",bound_winogradF2BwdFilter,bound_winogradF2BwdFilter_ok")
    table = [line for line in (tmp_path / "power.md").read_text().splitlines()
             if line.startswith("| cosmoflow")]
    assert len(table) == 4 and not any("(!)" in line for line in table)
    assert all("winogradF2BwdFilter" in line for line in table)
    assert json.loads((tmp_path / "metadata.json").read_text())["kind"] == "check_power"


def _bench_folder(path, rounds):
    """A bench_cpu.py forward folder of one layer: per round, torch-ndhwc and implA ms."""
    (path / "fwd").mkdir(parents=True)
    geometry = "4->8 @8^3 k3^3 s1 p1 b2"
    (path / "fwd" / "summary.csv").write_text(
        "implementation,geometry,batch,backend,median_ms\n" + "".join(
            f"set/conv1,{geometry},2,{b},1.0\n" for b in ("torch-ndhwc", "implA")))
    (path / "fwd" / "rounds.csv").write_text("layer,round,backend,median_ms\n" + "".join(
        f"set/conv1,{r + 1},torch-ndhwc,10\nset/conv1,{r + 1},implA,{ms}\n"
        for r, ms in enumerate(rounds)))
    (path / "fwd" / "metadata.json").write_text("{}")
    return geometry


def _network_folder(path, geometry, torch_ms, dace_ms):
    path.mkdir(parents=True)
    (path / "metadata.json").write_text(json.dumps({
        "kind": "end2end", "memory_format": "ndhwc",
        "implementations": {"conv1": {"fwd": "implA"}}}))
    (path / "summary.csv").write_text(
        "layer,geometry,batch,implementation,backend,median_ms\n"
        f"forward.conv1.fwd,{geometry},2,implA,torch,{torch_ms}\n"
        f"forward.conv1.fwd,{geometry},2,implA,dace,{dace_ms}\n"
        "forward.total,,2,-,torch,50\nforward.total,,2,-,dace,60\n")


def test_bench_vs_network_pools_bench_runs(tmp_path, capsys):
    """Two bench runs: their rounds count together (ratios 1.0-1.2 and 1.4)."""
    from convbench.commands import bench_vs_network
    geometry = _bench_folder(tmp_path / "b1", [10, 11, 12])
    _bench_folder(tmp_path / "b2", [14])
    _network_folder(tmp_path / "net", geometry, 10, 13)
    assert bench_vs_network.main(["--bench", str(tmp_path / "b1"), "--bench",
                                  str(tmp_path / "b2"), "--network", str(tmp_path / "net")]) == 0
    text = capsys.readouterr().out
    assert "1.15 (1.00-1.40)" in text and "(bench: 4 rounds; network: 1 runs)" in text


@pytest.mark.parametrize("network_ms, overlap", [((15, 16), False), ((11.5, 13), True)])
def test_bench_vs_network_ratios_and_overlap(tmp_path, capsys, network_ms, overlap):
    """The bench's per-round ratios (1.0, 1.1, 1.2) against two network runs: a median
    with its range on each side, and whether the ranges overlap."""
    from convbench.commands import bench_vs_network
    geometry = _bench_folder(tmp_path / "bench", [10, 11, 12])
    nets = []
    for i, ms in enumerate(network_ms):
        nets += ["--network", str(tmp_path / f"net{i}")]
        _network_folder(tmp_path / f"net{i}", geometry, 10, ms)
    out = tmp_path / "agreement.md"
    assert bench_vs_network.main(["--bench", str(tmp_path / "bench"), *nets,
                                  "--out", str(out)]) == 0
    text = capsys.readouterr().out
    row = [line for line in out.read_text().splitlines() if line.startswith("| conv1")]
    assert len(row) == 1 and "1.10 (1.00-1.20)" in row[0], row
    lo, hi = min(network_ms) / 10, max(network_ms) / 10
    assert f"({lo:.2f}-{hi:.2f})" in row[0]
    assert row[0].rstrip(" |").endswith("yes" if overlap else "no")
    assert f"ranges overlap on {int(overlap)} of 1 parts" in text


def test_bench_vs_network_bad_input(tmp_path, capsys):
    from convbench.commands import bench_vs_network
    assert bench_vs_network.main(["--bench", str(tmp_path), "--network", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_vs_network.py: error: --bench")
    assert "Traceback" not in out + err
