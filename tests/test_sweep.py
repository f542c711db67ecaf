"""convbench sweep: parts as jobs through submitit (local, debug, slurm), one merged result,
resume after a killed job, and its one-line errors.

The parts run the fast tier's layers (tests/cases.py FAST_LAYERS), whose builds the
session has compiled already, so the sweeps here load and do not compile."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cases import FAST_LAYERS, Case
from conftest import ENV, PYTHON, ROOT, assert_usage_error, in_process
from convbench.timing import ceilings
from convbench.experiment import pipeline as experiment
from convbench.sweep import parts as sweep
from convbench.sweep import command as sweep_cmd
from convbench.experiment.pipeline import Experiment, TimingOptions
from convbench.layersets.layer import format_csv

FWD = ["directConvNCDHW", "implicitGemmNCDHW", "implicitGemm"]
BWD_DATA = ["directConvNCDHWBwdData", "implicitGemmBwdData", "directConvNDHWCdotBwdData"]
LAYERS = [layer for _, layer in FAST_LAYERS]
CASES = [Case(name, layer, set_name) for name in FWD + BWD_DATA for set_name, layer in FAST_LAYERS]
#: The local sweep's selection: one forward part, and two data-gradient parts (one of
#: them killed), so that a pass's merged folder joins a finished part and a resumed one.
LOCAL = {"fwd": FWD[:1], "bwd_data": BWD_DATA[:2]}
#: A stand-in for measured ceilings, where a test compares none.
CEILINGS = {"peak_gflops": 100.0, "peak_method": "stand-in", "bandwidth_gbs": 10.0,
            "bandwidth_method": "stand-in"}
TIMING = ["--warmupiter", "1", "--totaliter", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def layer_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep_layers") / "fast.csv"
    path.write_text(format_csv(LAYERS))
    return path


def _command(run, layer_csv, cachedir, extra=()):
    return [PYTHON, "-m", "convbench.main", "sweep", "profile", "--verify", "--implementation",
            ",".join(LOCAL["fwd"] + LOCAL["bwd_data"]), "--paramscsv", str(layer_csv),
            "--device", "cpu", "--cachedir", str(cachedir), "--outdir", str(run),
            "--executor", "local", "--array-parallelism", "2", *TIMING, *extra]


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _kill_first_running(run, victim, proc, deadline=240.0):
    """SIGKILL the job of part ``victim`` once it has started its results (mid-way)."""
    status = run / "parts" / victim / "status.json"
    started = run / "parts" / victim / "result" / "metadata.json"
    t0 = time.time()
    while time.time() - t0 < deadline and proc.poll() is None:
        if status.is_file() and started.is_file():
            try:
                info = json.loads(status.read_text())
            except ValueError:
                continue
            if info.get("state") == "running":
                os.kill(info["pid"], signal.SIGKILL)
                return info["pid"]
        time.sleep(0.05)
    raise AssertionError(f"part {victim} never ran (sweep exit {proc.poll()})")


@pytest.mark.prebuild(*[c for c in CASES if c.impl in LOCAL["fwd"] + LOCAL["bwd_data"]])
def test_local_sweep_merges_and_resumes_after_a_killed_job(builds, cachedir, layer_csv,
                                                           tmp_path, monkeypatch):
    """1 forward and 2 data-gradient implementations on the fast layers, two local jobs at
    a time: one job is killed mid-way; the sweep records it (with its log) and merges the
    rest; the same command again runs only that part, keeps the others, and the merged
    folders hold what one profile run of the same selection writes."""
    run = tmp_path / "run"
    victim = f"fast-bwd_data-float32-{BWD_DATA[1]}"
    proc = subprocess.Popen(_command(run, layer_csv, cachedir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        _kill_first_running(run, victim, proc)
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 1, out + err
    assert f"failed: {victim}: the job ended before the part finished" in out, out
    assert "log: " in out and "to run again" in out
    parts = {p.id: p for p in sweep.Sweep(run).parts()}
    assert len(parts) == 3
    states = {i: sweep.Sweep(run).status(p) for i, p in parts.items()}
    assert states[victim]["state"] == "failed" and states[victim]["logs"]
    kept = {i: s["finished"] for i, s in states.items() if i != victim}
    assert all(s["state"] == "complete" for i, s in states.items() if i != victim), states
    meta = json.loads((run / "fast-bwd_data-float32" / "metadata.json").read_text())
    assert meta["status"] == "incomplete" and meta["sweep"]["missing_parts"] == [victim]
    assert {r["part"]: r["state"] for r in _read(run / "parts.csv")}[victim] == "failed"

    again = subprocess.run(_command(run, layer_csv, cachedir), capture_output=True,
                           text=True, env=ENV, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 finished already, 1 to run" in again.stdout
    after = {i: sweep.Sweep(run).status(p) for i, p in parts.items()}
    assert after[victim]["state"] == "complete"
    assert {i: s["finished"] for i, s in after.items() if i != victim} == kept  # not re-run

    # The same selection as one profile run per pass, in this process.  The ceilings (a
    # large SGEMM, a copy and an FMA probe: about 7 s a run) are not compared: a stand-in.
    monkeypatch.setattr(ceilings, "measure", lambda device: dict(CEILINGS))
    for pass_, names in LOCAL.items():
        merged = run / f"fast-{pass_}-float32"
        direct = tmp_path / f"direct_{pass_}"
        Experiment(names, LAYERS, "cpu", policy="reuse", cachedir=cachedir, verify=True,
                   timing=TimingOptions(1, 3), outdir=direct, threads=1).run()
        a, b = _read(merged / "summary.csv"), _read(direct / "summary.csv")
        assert list(a[0]) == list(b[0])  # the same columns
        fixed = ("layer_index", "layer", "geometry", "batch", "implementation", "backend",
                 "samples", "gflop", "mbytes", "intensity")
        assert [[r[k] for k in fixed] for r in a] == [[r[k] for k in fixed] for r in b]
        meta_a = json.loads((merged / "metadata.json").read_text())
        meta_b = json.loads((direct / "metadata.json").read_text())
        assert meta_a["status"] == meta_b["status"] == "complete"
        one_or_list = names if len(names) > 1 else names[0]  # as profile writes them
        assert meta_a["implementation"] == meta_b["implementation"] == one_or_list
        assert meta_a["layers"] == meta_b["layers"] and meta_a["pass"] == meta_b["pass"]
        done = lambda m: [(d["layer"], d.get("verified")) for d in m["layers_done"]]  # noqa
        assert done(meta_a) == done(meta_b) and all(v for _, v in done(meta_a))
        assert len(_read(merged / "samples.csv")) == len(_read(direct / "samples.csv"))
        verified = _read(merged / "verify.csv")
        assert {(r["implementation"], r["layer"]) for r in verified} == {
            (n, layer.name) for n in names for layer in LAYERS}


@pytest.mark.prebuild(*[c for c in CASES if c.impl in (FWD[0], BWD_DATA[0])])
def test_debug_sweep_catches_a_planted_wrong_result(builds, cachedir, layer_csv, tmp_path,
                                                    capsys, monkeypatch):
    """In this process (--executor debug), a part whose output is wrong fails its check:
    verify.csv says so, and the sweep exits 1."""
    check = experiment.Experiment.check

    def planted(self, build, truth, tamper=None):
        if build.spec.impl.name == BWD_DATA[0]:
            tamper = lambda out: out * 1.001  # noqa: E731 - one part computes a wrong result
        return check(self, build, truth, tamper)
    monkeypatch.setattr(experiment.Experiment, "check", planted)
    call = in_process(sweep_cmd, capsys)
    result = call("verify", "--implementation", f"{FWD[0]},{BWD_DATA[0]}", "--paramscsv",
                  layer_csv, "--device", "cpu", "--cachedir", cachedir, "--outdir",
                  tmp_path / "run", "--executor", "debug", "--threads", "1")
    failed = f"{len(LAYERS)} failed check(s)"
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 of 2 part(s) complete" in result.stdout and failed in result.stdout
    rows = _read(tmp_path / "run" / "fast-bwd_data-float32" / "verify.csv")
    assert [r["status"] for r in rows] == ["failed"] * len(LAYERS)
    assert all(r["status"] == "passed"
               for r in _read(tmp_path / "run" / "fast-fwd-float32" / "verify.csv"))
    again = call("--merge", tmp_path / "run")  # by hand: the same verdict
    assert again.returncode == 1 and failed in again.stdout


def test_build_first_fills_the_cache_and_the_runs_load(tmp_path, capsys):
    """--build-first: a first array compiles into an empty cache, the second loads from it
    (--require-precompiled: a miss would fail).  On one layer: one build."""
    one_csv = tmp_path / "fast.csv"
    one_csv.write_text(format_csv(LAYERS[:1]))
    result = in_process(sweep_cmd, capsys)(
        "verify", "--implementation", FWD[0], "--paramscsv", one_csv, "--device", "cpu",
        "--cachedir", tmp_path / "cache", "--outdir", tmp_path / "run", "--executor", "debug",
        "--build-first", "--threads", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"build [1/1] fast-fwd-float32-{FWD[0]}: complete, builds 1 built" in result.stdout
    rows = _read(tmp_path / "run" / "fast-fwd-float32" / "verify.csv")
    assert [(r["status"], r["build"]) for r in rows] == [("passed", "loaded")]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``sbatch`` and ``srun`` stand-ins on PATH: sbatch keeps each script it is given
    and answers as Slurm's does."""
    bin_dir, scripts = tmp_path / "bin", tmp_path / "sbatch"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\nmkdir -p \"$FAKE_SBATCH\"\nn=$(ls \"$FAKE_SBATCH\" | wc -l)\n"
        "cp \"$1\" \"$FAKE_SBATCH/$((700 + n)).sh\"\necho \"Submitted batch job $((700 + n))\"\n")
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH", str(scripts))
    return scripts


