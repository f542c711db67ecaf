"""Sweeps: a verify or profile selection run as jobs through submitit, merged into one run
folder.

A sweep is the cross product implementations x layer sets x precisions (the pass comes
with the implementation).  Each element is a :class:`Part`: the argument list of one
``convbench verify|profile`` run, run by :func:`run_part` through the same
:func:`convbench.commands.profile_conv3d.prepare_experiment` and :class:`~convbench.experiment.pipeline.Experiment`
as that command.  docs/sweep.md is the manual; the folder::

    RUN/sweep.json                        the selection and its parts (written once)
    RUN/parts/<part>/status.json          state, host, times, counts, error, log paths
    RUN/parts/<part>.job.json             the part's last job as submitted: its id
    RUN/parts/<part>/result/              the part's own result files (profile)
    RUN/parts/<part>/records.json         per layer: status, reason, checks
    RUN/logs/                             submitit's job files and logs
    RUN/<layer set>-<pass>-<precision>/   merged: samples.csv, summary.csv, metadata.json,
                                          verify.csv, plots
    RUN/parts.csv                         one line per part: its state and counts

A part is finished when its ``status.json`` says ``complete`` (or ``refused``: it selects
nothing its implementation supports).  Running the same sweep again into the same folder
keeps the finished parts and runs the others again: failed ones, and ones whose job was
killed or timed out (their status still says ``running``) once ``squeue``/``sacct`` (Slurm)
or the process table (local) confirms that the job ended; one whose job still runs, or
whose end cannot be confirmed, is left alone.  So is a part whose job was submitted but
has not started it (queued: ``<part>.job.json`` names a job that ``status.json`` does not),
until that job is known to have ended.  A part run again keeps its earlier files in
``parts/<part>.previous`` until the new run has written its end.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from convbench.results import schema
from convbench.base.errors import UsageError
from convbench.base.files import WriteError, make_folder, write_atomic
from convbench.results.writer import csv_text

SWEEP_FILE = "sweep.json"
PARTS_CSV = "parts.csv"
VERIFY_CSV = "verify.csv"
#: A part's states.  ``running`` on disk after its job ended means the job died;
#: ``submitted``: its job is queued or starting (``<part>.job.json``, not ``status.json``).
RUNNING, COMPLETE, FAILED, REFUSED = "running", "complete", "failed", "refused"
SUBMITTED = "submitted"
FINISHED = (COMPLETE, REFUSED)
MODES = ("verify", "profile")
EXECUTORS = ("local", "slurm", "debug")
#: Sweep file format; a folder with another is not resumed.
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Part:
    """One job: one implementation on one layer set in one precision."""

    id: str
    #: ``verify`` or ``profile`` (``convbench verify|profile``), or ``campaign``.
    mode: str
    implementation: str
    pass_: str
    layer_set: str
    dtype: str
    #: The arguments of ``convbench <mode>`` (or ``gpu-campaign``), ``--outdir`` excepted.
    argv: tuple

    @property
    def group(self) -> str:
        """The merged folder this part's results go into."""
        return _slug(f"{Path(self.layer_set).stem}-{self.pass_}-{self.dtype}")

    def to_json(self) -> Dict[str, Any]:
        return dict(dataclasses.asdict(self), argv=list(self.argv))

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Part":
        return cls(**dict(data, argv=tuple(data["argv"])))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)


# -- the plan --------------------------------------------------------------------------------

