"""Submitting a sweep's parts (:mod:`convbench.sweep`) as jobs through submitit, and
waiting for them: the executor's options, the job arrays (Slurm) or processes (local),
and what a job that ended says about its part (a part left ``running`` by a job that
died is recorded as failed, with the job's log).
"""

from __future__ import annotations

import collections
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from convbench.base.errors import UsageError
from convbench.sweep.parts import FAILED, FINISHED, Part, Sweep, run_part

@dataclasses.dataclass
class ExecutorOptions:
    """Where and how the jobs run (``convbench sweep``'s executor flags)."""

    executor: str = "local"
    partition: Optional[str] = None
    gpus_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    #: Minutes a job may run.
    time: int = 240
    #: Jobs at a time (local: this many processes; slurm: the array's ``%N``).
    array_parallelism: int = 1
    #: Extra ``#SBATCH --KEY=VALUE`` lines.
    slurm: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: Commands before the job's Python starts (``module load ...``), slurm only.
    setup: List[str] = dataclasses.field(default_factory=list)


def make_executor(folder: Path, opts: ExecutorOptions, name: str, dependency: str = "",
                  light: bool = False):
    """A submitit executor for ``opts`` whose job files go into ``folder``; ``light``: for
    the merge job (one core, no GPU, half an hour)."""
    try:
        import submitit
    except ImportError:
        raise UsageError("--executor: submitit is not installed (pip install submitit)") \
            from None
    if opts.executor == "slurm" and shutil.which("srun") is None:
        raise UsageError("--executor slurm: no srun on PATH (run the sweep on a Slurm login "
                         "node, or use --executor local)")
    ex = submitit.AutoExecutor(folder=str(folder), cluster=opts.executor)
    params: Dict[str, Any] = {"timeout_min": opts.time, "name": name}
    if opts.executor == "slurm":
        extra = dict(opts.slurm)
        if dependency:
            extra["dependency"] = dependency
        params.update(slurm_array_parallelism=opts.array_parallelism,
                      slurm_additional_parameters=extra)
        if opts.partition:
            params["slurm_partition"] = opts.partition
        if opts.setup:
            params["slurm_setup"] = list(opts.setup)
    if light:
        params.update(timeout_min=30, cpus_per_task=1)
        return ex.update_parameters(**params) or ex
    if opts.gpus_per_node is not None:
        params["gpus_per_node"] = opts.gpus_per_node
    if opts.cpus_per_task is not None:
        params["cpus_per_task"] = opts.cpus_per_task
    ex.update_parameters(**params)
    return ex


class Submitted:
    """A job, the part it runs and the phase (``run``, or ``build``)."""

    def __init__(self, part: Part, job, phase: str = "run"):
        self.part, self.job, self.phase = part, job, phase

    @property
    def logs(self) -> List[str]:
        paths = getattr(self.job, "paths", None)
        if paths is None:
            return []
        return [str(p) for p in (paths.stdout, paths.stderr)]


def submit(sweep: Sweep, parts: Sequence[Part], opts: ExecutorOptions, phase: str = "run",
           dependency: str = "") -> List[Submitted]:
    """Submit ``parts`` as one job array (slurm, debug; one part: a plain job), or start
    the first ``array_parallelism`` of them (local: :func:`wait` starts the others as jobs
    end).  Each part's run job is recorded as submitted (:meth:`Sweep.record_submitted`)."""
    ex = make_executor(sweep.logs_dir, opts, f"convbench-{phase}", dependency)
    args = [str(sweep.root)], [p.to_json() for p in parts], [phase]
    if opts.executor == "local":
        return [LocalSlot(ex, part, phase, str(sweep.root)) for part in parts]
    n = len(parts)
    jobs = ex.map_array(run_part, args[0] * n, args[1], args[2] * n)
    for part, job in zip(parts, jobs):
        if phase == "run" and opts.executor == "slurm":  # ARRAYID_INDEX, or the job's id
            sweep.record_submitted(part, "slurm", job.job_id)
        elif phase == "run":  # debug: runs in this process, nothing to ask about later
            sweep.forget_submitted(part)
    return [Submitted(p, j, phase) for p, j in zip(parts, jobs)]


class LocalSlot(Submitted):
    """A local part that starts when :func:`wait` gives it a slot (submitit's local
    executor starts every job at once, which would time the parts against each other)."""

    def __init__(self, ex, part: Part, phase: str, root: str):
        super().__init__(part, None, phase)
        self._start = lambda: ex.submit(run_part, root, part.to_json(), phase)
        self.root = root

    def start(self) -> None:
        self.job = self._start()
        if self.phase == "run":  # the job's id is its process's (SUBMITIT_LOCAL_JOB_ID)
            Sweep(self.root).record_submitted(self.part, "local", self.job.job_id,
                                              pid=int(self.job.job_id))