def test_slurm_job_scripts_carry_the_flags(fake_slurm, layer_csv, tmp_path, capsys):
    """--executor slurm --build-first --no-wait submits a build array, a run array that
    waits for it, and a one-core merge job that waits for the runs; the scripts hold every
    flag given."""
    call = in_process(sweep_cmd, capsys)
    result = call("verify", "--implementation", ",".join(FWD), "--paramscsv", layer_csv,
                  "--device", "gpu", "--outdir", tmp_path / "run", "--executor", "slurm",
                  "--partition", "gpu", "--gpus-per-node", "1", "--cpus-per-task", "16",
                  "--time", "45", "--array-parallelism", "2", "--slurm", "account=proj1",
                  "--slurm", "qos=high", "--setup", "module load cuda", "--build-first",
                  "--no-wait")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted job array 701 (3 part(s)) and merge job 702" in result.stdout
    build, runs, merge = (fake_slurm / f"{n}.sh" for n in (700, 701, 702))
    for script in (build.read_text(), runs.read_text()):
        for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                     "#SBATCH --cpus-per-task=16", "#SBATCH --time=45",
                     "#SBATCH --array=0-2%2", "#SBATCH --account=proj1", "#SBATCH --qos=high",
                     "module load cuda", "-m submitit.core._submit"):
            assert line in script, (line, script)
    assert "#SBATCH --dependency=afterany:700" in runs.read_text()
    text = merge.read_text()
    assert "#SBATCH --dependency=afterany:701" in text and "--array" not in text
    assert "#SBATCH --cpus-per-task=1" in text and "gpus-per-node" not in text
    # The run array loads what the build array made; every part is pending until it runs.
    parts = sweep.Sweep(tmp_path / "run").parts()
    assert all("--require-precompiled" in p.argv and "--device" in p.argv for p in parts)
    assert all(sweep.Sweep(tmp_path / "run").status(p)["state"] == "pending" for p in parts)