def plan(mode: str, implementations: Sequence[str], layer_sets: Sequence[str],
         dtypes: Sequence[str], extra: Sequence[str] = ()) -> List[Part]:
    """The parts of a sweep, each checked as ``convbench <mode>`` checks its flags
    (:func:`convbench.commands.profile_conv3d.check_selection`; a problem is a
    :class:`UsageError` naming the part).  ``extra``: the other flags of ``convbench
    verify|profile``, given to every part.  Paths (layer CSVs, ``--cachedir``) are made
    absolute, since jobs may start
    elsewhere."""
    from convbench import registry
    from convbench.commands import profile_conv3d
    if mode not in MODES:
        raise UsageError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    extra = _absolute_paths(list(extra))
    for flag in ("--outdir", "--enableplots", "--list", "--markdown"):
        if flag in extra:
            raise UsageError(f"{flag}: the sweep sets it for its parts (use the sweep's "
                             "--outdir and --enableplots)")
    parts, seen = [], set()
    for layer_set in layer_sets:
        set_arg = str(Path(layer_set).absolute()) if _is_path(layer_set) else layer_set
        for dtype in dtypes:
            for name in implementations:
                impl = registry.get(name) if name in registry.all_implementations() else None
                pass_ = str(impl.pass_) if impl is not None else "?"
                argv = ("--implementation", name, "--paramscsv", set_arg, "--dtype", dtype,
                        *extra)
                part = Part(_slug(f"{Path(layer_set).stem}-{pass_}-{dtype}-{name}"), mode,
                            name, pass_, set_arg, dtype, argv)
                try:
                    profile_conv3d.check_selection(profile_conv3d.build_parser(f"convbench {mode}", mode)
                                        .parse_args(list(argv)))
                except UsageError as err:
                    raise UsageError(f"{name} on {layer_set} ({dtype}): {err}") from None
                if part.id in seen:
                    raise UsageError(f"{name} on {layer_set} ({dtype}) is selected twice")
                seen.add(part.id)
                parts.append(part)
    return parts


def campaign_part(tier: str, extra: Sequence[str] = ()) -> Part:
    """The GPU campaign (``convbench campaign run --tier TIER``) as one part: it writes the
    campaign's own folder layout into ``RUN/parts/campaign-<tier>/result`` and resumes
    there when the sweep is run again.  The campaign checks its flags (``--dry-run``)
    before anything is submitted."""
    for flag in ("--out", "--resume", "--archive"):
        if flag in extra:
            raise UsageError(f"{flag}: the sweep sets it for the campaign")
    part = Part(f"campaign-{_slug(tier)}", "campaign", "", "", "", "", tuple(
        ["run", "--tier", tier] + _absolute_paths(list(extra))))
    check = _campaign_command(part, ["--dry-run"])
    out = subprocess.run(check, capture_output=True, text=True)
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or [f"status {out.returncode}"]
        raise UsageError(f"--campaign: {lines[-1].split('error: ', 1)[-1]}")
    return part


def _campaign_command(part: Part, extra: Sequence[str]) -> List[str]:
    """The campaign runs in a process of its own, as ``convbench campaign`` (its output is
    the job's log)."""
    return [sys.executable, "-m", "convbench.main", "campaign", *part.argv, *extra]


def _is_path(spec: str) -> bool:
    return "/" in spec or os.sep in spec or Path(spec).is_file()


def _absolute_paths(argv: List[str]) -> List[str]:
    out = list(argv)
    for i, arg in enumerate(out):
        for flag in ("--cachedir", "--space"):
            if arg == flag and i + 1 < len(out):
                out[i + 1] = str(Path(out[i + 1]).absolute())
            elif arg.startswith(flag + "="):
                out[i] = f"{flag}={Path(arg.split('=', 1)[1]).absolute()}"
    return out


# -- the folder ------------------------------------------------------------------------------

