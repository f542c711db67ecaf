"""A stand-in Slurm for tests/test_sweep_slurm.py: ``sbatch``, ``sacct``, ``squeue``,
``scancel`` and ``srun`` on PATH (:func:`install`), and the test's side of it
(:class:`Cluster`).

The stand-in cluster (:data:`FAKE_SLURM`) keeps its jobs in files and moves when someone
looks (sacct, squeue): a pending job whose dependencies ended runs then, as on Slurm
(unless the test holds the queue: :meth:`Cluster.pause`): bash runs the script sbatch was
given, with Slurm's variables, and srun runs submitit's job (which unpickles ``run_part``
and pickles its result) into the script's logs.  Only the part's work is planted, so
nothing builds: two layers' results, or a kill (CANCELLED, OUT_OF_MEMORY, TIMEOUT, with
slurmstepd's line in the log), a failure, or a hold in the background until the test
releases it, as ``plan.json`` says for each part."""

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

FWD = ["directConvNCDHW", "implicitGemmNCDHW", "implicitGemm"]
BWD_DATA = "directConvNCDHWBwdData"


def part_id(name):
    """The id of implementation ``name``'s part on the fast layers in float32."""
    return f"fast-{'bwd_data' if name == BWD_DATA else 'fwd'}-float32-{name}"


