"""convbench sweep on Slurm, through the stand-in ``sbatch``, ``sacct``, ``squeue``,
``scancel`` and ``srun`` of tests/slurm_standin.py: waiting (submitit polls sacct), a killed
or timed-out job recorded with its log, resuming, Ctrl-C, and a re-run while jobs still run
or wait in the queue."""

import csv
import json
import os
import subprocess
import time
import types

import pytest
from submitit.core import core as submitit_core
from submitit.slurm import slurm as submitit_slurm

from cases import FAST_LAYERS
from conftest import in_process
from convbench.sweep import parts as sweep, jobs
from convbench.sweep import command
from convbench.layersets.layer import format_csv
from slurm_standin import BWD_DATA, FWD, install
from slurm_standin import part_id as _part


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    cluster = install(tmp_path, monkeypatch)
    # submitit's one sacct watcher for all jobs: a fresh one (the job ids start again).  A
    # job without a result was killed, not slowed by NFS: no 15 s wait for its result file.
    monkeypatch.setattr(submitit_slurm.SlurmJob, "watcher",
                        submitit_slurm.SlurmInfoWatcher(delay_s=600))
    monkeypatch.setattr(submitit_core.Job, "_results_timeout_s", 0)
    _poll(monkeypatch, lambda seconds: time.sleep(min(seconds, 0.05)))
    yield cluster
    cluster.stop()


def _poll(monkeypatch, sleep):
    """What :func:`convbench.sweep.jobs.wait` does between its looks at the jobs."""
    monkeypatch.setattr(jobs, "time", types.SimpleNamespace(time=time.time, sleep=sleep))


def _interrupt(seconds):
    raise KeyboardInterrupt  # Ctrl-C while the sweep waits


@pytest.fixture(scope="module")
def layer_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep_slurm_layers") / "fast.csv"
    path.write_text(format_csv([layer for _, layer in FAST_LAYERS]))
    return path


def _sweep(capsys, layer_csv, run, names, *extra):
    return in_process(command, capsys)(
        "profile", "--verify", "--implementation", ",".join(names), "--paramscsv", layer_csv,
        "--device", "cpu", "--outdir", run, "--executor", "slurm", "--time", "5", *extra)


def _status(run, name):
    return json.loads((run / "parts" / _part(name) / "status.json").read_text())


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _merged(run):
    """The merged fwd folder: the implementations of its summary's rows, its metadata."""
    folder = run / "fast-fwd-float32"
    return ([r["implementation"] for r in _read(folder / "summary.csv")],
            json.loads((folder / "metadata.json").read_text()))


def _script(slurm, job):
    return (slurm.state / "scripts" / f"{job}.sh").read_text()


def _logs(run, job):
    return [str(run / "logs" / f"{job}_0_log.{ext}") for ext in ("out", "err")]