class Sweep:
    """A sweep's folder: its parts and their states."""

    def __init__(self, root: os.PathLike):
        self.root = Path(root)

    @property
    def parts_dir(self) -> Path:
        return self.root / "parts"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def part_dir(self, part: Part) -> Path:
        return self.parts_dir / part.id

    def create(self, parts: Sequence[Part], settings: Dict[str, Any]) -> None:
        """Write ``sweep.json``, or check that the folder holds this same sweep (resume)."""
        path = self.root / SWEEP_FILE
        data = {"format": FORMAT, "parts": [p.to_json() for p in parts],
                "settings": settings}
        if path.is_file():
            old = self.load_file()
            if old.get("parts") != data["parts"]:
                raise UsageError(f"{self.root} holds another sweep (its parts differ); give "
                                 "another --outdir, or the same selection to resume it")
            return
        if path.parent.is_dir() and any(path.parent.iterdir()):
            raise UsageError(f"--outdir: {self.root} is not empty and holds no sweep")
        make_folder(self.root)
        write_atomic(path, json.dumps(dict(data, created=_now()), indent=1))

    def load_file(self) -> Dict[str, Any]:
        path = self.root / SWEEP_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UsageError(f"{self.root}: not a sweep folder (no {SWEEP_FILE})") from None
        except (OSError, ValueError) as err:
            raise UsageError(f"{path}: cannot read: {err}") from None
        if data.get("format") != FORMAT:
            raise UsageError(f"{path}: sweep format {data.get('format')}, this version "
                             f"reads {FORMAT}")
        return data

    def parts(self) -> List[Part]:
        return [Part.from_json(p) for p in self.load_file()["parts"]]

    def status(self, part: Part) -> Dict[str, Any]:
        """The part's ``status.json`` (``{"state": "pending"}`` when it never started)."""
        path = self.part_dir(part) / "status.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return {"state": "pending"}
        except (OSError, ValueError) as err:  # a torn or unreadable status: run it again
            return {"state": FAILED, "error": f"unreadable status.json: {err}"}

    def write_status(self, part: Part, status: Dict[str, Any]) -> None:
        write_atomic(self.part_dir(part) / "status.json", json.dumps(status, indent=1,
                                                                     default=str))

    def job_file(self, part: Part) -> Path:
        return self.parts_dir / f"{part.id}.job.json"

    def record_submitted(self, part: Part, scheduler: str, job_id, pid=None) -> None:
        """The part's job as submitted (Slurm's id; locally the job's process), so that a
        re-run asks about that job rather than submit the part again while it is queued.
        The part's own ``status.json`` takes over once the job writes it."""
        record = {"state": SUBMITTED, "scheduler": scheduler, "job_id": str(job_id),
                  "host": platform.node(), "submitted": _now()}
        if pid is not None:
            record["pid"] = pid
        make_folder(self.parts_dir)
        write_atomic(self.job_file(part), json.dumps(record, indent=1))

    def forget_submitted(self, part: Part) -> None:
        """No record of a job (one that runs in this process: ``debug``)."""
        try:
            self.job_file(part).unlink(missing_ok=True)
        except OSError as err:
            raise WriteError(self.job_file(part), err) from None

    def queued(self, part: Part, status=None):
        """The record of the part's last job where that job has not started the part (its
        ``status.json`` names another job, or there is none), else None."""
        try:
            record = json.loads(self.job_file(part).read_text())
        except (OSError, ValueError):
            return None
        status = self.status(part) if status is None else status
        if status.get("state") in FINISHED or str(status.get("job_id")) == record.get("job_id"):
            return None
        return record

    def state(self, part: Part) -> Dict[str, Any]:
        """The part's status, or its job's record while the job has not started it."""
        status = self.status(part)
        return self.queued(part, status) or status

    def pending(self) -> List[Part]:
        """The parts to run: every one not finished, but those whose job may still run."""
        return self.triage()[0]

    def triage(self):
        """``(to run, left alone)``: the parts not finished, and of those left ``running``
        or ``submitted`` the ones whose job is still queued or running or whose end nobody
        can confirm (with why), which a re-run leaves alone rather than run twice."""
        todo, alone, _ = self.review()
        return todo, [(part, how) for part, how, _ in alone]

    def review(self):
        """``(to run, left alone, ended)``: :meth:`triage` with ``(part, how, state)`` for
        each left alone, and the same for the parts to run whose job ended unfinished."""
        todo, alone, ended = [], [], []
        for part in self.parts():
            status = self.status(part)
            if status.get("state") in FINISHED:
                continue
            job = self.queued(part, status) or status
            if job.get("state") in (RUNNING, SUBMITTED):
                alive, how = job_alive(job)
                (ended if alive is False else alone).append((part, how, job["state"]))
                if alive is not False:
                    continue
            todo.append(part)
        return todo, alone, ended

    def record_lost(self, part: Part, why: str, logs: Sequence[str] = ()) -> Dict[str, Any]:
        """A part whose job ended without finishing (killed, timed out, never started):
        marked failed, with the job's state and log; its results stay until it runs again.
        A job that never started the part leaves its record, not an earlier run's status."""
        status = self.status(part)
        queued = self.queued(part, status)
        if queued is not None:
            status = dict(queued)
        elif status.get("state") in FINISHED + (FAILED,):
            return status
        logs = [log for log in logs if os.path.exists(log)]
        status.update(state=FAILED, error=why, logs=logs, recorded=_now(),
                      log_tail=_tail(logs))
        make_folder(self.part_dir(part))
        self.write_status(part, status)
        return status