def wait(sweep: Sweep, submitted: Sequence[Submitted], opts: ExecutorOptions,
         report=print, poll: Optional[float] = None) -> Dict[str, Dict[str, Any]]:
    """Wait for every job (starting local ones ``array_parallelism`` at a time); a job that
    ends without its part finishing is recorded as failed with its log.  Returns the
    statuses by part id.  ``poll``: seconds between looks (default: 0.2 for local
    processes, whose next part waits on it; 10 on Slurm, where each look asks sacct)."""
    if poll is None:
        poll = 10.0 if opts.executor == "slurm" else 0.2
    waiting = list(submitted)
    running: List[Submitted] = []
    done: Dict[str, Dict[str, Any]] = {}
    try:
        _wait(sweep, waiting, running, done, opts, report, poll)
    except KeyboardInterrupt:
        if opts.executor == "local":  # this machine's jobs stop with the sweep
            for item in running:
                try:
                    item.job.cancel(check=False)
                except Exception:  # noqa: BLE001 - it may have ended already
                    pass
        elif any(item.phase == "build" for item in submitted):  # no run job submitted yet
            report(f"interrupted: {len(running)} build job(s) keep running on the cluster; "
                   f"no part was submitted: run the same sweep again to submit them")
        else:
            report(f"interrupted: {len(running)} job(s) keep running on the cluster; "
                   f"convbench sweep --merge {sweep.root} merges them when they end")
        raise
    return done


def _wait(sweep, waiting, running, done, opts, report, poll) -> None:
    total, t0 = len(waiting) + len(running), time.time()
    while waiting or running:
        while waiting and (not isinstance(waiting[0], LocalSlot)
                           or len(running) < max(1, opts.array_parallelism)):
            item = waiting.pop(0)
            if isinstance(item, LocalSlot):
                item.start()
            running.append(item)
        still = []
        for item in running:
            if opts.executor == "debug":
                _debug_result(item)
            if not item.job.done():
                still.append(item)
                continue
            status = (_settle(sweep, item) if item.phase == "run"
                      else _job_result(item))  # a build job writes no status file
            done[item.part.id] = status
            report(f"[{len(done)}/{total}] {item.part.id}: {_describe(status)} "
                   f"({time.time() - t0:.0f}s)")
        running[:] = still
        if running:
            time.sleep(poll)


def _settle(sweep: Sweep, item: Submitted) -> Dict[str, Any]:
    """The status of a part whose job ended: a part left ``running``, or not started by
    the job (an earlier run's status), is recorded as failed; a failed one gets the job's
    log files."""
    status = sweep.status(item.part)
    if status.get("state") in FINISHED:
        return status
    if status.get("state") != FAILED or sweep.queued(item.part, status) is not None:
        return sweep.record_lost(item.part, _lost_reason(item.job), item.logs)
    if status.get("state") == FAILED and not status.get("logs") and item.logs:
        status["logs"] = item.logs
        sweep.write_status(item.part, status)
    return status


def _job_result(item: Submitted) -> Dict[str, Any]:
    """What :func:`run_part` returned, or why there is nothing (the job died)."""
    if not _no_result(item.job, _state(item.job)):
        try:
            return item.job.result()
        except Exception:  # noqa: BLE001 - the job's state and log say why
            pass
    return {"state": FAILED, "error": _lost_reason(item.job), "logs": item.logs}


def _debug_result(item: Submitted) -> None:
    try:
        item.job.result()  # the debug executor runs the job here, in this process
    except Exception:  # noqa: BLE001 - the part's status says what happened
        pass


#: Slurm's states of a job it ended itself: the job wrote no result and will write none.
KILLED_STATES = {"CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                 "BOOT_FAIL", "DEADLINE"}


def _state(job) -> str:
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - the state is only informative
        return "unknown"


def _no_result(job, state: str) -> bool:
    """Whether the job ended without a result file that will never come: Slurm killed
    it, or a local process ended (its files are this machine's).  Then submitit's wait for
    the file (15 s, for a shared file system's lag) is spared."""
    paths = getattr(job, "paths", None)
    if paths is None or paths.result_pickle.exists():
        return False
    name = (state.split() or [""])[0].rstrip("+")
    return name in KILLED_STATES or type(job).__name__ == "LocalJob"


def _last_line(path) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in collections.deque(f, 40) if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _lost_reason(job) -> str:
    state, why = _state(job), ""
    if _no_result(job, state):  # the log's last line, as submitit's exception ends
        why = _last_line(job.paths.stderr) or _last_line(job.paths.stdout)
        why = f": {why[:300]}" if why else ""
    else:
        try:
            exc = job.exception()
            if exc is not None:
                why = ": " + str(exc).strip().splitlines()[-1][:300]
        except Exception as err:  # noqa: BLE001 - the log says more
            why = f": {type(err).__name__}"
    return f"the job ended before the part finished (job state {state}{why})"


def _describe(status: Dict[str, Any]) -> str:
    state = status.get("state", "?")
    counts = status.get("counts")
    text = state
    if counts:
        text += (f", {counts['passed']} passed, {counts['failed']} failed, "
                 f"{counts['unsupported']} unsupported")
    if status.get("builds"):
        text += ", builds " + ", ".join(f"{n} {k}" for k, n in sorted(status["builds"].items()))
    if status.get("error"):
        text += f": {status['error']}"
    return text