FAKE_SLURM = r'''
"""Stand-in Slurm (tests/test_sweep_slurm.py): ``fakeslurm.py COMMAND ARGS``."""
import contextlib, json, os, re, shlex, signal, subprocess, sys, time  # noqa: E401
from pathlib import Path

HERE = Path(__file__).resolve()
STATE = Path(os.environ["FAKE_SLURM"])
JOBS = STATE / "jobs"
LIVE = ("PENDING", "RUNNING")
NOW = "2025-01-01T00:00:00"

def _load(key):
    return json.loads((JOBS / (key + ".json")).read_text())

def _log(*words):
    with open(STATE / "calls.log", "a") as f:
        f.write(" ".join(words) + "\n")

def _save(data):
    tmp = JOBS / ".{}.{}".format(data["key"], os.getpid())
    tmp.write_text(json.dumps(data))
    tmp.replace(JOBS / (data["key"] + ".json"))

def _jobs():
    return sorted((json.loads(p.read_text()) for p in JOBS.glob("*.json")),
                  key=lambda d: d["raw"])

def _matches(data, specs):
    """-j SPEC: an array's id (each of its elements, as Slurm lists them), A_i, a raw id."""
    return any(s in (data["key"], str(data["array"]), str(data["raw"])) for s in specs)

def _options(args):
    """``({option: value}, job ids)``: -o, --format, -j, --jobs take a value, others none."""
    values, specs, words = {}, [], iter(args)
    for a in words:
        if a in ("-o", "--format", "-j", "--jobs"):
            values[a.lstrip("-")[0]] = next(words)
        elif a.startswith("-"):
            values[a] = True
        else:
            specs.append(a)
    return values, specs + [s for s in values.get("j", "").split(",") if s]

def _fill(path, env):
    """A log file name pattern of sbatch's or srun's, filled in for the job in ``env``."""
    for key, name in (("%A", "SLURM_ARRAY_JOB_ID"), ("%a", "SLURM_ARRAY_TASK_ID"),
                      ("%j", "SLURM_JOB_ID"), ("%t", "SLURM_PROCID")):
        path = path.replace(key, env.get(name, ""))
    return path

def sbatch(args):
    text = Path(args[-1]).read_text()  # read at submission, as sbatch does
    opts = {k: shlex.split(v)[0] for k, v in re.findall(r"(?m)^#SBATCH --([\w-]+)=(.*)$", text)}
    counter = STATE / "next_id"
    first = int(counter.read_text()) if counter.exists() else 4000
    array = re.match(r"0-(\d+)", opts.get("array", ""))
    count = int(array.group(1)) + 1 if array else 1
    counter.write_text(str(first + count))
    kept = STATE / "scripts" / "{}.sh".format(first)
    kept.write_text(text)
    after = [j for dep in opts.get("dependency", "").split(",") if dep.startswith("after")
             for j in dep.split(":")[1:]]
    for i in range(count):
        _save({"key": "{}_{}".format(first, i) if array else str(first), "array": first,
               "index": i if array else None, "raw": first + i, "state": "PENDING",
               "script": str(kept), "after": after, "output": opts["output"],
               "error": opts["error"]})
    _log("sbatch", str(first), str(count))
    print("Submitted batch job {}".format(first))

def advance():
    """Run the pending jobs whose dependencies ended, one at a time, to their end or hold
    (none while the queue is held: a full cluster, where jobs stay PENDING)."""
    while not (STATE / "paused").exists():
        jobs = _jobs()
        live = {str(d["array"]) for d in jobs if d["state"] in LIVE}
        ready = [d for d in jobs if d["state"] == "PENDING" and not live & set(d["after"])]
        if not ready:
            return
        data = ready[0]
        data["state"] = "RUNNING"
        _save(data)
        proc = subprocess.Popen([sys.executable, str(HERE), "job", data["key"]],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        holding, deadline = JOBS / (data["key"] + ".holding"), time.time() + 60
        while proc.poll() is None and not holding.exists() and time.time() < deadline:
            time.sleep(0.01)

def job(args):
    """One job (or array element) on "node1": its batch script under bash."""
    data = _load(args[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(SLURM_JOB_ID=str(data["raw"]), SLURM_PROCID="0", SLURM_NTASKS="1",
               SLURM_JOB_NODELIST="node1", FAKE_SLURM_KEY=data["key"])
    if data["index"] is not None:
        env.update(SLURM_ARRAY_JOB_ID=str(data["array"]),
                   SLURM_ARRAY_TASK_ID=str(data["index"]))
    data.update(pid=os.getpid(), err=_fill(data["error"], env))  # pid: the process group's
    _save(data)
    with open(_fill(data["output"], env), "a") as out, open(data["err"], "a") as err:
        rc = subprocess.call(["bash", data["script"]], stdin=subprocess.DEVNULL, stdout=out,
                             stderr=err, env=env)
    end = JOBS / (data["key"] + ".end")  # how a planted kill ended it
    data = _load(data["key"])
    data.update(state=end.read_text() if end.exists() else "COMPLETED" if rc == 0
                else "FAILED", exit=rc)
    _save(data)

def srun(args):
    """One task: the command, output to --output and --error; submitit's job: submit()."""
    paths, i = {}, 0
    while args[i].startswith("-"):
        if args[i] in ("--output", "--error"):
            paths[args[i]] = args[i + 1]
            i += 1
        i += 1
    command = args[i:]
    if command[2:4] == ["-m", "submitit.core._submit"]:
        command[2:4] = [str(HERE), "submit"]
    paths = {k: _fill(v, os.environ) for k, v in paths.items()}
    with open(paths["--output"], "a") as out, open(paths["--error"], "a") as err:
        rc = subprocess.call(command, stdout=out, stderr=err)
    sys.exit(128 - rc if rc < 0 else rc)

def sacct(args):
    """-o FIELDS (JobID, State, NodeList), -j, -n, -X; --parsable2 (-P) output always."""
    advance()
    _log("sacct", *args)
    values, specs = _options(args)
    fields = values.get("o", "JobID,State").split(",")
    if not {"-n", "--noheader"} & set(values):
        print("|".join(fields))
    for data in _jobs():
        rows = [(data["key"], data["state"])]
        if data["state"] != "PENDING" and not {"-X", "--allocations"} & set(values):
            rows.append((data["key"] + ".batch", data["state"].split()[0]))  # a step
        for key, state in rows if not specs or _matches(data, specs) else []:
            cells = {"JobID": key, "State": state, "NodeList": "node1"}
            print("|".join(cells.get(f, "") for f in fields))

def squeue(args):
    """The jobs not ended: -j, -o (%i, %T); -h (no header) always."""
    advance()
    _log("squeue", *args)
    values, specs = _options(args)
    fmt = values.get("o", "%i %T")
    for data in _jobs():
        if data["state"] in LIVE and (not specs or _matches(data, specs)):
            print(fmt.replace("%i", data["key"]).replace("%T", data["state"]))

def scancel(args):
    _log("scancel", *args)
    specs = _options(args)[1]
    for data in _jobs():
        if data["state"] not in LIVE or not _matches(data, specs):
            continue
        if data.get("pid"):  # started: its process group, and slurmstepd's line in its log
            with contextlib.suppress(ProcessLookupError):
                os.killpg(data["pid"], signal.SIGKILL)
            with open(data["err"], "a") as err:
                err.write("slurmstepd: error: {} ***\n".format(STOPPED.format(data["raw"])))
        data["state"] = "CANCELLED by {}".format(os.getuid())
        _save(data)

STOPPED = "*** JOB {} ON node1 CANCELLED AT " + NOW
ENDS = {"cancel": ("CANCELLED by 0", STOPPED + " ***"),  # state, slurmstepd's line
        "timeout": ("TIMEOUT", STOPPED + " DUE TO TIME LIMIT ***"),
        "oom": ("OUT_OF_MEMORY", "Detected 1 oom_kill event in StepId={}.0. Some of the "
                "step tasks have been OOM Killed.")}

def _planted_run(part, folder, phase):
    """The part's work as the plan says: two layers' results, a kill, a failure, a hold."""
    from convbench.results import schema
    from convbench.results.writer import csv_text
    plan = STATE / "plan.json"
    what = json.loads(plan.read_text()).get(part.id, "run") if plan.exists() else "run"
    key = os.environ["FAKE_SLURM_KEY"]
    with open(STATE / "ran.log", "a") as f:
        f.write("{} {}\n".format(key, part.id))
    print("part {}: layer 1 of 2 on node1".format(part.id), flush=True)
    if what in ENDS:
        state, line = ENDS[what]
        (JOBS / (key + ".end")).write_text(state)
        sys.stderr.write("slurmstepd: error: " + line.format(os.environ["SLURM_JOB_ID"]) + "\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "fail":
        raise RuntimeError("planted failure in " + part.id)
    if what == "hold":
        (JOBS / (key + ".holding")).touch()
        release, deadline = STATE / ("release-" + part.id), time.time() + 120
        while not release.exists() and time.time() < deadline:
            time.sleep(0.02)
    layers, impl, result = ("L0", "L1"), part.implementation, folder / "result"
    result.mkdir(parents=True, exist_ok=True)
    (result / schema.SUMMARY).write_text(csv_text(schema.SUMMARY_COLUMNS, [
        {"layer_index": i, "layer": name, "implementation": impl, "backend": schema.DACE,
         "samples": 3, "median_ms": 1.0 + i} for i, name in enumerate(layers)]))
    (result / schema.SAMPLES).write_text(csv_text(schema.SAMPLE_COLUMNS, [
        {"layer_index": i, "layer": name, "implementation": impl, "backend": schema.DACE,
         "iteration": k, "time_ms": 1.0 + i} for i, name in enumerate(layers) for k in range(3)]))
    (result / schema.METADATA).write_text(json.dumps({
        "status": schema.COMPLETE, "implementation": impl, "params": {}, "references": [],
        "layers_done": [{"layer": name, "verified": True} for name in layers],
        "device": {"host": "node1"}, "git": {"commit": "c0ffee"}, "timestamp": NOW}))
    check = {"reference": "torch", "ok": True, "summary": "max rel err 1e-07"}
    (folder / "records.json").write_text(json.dumps([{"index": i, "layer": name, "geometry": "",
        "implementation": impl, "status": "passed", "reason": "", "build": "loaded",
        "checks": [check]} for i, name in enumerate(layers)]))
    print("part {}: layer 2 of 2 on node1".format(part.id), flush=True)
    return {"counts": {"passed": 2, "failed": 0, "unsupported": 0}}

def submit(args):
    """submitit's job module (-m submitit.core._submit FOLDER), the part's work planted."""
    import convbench.sweep.parts
    convbench.sweep.parts._run_experiment = _planted_run
    from submitit.core.submission import submitit_main
    sys.argv = ["submitit", *args]
    submitit_main()

if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
'''