#: Slurm states of a job that has not ended.
LIVE_SLURM_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                     "REQUEUED", "REQUEUE_HOLD", "RESIZING", "STOPPED", "SIGNALING"}


def job_alive(status: Dict[str, Any]):
    """``(alive, how)`` for the job that wrote a part's ``running`` status: ``alive`` True,
    False (it ended), or None (nothing here can tell: no ``squeue`` or ``sacct`` for a
    Slurm job, a process on another host); ``how`` says what was asked."""
    job = str(status.get("job_id") or "")
    if status.get("scheduler") == "slurm" and job:
        state = _slurm_state(job)
        if state is None:
            return None, f"Slurm job {job}: neither squeue nor sacct answered"
        return state in LIVE_SLURM_STATES, f"Slurm job {job} is {state}"
    pid, host = status.get("pid"), status.get("host")
    if not pid or host != platform.node():
        return None, f"process {pid} on {host}, not this host"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False, f"process {pid} has ended"
    except PermissionError:  # someone else's process: alive
        pass
    return True, f"process {pid} on this host is running"


def _slurm_state(job: str):
    """The state Slurm gives ``job`` (``ENDED`` where squeue lists it no more), or None
    where neither ``squeue`` nor ``sacct`` answers."""
    asks = (["squeue", "-h", "-j", job, "-o", "%T"],
            ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"])
    for cmd in asks:
        if shutil.which(cmd[0]) is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        states = [line.split()[0].rstrip("+") for line in out.stdout.splitlines()
                  if line.strip()]
        if out.returncode == 0 and states:
            return states[0]
        if cmd[0] == "squeue" and out.returncode == 0:
            return "ENDED"  # no longer queued; sacct would say how it ended
    return None


def _tail(logs: Sequence[str], lines: int = 15) -> str:
    out = []
    for log in logs:
        try:
            text = Path(log).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        out.append(f"== {log}\n" + "\n".join(text))
    return "\n".join(out)


def _now() -> str:
    import datetime
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# -- one job ---------------------------------------------------------------------------------

def run_part(root: str, part_json: Dict[str, Any], phase: str = "run") -> Dict[str, Any]:
    """The job: run one part in this process and write its status (what the job returns,
    too).  ``phase`` ``build`` only fills the build cache with the part's builds (the first
    job array of ``--build-first``); ``run`` verifies or profiles.  Failures of the part are
    recorded, not raised, so that a job's end always leaves a status behind; a job that is
    killed leaves ``running``, which the sweep records as failed."""
    sweep, part = Sweep(root), Part.from_json(part_json)
    folder = sweep.part_dir(part)
    previous = folder.with_name(folder.name + ".previous")
    if phase == "run" and folder.exists() and part.mode != "campaign":
        # A re-run starts from nothing (the campaign resumes itself); the earlier run's
        # files are kept aside until this run has written its end.
        if previous.exists():
            shutil.rmtree(previous)
        folder.rename(previous)
    make_folder(folder)
    slurm = os.environ.get("SLURM_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if slurm and task:  # an array element: ARRAY_INDEX, which squeue and sacct take for this
        # element alone (the first element's SLURM_JOB_ID is the array's: every element)
        slurm = f"{os.environ.get('SLURM_ARRAY_JOB_ID', slurm)}_{task}"
    status: Dict[str, Any] = {"state": RUNNING, "phase": phase, "host": platform.node(),
                              "pid": os.getpid(), "started": _now(),
                              "scheduler": "slurm" if slurm else "local",
                              "job_id": slurm or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
                              "command": part.argv}
    if phase == "run":
        sweep.write_status(part, status)
    t0 = time.perf_counter()
    try:
        if part.mode == "campaign":
            status.update(_run_campaign(part, folder / "result"))
        else:
            status.update(_run_experiment(part, folder, phase))
        status["state"] = COMPLETE
    except UsageError as err:
        status.update(state=REFUSED, error=str(err))
    except Exception as err:  # noqa: BLE001 - recorded in the part's status
        status.update(state=FAILED, error=f"{type(err).__name__}: {err}".splitlines()[0],
                      traceback=traceback.format_exc())
    status.update(finished=_now(), seconds=round(time.perf_counter() - t0, 1))
    if phase == "run":
        sweep.write_status(part, status)
        if previous.exists():
            shutil.rmtree(previous, ignore_errors=True)
    print(f"part {part.id}: {status['state']}" + (f" ({status['error']})"
                                                  if status.get("error") else ""), flush=True)
    return status


def _run_experiment(part: Part, folder: Path, phase: str) -> Dict[str, Any]:
    from convbench.commands import profile_conv3d
    argv = list(part.argv)
    if part.mode == "profile":
        argv += ["--outdir", str(folder / "result")]
    args = profile_conv3d.build_parser(f"convbench {part.mode}", part.mode).parse_args(argv)
    if phase == "build":  # nothing runs: the flags of a verify, which writes no files
        args.verify, args.compareprof, args.outdir = True, False, None
    exp = profile_conv3d.prepare_experiment(args, profile_conv3d.Printer(part.layer_set, args.strict))
    if phase == "build":
        built = exp.prebuild()
        return {"builds": {k: sum(1 for v in built if v == k) for k in set(built)}}
    exp.run()
    records = [{"index": r.index, "layer": r.layer.name, "geometry": r.layer.describe(),
                "implementation": r.implementation, "status": r.status, "reason": r.reason,
                "build": r.build_origin, "checks": [
                    {"reference": c.reference, "ok": bool(c.ok), "summary": c.summary()}
                    for c in r.checks]} for r in exp.records]
    write_atomic(folder / "records.json", json.dumps(records, indent=1))
    counts = exp.counts()
    counts["strict_failed"] = bool(args.strict and counts["unsupported"])
    return {"counts": counts}


def _run_campaign(part: Part, out: Path) -> Dict[str, Any]:
    resume = ["--resume"] if (out / "campaign.json").exists() else []
    rc = subprocess.call(_campaign_command(part, ["--out", str(out)] + resume))
    if rc == 3:
        raise RuntimeError("the campaign's time budget left cases or phases; run the sweep "
                           "again to resume it")
    if rc not in (0, 1):  # 1: a case failed its check, which the campaign's table records
        raise RuntimeError(f"the campaign exited with status {rc}")
    return {"campaign_exit": rc}


# -- merging ---------------------------------------------------------------------------------

def merge(root: os.PathLike, plots: bool = False, report=print) -> Dict[str, Any]:
    """Merge the finished parts into one folder per layer set, pass and precision
    (``samples.csv``, ``summary.csv``, ``metadata.json`` as ``profile`` writes them, and
    ``verify.csv``), and write ``parts.csv``.  Unfinished parts are left out and named;
    run the sweep again to run them.  Returns ``{"groups": ..., "states": ...}``."""
    sweep = Sweep(root)
    parts = sweep.parts()
    states = {p.id: sweep.state(p) for p in parts}
    _write_parts_csv(sweep, parts, states)
    groups: Dict[str, List[Part]] = {}
    for part in parts:
        if part.mode != "campaign":
            groups.setdefault(part.group, []).append(part)
    written = {}
    for group, members in groups.items():
        folder = sweep.root / group
        finished = [p for p in members if states[p.id].get("state") == COMPLETE]
        missing = [p.id for p in members if states[p.id].get("state") not in FINISHED]
        verify_rows = _merge_records(sweep, finished)
        if verify_rows:
            make_folder(folder)
            write_atomic(folder / VERIFY_CSV, csv_text(VERIFY_COLUMNS, verify_rows))
        profiled = [p for p in finished if p.mode == "profile"
                    and (sweep.part_dir(p) / "result" / schema.SUMMARY).is_file()]
        if profiled:
            _merge_results(sweep, folder, profiled, missing)
            if plots:
                from convbench import plots as plotting
                report("plots: " + ", ".join(str(p) for p in plotting.plot_run(folder)))
        if verify_rows or profiled:
            written[group] = str(folder)
    return {"groups": written, "states": states}


VERIFY_COLUMNS = ["layer_index", "layer", "geometry", "implementation", "status", "reason",
                  "build", "checks"]


def _merge_records(sweep: Sweep, parts: Iterable[Part]) -> List[Dict[str, Any]]:
    rows = []
    for part in parts:
        path = sweep.part_dir(part) / "records.json"
        if not path.is_file():
            continue
        for r in json.loads(path.read_text()):
            rows.append({"layer_index": r["index"], "layer": r["layer"],
                         "geometry": r["geometry"], "implementation": r["implementation"],
                         "status": r["status"], "reason": r["reason"], "build": r["build"],
                         "checks": "; ".join(f"[{c['reference']}] {c['summary']}"
                                             for c in r["checks"])})
    return rows


def _merge_results(sweep: Sweep, folder: Path, parts: Sequence[Part],
                   missing: Sequence[str]) -> None:
    samples, summary, refs, metas = [], [], [], []
    for part in parts:
        result = sweep.part_dir(part) / "result"
        samples += _read_csv(result / schema.SAMPLES)
        rows = _read_csv(result / schema.SUMMARY)
        summary += rows
        meta = json.loads((result / schema.METADATA).read_text())
        metas.append((part, meta))
        refs += [r for r in meta.get("references", []) if r not in refs]
    first = metas[0][1]
    meta = dict(first)
    meta.update({
        "implementation": [p.implementation for p, _ in metas] if len(metas) > 1
        else metas[0][0].implementation,
        "params": {p.implementation: m.get("params") for p, m in metas},
        "layers_done": [d for _, m in metas for d in m.get("layers_done", [])],
        "status": schema.COMPLETE if not missing and all(
            m.get("status") == schema.COMPLETE for _, m in metas) else "incomplete",
        "command": [Path(sys.argv[0]).name] + sys.argv[1:],
        "merged": _now(),
        "sweep": {"run": str(sweep.root), "missing_parts": list(missing), "parts": [
            {"id": p.id, "host": (m.get("device") or {}).get("host"),
             "timestamp": m.get("timestamp"), "commit": (m.get("git") or {}).get("commit"),
             "status": m.get("status")} for p, m in metas]},
    })
    differ = {}
    for key in ("device", "git", "versions", "threads", "ceilings"):
        values = {json.dumps(m.get(key), sort_keys=True, default=str) for _, m in metas}
        if len(values) > 1:
            differ[key] = [m.get(key) for _, m in metas]
    if differ:  # parts ran on other nodes or commits: the merged file says so
        meta["parts_differ"] = differ
    make_folder(folder)
    columns = schema.SUMMARY_COLUMNS + [schema.ratio_column(r) for r in refs]
    write_atomic(folder / schema.SAMPLES, csv_text(schema.SAMPLE_COLUMNS, samples))
    write_atomic(folder / schema.SUMMARY, csv_text(columns, summary))
    write_atomic(folder / schema.METADATA, json.dumps(meta, indent=1, default=str))


def _write_parts_csv(sweep: Sweep, parts: Sequence[Part], states) -> None:
    rows = []
    for p in parts:
        s = states[p.id]
        counts = s.get("counts") or {}
        rows.append({"part": p.id, "mode": p.mode, "implementation": p.implementation,
                     "pass": p.pass_, "layer_set": p.layer_set, "dtype": p.dtype,
                     "state": s.get("state"), "passed": counts.get("passed", ""),
                     "failed": counts.get("failed", ""),
                     "unsupported": counts.get("unsupported", ""), "host": s.get("host", ""),
                     "seconds": s.get("seconds", ""), "error": s.get("error", ""),
                     "logs": " ".join(s.get("logs", []))})
    write_atomic(sweep.root / PARTS_CSV, csv_text(list(rows[0]) if rows else ["part"], rows))


def _read_csv(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