def _files(folder):
    """Every file under ``folder``: its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_array_is_waited_for_and_merged(slurm, layer_csv, tmp_path, capsys):
    """Three parts as one job array: the sweep waits through sacct, settles each part as
    its element ends, and merges the three into one folder, as one profile run would."""
    run = tmp_path / "run"
    result = _sweep(capsys, layer_csv, run, FWD)
    assert result.returncode == 0, result.stdout + result.stderr
    (array, size), = slurm.arrays()
    assert size == 3 and "#SBATCH --array=0-2%1" in _script(slurm, array)
    assert slurm.calls("sacct") and not slurm.calls("scancel")
    assert slurm.ran() == [(f"{array}_{i}", _part(name)) for i, name in enumerate(FWD)]
    for i, name in enumerate(FWD):
        assert f"[{i + 1}/3] {_part(name)}: complete, 2 passed, 0 failed, 0 unsupported" \
            in result.stdout
        status = _status(run, name)
        assert status["state"] == "complete" and status["scheduler"] == "slurm"
        # the element's own id, which squeue and sacct take for it alone (the first
        # element's SLURM_JOB_ID is the array's, which they take for every element)
        assert status["job_id"] == f"{array}_{i}"
        log = open(_logs(run, f"{array}_{i}")[0]).read()
        assert f"part {_part(name)}: complete" in log and "Job completed successfully" in log
    impls, meta = _merged(run)
    assert impls == [name for name in FWD for _ in range(2)] and meta["implementation"] == FWD
    assert meta["status"] == "complete" and meta["sweep"]["missing_parts"] == []
    assert [r["status"] for r in _read(run / "fast-fwd-float32" / "verify.csv")] == ["passed"] * 6
    assert [(r["part"], r["state"]) for r in _read(run / "parts.csv")] == [
        (_part(name), "complete") for name in FWD]
    assert "3 of 3 part(s) complete, 0 refused, 0 to run again" in result.stdout


def test_a_killed_job_is_recorded_with_its_log_and_the_rest_merge(slurm, layer_csv, tmp_path,
                                                                  capsys, monkeypatch):
    """Elements scancelled and killed for memory leave their parts ``running``: the sweep
    records each as failed with the job's state, the last line of its log, its log files
    and their tail, without waiting for a result file (submitit's 15 s) that a killed job
    never writes.  A part that fails by itself gets its log files.  The part that ran is
    merged, and the merged folder names the missing ones."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[1]: "cancel", FWD[2]: "oom", BWD_DATA: "fail"})
    asked, outcome = [], submitit_core.Job._get_outcome_and_result
    monkeypatch.setattr(submitit_core.Job, "_get_outcome_and_result",
                        lambda job: asked.append(job.job_id) or outcome(job))
    result = _sweep(capsys, layer_csv, run, FWD + [BWD_DATA])
    assert result.returncode == 1, result.stdout + result.stderr
    assert asked == []  # nobody waited for a killed job's result file
    (array, size), = slurm.arrays()
    for i, name, state, last in ((1, FWD[1], "CANCELLED by 0",
                                  f"*** JOB {array + 1} ON node1 CANCELLED AT"),
                                 (2, FWD[2], "OUT_OF_MEMORY", "oom_kill event")):
        assert slurm.jobs()[f"{array}_{i}"]["state"] == state
        status, (out, err) = _status(run, name), _logs(run, f"{array}_{i}")
        assert status["state"] == "failed", status
        assert status["error"].startswith(
            f"the job ended before the part finished (job state {state}: slurmstepd: error: ")
        assert last in status["error"] and status["logs"] == [out, err]
        head, rest = status["log_tail"].split(f"== {err}\n")  # the tail of each log
        assert head.startswith(f"== {out}\n")
        assert f"part {_part(name)}: layer 1 of 2 on node1" in head and last in rest
        assert f"failed: {_part(name)}: the job ended before the part finished" in result.stdout
        assert f"    log: {out}" in result.stdout and f"    log: {err}" in result.stdout
    status = _status(run, BWD_DATA)  # failed in the part: its own error, and the logs
    assert status["state"] == "failed"
    assert status["error"] == f"RuntimeError: planted failure in {_part(BWD_DATA)}"
    assert "Traceback" in status["traceback"] and status["logs"] == _logs(run, f"{array}_3")
    impls, meta = _merged(run)
    assert impls == [FWD[0]] * 2 and meta["status"] == "incomplete"
    assert meta["sweep"]["missing_parts"] == [_part(FWD[1]), _part(FWD[2])]
    rows = {r["part"]: r for r in _read(run / "parts.csv")}
    assert [rows[_part(n)]["state"] for n in FWD + [BWD_DATA]] == ["complete"] + ["failed"] * 3
    assert rows[_part(FWD[1])]["logs"] == " ".join(_logs(run, f"{array}_1"))
    assert "1 of 4 part(s) complete, 0 refused, 3 to run again" in result.stdout
    assert not slurm.calls("scancel")


def test_a_timed_out_job_is_recorded_as_such(slurm, layer_csv, tmp_path, capsys):
    """One part is one job, not an array (submitit's own path): Slurm stops it at its time
    limit, and the part is recorded as failed with TIMEOUT and slurmstepd's line."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[0]: "timeout"})
    result = _sweep(capsys, layer_csv, run, FWD[:1])
    assert result.returncode == 1, result.stdout + result.stderr
    (job, size), = slurm.arrays()
    assert size == 1 and "--array" not in _script(slurm, job)
    assert slurm.jobs()[str(job)]["state"] == "TIMEOUT"
    status = _status(run, FWD[0])
    assert status["state"] == "failed" and status["job_id"] == str(job)
    assert status["error"] == (
        f"the job ended before the part finished (job state TIMEOUT: slurmstepd: error: "
        f"*** JOB {job} ON node1 CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME LIMIT ***)")
    assert status["logs"] == _logs(run, job) and "DUE TO TIME LIMIT" in status["log_tail"]
    assert f"[1/1] {_part(FWD[0])}: failed: the job ended before the part finished " \
        "(job state TIMEOUT" in result.stdout
    assert not (run / "fast-fwd-float32").exists()  # nothing finished, nothing merged
    assert "0 of 1 part(s) complete, 0 refused, 1 to run again" in result.stdout


def test_a_rerun_resubmits_only_the_lost_parts(slurm, layer_csv, tmp_path, capsys):
    """The same command again: the finished part is kept as it is (its files untouched),
    the timed-out and the cancelled ones go into a new array of two and finish."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[1]: "timeout", FWD[2]: "cancel"})
    assert _sweep(capsys, layer_csv, run, FWD).returncode == 1
    kept = _files(run / "parts" / _part(FWD[0]))
    slurm.plan()
    result = _sweep(capsys, layer_csv, run, FWD)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 part(s), 1 finished already, 2 to run" in result.stdout
    (first, _), (second, size) = slurm.arrays()
    assert size == 2 and "#SBATCH --array=0-1%1" in _script(slurm, second)
    assert [p for job, p in slurm.ran() if job.startswith(f"{second}_")] == [
        _part(FWD[1]), _part(FWD[2])]
    assert _files(run / "parts" / _part(FWD[0])) == kept
    for i, name in enumerate(FWD[1:]):
        status = _status(run, name)
        assert status["state"] == "complete" and status["job_id"] == f"{second}_{i}"
        assert "error" not in status and "log_tail" not in status  # a fresh run's record
    assert not list((run / "parts").glob("*.previous"))
    impls, meta = _merged(run)
    assert impls == [name for name in FWD for _ in range(2)] and meta["status"] == "complete"


def test_ctrl_c_leaves_the_slurm_jobs_running_and_merge_takes_them_later(
        slurm, layer_csv, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the sweep waits: exit status 130, nothing is scancelled, the running
    element runs on and its part stays ``running`` (not recorded as lost); --merge shows
    it running, and once the job has ended merges it (docs/sweep.md, "Ctrl-C")."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[1]: "hold"})
    _poll(monkeypatch, _interrupt)
    result = _sweep(capsys, layer_csv, run, FWD[:2])
    assert result.returncode == 130, result.stdout + result.stderr
    assert "convbench sweep: interrupted" in result.stderr
    assert f"[1/2] {_part(FWD[0])}: complete" in result.stdout
    assert (f"interrupted: 1 job(s) keep running on the cluster; convbench sweep --merge "
            f"{run} merges them when they end") in result.stdout
    (array, _), = slurm.arrays()
    assert not slurm.calls("scancel") and slurm.jobs()[f"{array}_1"]["state"] == "RUNNING"
    assert _status(run, FWD[1])["state"] == "running"

    merge = in_process(command, capsys)
    result = merge("--merge", run)
    assert result.returncode == 1 and f"running: {_part(FWD[1])}" in result.stdout
    slurm.release(FWD[1])
    assert slurm.wait_end(f"{array}_1") == "COMPLETED"
    result = merge("--merge", run)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 of 2 part(s) complete" in result.stdout
    assert _merged(run)[0] == [name for name in FWD[:2] for _ in range(2)]
    assert len(slurm.ran()) == 2  # nothing ran twice


def test_a_rerun_keeps_the_parts_whose_jobs_still_run(slurm, layer_csv, tmp_path, capsys):
    """--no-wait, and the array runs: the same command again leaves both running parts
    alone (their folders untouched, nothing submitted).  Once one element is scancelled,
    the next re-run runs that part again, while the other element, still running, keeps
    its part; the merge jobs merge everything once the jobs have ended."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[0]: "hold", FWD[1]: "hold"})
    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")
    assert result.returncode == 0, result.stdout + result.stderr
    (array, _), (merge, _) = slurm.arrays()
    slurm.look()
    assert {k: d["state"] for k, d in slurm.jobs().items()} == {
        f"{array}_0": "RUNNING", f"{array}_1": "RUNNING", str(merge): "PENDING"}
    folders = {name: _files(run / "parts" / _part(name)) for name in FWD[:2]}

    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")  # the same command
    assert result.returncode == 1, result.stdout + result.stderr
    for i, name in enumerate(FWD[:2]):
        assert (f"{_part(name)}: left alone, it may still run (Slurm job {array}_{i} is "
                "RUNNING)") in result.stdout
        assert _files(run / "parts" / _part(name)) == folders[name]
    assert "2 part(s), 0 finished already, 0 to run" in result.stdout and len(slurm.arrays()) == 2

    subprocess.run(["scancel", f"{array}_0"], check=True)
    slurm.plan()
    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")  # the same command
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{_part(FWD[1])}: left alone" in result.stdout  # the other: run again
    assert "2 part(s), 0 finished already, 1 to run" in result.stdout
    assert _files(run / "parts" / _part(FWD[1])) == folders[FWD[1]]
    assert [size for _, size in slurm.arrays()] == [2, 1, 1, 1]  # the part, and a merge
    again, merge2 = [job for job, _ in slurm.arrays()[2:]]

    slurm.release(FWD[1])
    assert slurm.wait_end(f"{array}_1") == "COMPLETED"
    slurm.look()  # the new job, then both merge jobs
    assert {k: d["state"] for k, d in slurm.jobs().items()} == {
        f"{array}_0": f"CANCELLED by {os.getuid()}", f"{array}_1": "COMPLETED",
        str(merge): "COMPLETED", str(again): "COMPLETED", str(merge2): "COMPLETED"}
    assert [p for _, p in slurm.ran()] == [_part(FWD[0]), _part(FWD[1]), _part(FWD[0])]
    assert [r["state"] for r in _read(run / "parts.csv")] == ["complete"] * 2  # the merge job's
    result = in_process(command, capsys)("--merge", run)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_rerun_submits_nothing_while_the_jobs_are_queued(slurm, layer_csv, tmp_path,
                                                           capsys):
    """--no-wait on a full cluster (the elements stay PENDING): each part's job is recorded
    as submitted, and the same command again submits nothing and says why.  Once one
    pending element is scancelled, the next re-run submits that part alone, as a plain job;
    when the queue moves, each part runs once and the merge takes both."""
    run = tmp_path / "run"
    slurm.pause()
    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")
    assert result.returncode == 0, result.stdout + result.stderr
    (array, _), (merge, _) = slurm.arrays()
    root = sweep.Sweep(run)
    parts = root.parts()
    assert [root.queued(p)["job_id"] for p in parts] == [f"{array}_0", f"{array}_1"]
    assert [root.status(p)["state"] for p in parts] == ["pending"] * 2  # not started

    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")  # the same command
    assert result.returncode == 1, result.stdout + result.stderr
    for i, name in enumerate(FWD[:2]):
        assert (f"{_part(name)}: left alone, its job is submitted and has not started it "
                f"(Slurm job {array}_{i} is PENDING)") in result.stdout
        assert f"submitted: {_part(name)} (job {array}_{i}, not started)" in result.stdout
    assert "2 part(s), 0 finished already, 0 to run" in result.stdout and len(slurm.arrays()) == 2
    assert [r["state"] for r in _read(run / "parts.csv")] == ["submitted"] * 2

    subprocess.run(["scancel", f"{array}_0"], check=True)
    result = _sweep(capsys, layer_csv, run, FWD[:2], "--no-wait")  # the same command
    assert result.returncode == 0, result.stdout + result.stderr
    assert (f"{_part(FWD[0])}: its job ended before the part started (Slurm job {array}_0 "
            "is ENDED); it runs again") in result.stdout
    assert f"{_part(FWD[1])}: left alone, its job is submitted" in result.stdout
    assert "2 part(s), 0 finished already, 1 to run" in result.stdout
    assert [size for _, size in slurm.arrays()] == [2, 1, 1, 1]  # the part, and a merge
    again = slurm.arrays()[2][0]
    assert f"submitted job {again} (1 part(s))" in result.stdout
    assert "--array" not in _script(slurm, again)
    assert [root.queued(p)["job_id"] for p in parts] == [str(again), f"{array}_1"]

    slurm.pause(False)
    slurm.look()  # the cluster runs everything: the element, the new job, the merges
    assert [p for _, p in slurm.ran()] == [_part(FWD[1]), _part(FWD[0])]  # once each
    assert [root.queued(p) for p in parts] == [None, None]
    assert [_status(run, n)["job_id"] for n in FWD[:2]] == [str(again), f"{array}_1"]
    result = in_process(command, capsys)("--merge", run)
    assert result.returncode == 0 and "2 of 2 part(s) complete" in result.stdout


def test_a_job_cancelled_before_it_started_is_recorded_so(slurm, layer_csv, tmp_path,
                                                         capsys, monkeypatch):
    """A failed part submitted again whose new job is scancelled while it waits in the
    queue: the sweep records that job's end, not the earlier run's failure."""
    run = tmp_path / "run"
    slurm.plan(**{FWD[0]: "fail"})
    assert _sweep(capsys, layer_csv, run, FWD[:1]).returncode == 1
    slurm.plan()
    slurm.pause()
    _poll(monkeypatch, lambda seconds: subprocess.run(["scancel", str(slurm.arrays()[-1][0])]))
    result = _sweep(capsys, layer_csv, run, FWD[:1])
    assert result.returncode == 1, result.stdout + result.stderr
    (_, _), (job, _) = slurm.arrays()
    status = _status(run, FWD[0])
    assert status["job_id"] == str(job) and status["logs"] == [] and "traceback" not in status
    assert status["error"] == (f"the job ended before the part finished (job state "
                               f"CANCELLED by {os.getuid()})")
    assert len(slurm.ran()) == 1


def test_ctrl_c_during_the_builds_says_to_run_the_sweep_again(slurm, layer_csv, tmp_path,
                                                              capsys, monkeypatch):
    """Ctrl-C while --build-first waits for its build jobs: the parts' jobs were never
    submitted, so there is nothing to merge; the sweep says to run it again."""
    run = tmp_path / "run"
    slurm.pause()
    _poll(monkeypatch, _interrupt)
    result = _sweep(capsys, layer_csv, run, FWD[:2], "--build-first")
    assert result.returncode == 130, result.stdout + result.stderr
    assert ("build interrupted: 2 build job(s) keep running on the cluster; no part was "
            "submitted: run the same sweep again to submit them") in result.stdout
    assert "--merge" not in result.stdout and len(slurm.arrays()) == 1
    root = sweep.Sweep(run)
    assert [root.queued(p) for p in root.parts()] == [None, None]


def test_ctrl_c_stops_the_local_jobs(tmp_path, monkeypatch):
    """Locally, Ctrl-C cancels the jobs that run and starts no others (docs/sweep.md); each
    job started is recorded with its process (a re-run asks whether it lives)."""
    started, cancelled = [], []

    def submit(fn, root, part, phase):  # a local job that runs until it is cancelled
        started.append(part["implementation"])
        return types.SimpleNamespace(done=lambda: False, job_id=str(9000 + len(started)),
                                     cancel=lambda check=True:
                                     cancelled.append(part["implementation"]))
    executor = types.SimpleNamespace(submit=submit)
    parts = [sweep.Part(_part(n), "verify", n, "fwd", "fast", "float32", ()) for n in FWD]
    slots = [jobs.LocalSlot(executor, p, "run", str(tmp_path)) for p in parts]
    _poll(monkeypatch, _interrupt)
    with pytest.raises(KeyboardInterrupt):
        jobs.wait(sweep.Sweep(tmp_path), slots, jobs.ExecutorOptions(
            "local", array_parallelism=2), report=lambda line: None)
    assert started == FWD[:2] and cancelled == FWD[:2]
    records = [sweep.Sweep(tmp_path).queued(p) for p in parts]
    assert [(r["scheduler"], r["job_id"], r["pid"]) for r in records[:2]] == [
        ("local", "9001", 9001), ("local", "9002", 9002)] and records[2] is None