class Cluster:
    """The test's side of the stand-in cluster."""

    def __init__(self, state):
        self.state = state

    def plan(self, **what):
        """What each part's job does: run (the default), hold, fail, cancel, oom, timeout;
        keys are the implementations' names."""
        (self.state / "plan.json").write_text(json.dumps({part_id(k): v for k, v in what.items()}))

    def jobs(self):
        return {d["key"]: d for d in (json.loads(p.read_text())
                                      for p in (self.state / "jobs").glob("*.json"))}

    def _lines(self, name):
        log = self.state / name
        return [line.split() for line in log.read_text().splitlines()] if log.exists() else []

    def calls(self, command):
        return [words[1:] for words in self._lines("calls.log") if words[0] == command]

    def arrays(self):
        """The ids and sizes of what sbatch was given, in order."""
        return [(int(first), int(count)) for first, count in self.calls("sbatch")]

    def ran(self):
        """(job, part) for each job that started a part's work."""
        return [tuple(words) for words in self._lines("ran.log")]

    def look(self):
        """A look at the queue (as a user's): the cluster moves."""
        subprocess.run(["squeue"], check=True, capture_output=True)

    def pause(self, held=True):
        """Hold the queue (jobs stay PENDING however often someone looks), or let it go."""
        paused = self.state / "paused"
        if held:
            paused.touch()
        else:
            paused.unlink()

    def release(self, name):
        (self.state / f"release-{part_id(name)}").touch()

    def wait_end(self, key, deadline=60.0):
        t0 = time.time()
        while self.jobs()[key]["state"] in ("PENDING", "RUNNING") and time.time() - t0 < deadline:
            time.sleep(0.05)
        return self.jobs()[key]["state"]

    def stop(self):
        """Kill the held jobs a failed test left running (the process groups started here)."""
        for data in self.jobs().values():
            if data["state"] == "RUNNING" and data.get("pid"):
                with contextlib.suppress(OSError):
                    os.killpg(data["pid"], signal.SIGKILL)


def install(tmp_path, monkeypatch):
    """The stand-in's commands on PATH, its state under ``tmp_path``; the :class:`Cluster`."""
    state, program, bin_dir = tmp_path / "slurm", tmp_path / "fakeslurm.py", tmp_path / "bin"
    for folder in (state / "jobs", state / "scripts", bin_dir):
        folder.mkdir(parents=True)
    program.write_text(FAKE_SLURM)
    for name in ("sbatch", "sacct", "squeue", "scancel", "srun"):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                        f"{shlex.quote(str(program))} {name} \"$@\"\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    for name in [k for k in os.environ if k.startswith("SLURM")]:  # a CI job's own
        monkeypatch.delenv(name)
    return Cluster(state)