@pytest.mark.parametrize("args,words", [
    (["verify", "--pass", "fwd", "--executor", "cluster"], ["--executor", "cluster"]),
    (["verify", "--pass", "fwd", "--partition", "gpu"], ["--partition", "only with"]),
    (["verify", "--pass", "fwd", "--executor", "slurm", "--slurm", "account"],
     ["--slurm", "KEY=VALUE"]),
    (["verify", "--implementation", "directConvNCDHW", "--pass", "bwd_data"],
     ["directConvNCDHW computes fwd"]),
    (["verify", "--implementation", "nope"], ["nope", "unknown implementation"]),
    (["verify", "--pass", "fwd", "--warmupiter", "-1"], ["--warmupiter"]),
    (["verify", "--pass", "fwd", "--outdir", "/proc/sweep"], ["--outdir", "virtual"]),
    (["--pass", "fwd"], ["give a mode"]),
    (["verify"], ["--implementation and/or --pass"]),
    (["verify", "--pass", "fwd", "--executor", "slurm"], ["srun"]),
])
def test_bad_sweeps_get_one_line(args, words, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    assert_usage_error(in_process(sweep_cmd, capsys)(*args, "--device", "cpu"), *words,
                       prefix="convbench sweep: error: ")


def test_a_folder_of_another_sweep_is_not_resumed(tmp_path, capsys, layer_csv):
    call = in_process(sweep_cmd, capsys)
    base = ["--paramscsv", layer_csv, "--device", "cpu", "--outdir", tmp_path / "run",
            "--dry-run"]
    assert call("verify", "--implementation", FWD[0], *base).returncode == 0
    sweep.Sweep(tmp_path / "run").create(
        sweep.plan("verify", [FWD[0]], [str(layer_csv)], ["float32"], ["--device", "cpu"]), {})
    assert_usage_error(call("verify", "--implementation", FWD[1], *base[:-1]),
                       "holds another sweep")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("mine")
    assert_usage_error(call("verify", "--implementation", FWD[0], *base[:-3],
                            "--outdir", tmp_path / "other"), "not empty")
    assert_usage_error(call("--merge", tmp_path / "other"), "not a sweep folder")


def test_sweep_help_and_listing_need_no_jobs(capsys):
    with pytest.raises(SystemExit) as stop:
        sweep_cmd.main(["--help"])
    assert stop.value.code == 0 and "--executor" in capsys.readouterr().out
    result = in_process(sweep_cmd, capsys)(
        "verify", "--pass", "bwd_data", "--device", "cpu", "--dry-run")
    assert result.returncode == 0 and "directConvNCDHWBwdData" in result.stdout
    assert "part(s) into" in result.stdout


def test_the_gpu_campaign_as_a_slurm_job(fake_slurm, tmp_path, capsys):
    """--campaign TIER submits the campaign as one job on the GPU partition (its flags
    after --, checked by the campaign's own dry run first); a bad tier is one line."""
    call = in_process(sweep_cmd, capsys)
    result = call("--campaign", "core", "--executor", "slurm", "--partition", "gpu",
                  "--gpus-per-node", "1", "--time", "60", "--outdir", tmp_path / "run",
                  "--no-wait", "--", "--planted", "--time-budget", "3000")
    assert result.returncode == 0, result.stdout + result.stderr
    script = (fake_slurm / "700.sh").read_text()
    assert "#SBATCH --gpus-per-node=1" in script and "--array" not in script
    part, = sweep.Sweep(tmp_path / "run").parts()
    assert part.mode == "campaign" and part.argv == (
        "run", "--tier", "core", "--planted", "--time-budget", "3000")
    assert_usage_error(call("--campaign", "lunch", "--executor", "slurm", "--outdir",
                            tmp_path / "bad"), "--campaign", "lunch")
    assert not (tmp_path / "bad").exists()


@pytest.mark.full
def test_the_campaign_part_runs_and_resumes_in_its_own_layout(tmp_path, capsys):
    """The smoke campaign rehearsed on the CPU as a sweep part: the campaign's folder
    layout under the part's result folder."""
    call = in_process(sweep_cmd, capsys)
    args = ("--campaign", "smoke", "--executor", "debug", "--outdir", tmp_path / "run",
            "--", "--target", "cpu", "--no-planted")
    result = call(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "run" / "parts" / "campaign-smoke" / "result"
    assert (out / "campaign.json").is_file()
    assert "1 finished already, 0 to run" in call(*args).stdout


# -- a re-run and the parts still running --------------------------------------------------

def _stand_ins(tmp_path, monkeypatch, squeue=None, sacct=None):
    """``squeue`` and ``sacct`` stand-ins on PATH (None: absent) that print their text,
    the job's id in it as ``$JOB``; PATH holds nothing else, so the real ones are out."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("squeue", squeue), ("sacct", sacct)):
        path = bin_dir / name
        if path.exists():
            path.unlink()
        if text is not None:
            path.write_text(f"#!/bin/sh\n{text}\n")
            path.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_a_rerun_leaves_the_parts_whose_job_may_still_run_alone(tmp_path, monkeypatch,
                                                                layer_csv):
    """A part left ``running`` runs again only once its job is known to have ended: the
    local process gone, or Slurm saying so (squeue no longer lists it, sacct gives its
    end); while it runs, or where nothing can tell, it is left alone."""
    import platform
    parts = sweep.plan("verify", FWD + BWD_DATA[:2], [str(layer_csv)], ["float32"], [])
    root = sweep.Sweep(tmp_path / "run")
    root.create(parts, {})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = {"host": platform.node(), "scheduler": "local"}
    statuses = [
        dict(here, pid=os.getpid()),                            # this process: running
        dict(here, pid=dead.pid),                               # ended
        {"scheduler": "slurm", "job_id": "7001", "pid": 1, "host": "node9"},  # per squeue
        {"scheduler": "slurm", "job_id": "7002", "pid": 1, "host": "node9"},
        {"pid": 1, "host": "another-host"},                     # nothing can tell
    ]
    for part, status in zip(parts, statuses):
        root.part_dir(part).mkdir(parents=True)
        root.write_status(part, dict(status, state=sweep.RUNNING))
    _stand_ins(tmp_path, monkeypatch,
               squeue='case "$3" in 7001) echo RUNNING;; *) ;; esac',
               sacct='echo "CANCELLED by 0"')
    todo, alone = root.triage()
    assert [p.id for p in todo] == [parts[1].id, parts[3].id]
    assert [p.id for p, _ in alone] == [parts[0].id, parts[2].id, parts[4].id]
    assert "Slurm job 7001 is RUNNING" in dict((p.id, how) for p, how in alone)[parts[2].id]
    # squeue gone, sacct says it ended; then neither: the Slurm job's end is unknown
    _stand_ins(tmp_path, monkeypatch, squeue=None, sacct='echo "TIMEOUT"')
    assert parts[2].id in [p.id for p in root.triage()[0]]
    _stand_ins(tmp_path, monkeypatch, squeue=None, sacct=None)
    todo, alone = root.triage()
    assert parts[2].id in [p.id for p, _ in alone] and parts[3].id in [p.id for p, _ in alone]


def test_a_part_run_again_keeps_its_earlier_files_until_it_ends(tmp_path, monkeypatch,
                                                                layer_csv):
    parts = sweep.plan("verify", FWD[:1], [str(layer_csv)], ["float32"], [])
    root = sweep.Sweep(tmp_path / "run")
    root.create(parts, {})
    folder = root.part_dir(parts[0])
    folder.mkdir(parents=True)
    (folder / "records.json").write_text("earlier")
    seen = {}

    def run(part, out, phase):
        previous = out.with_name(out.name + ".previous")
        seen["kept"] = (previous / "records.json").read_text()
        seen["fresh"] = sorted(p.name for p in out.iterdir())
        return {"counts": {"passed": 1, "failed": 0, "unsupported": 0}}
    monkeypatch.setattr(sweep, "_run_experiment", run)
    status = sweep.run_part(str(root.root), parts[0].to_json())
    assert status["state"] == sweep.COMPLETE and seen["kept"] == "earlier"
    assert seen["fresh"] == ["status.json"]
    assert not folder.with_name(folder.name + ".previous").exists()
