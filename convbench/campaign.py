"""The GPU campaign: from "a GPU for a few minutes" to a committed results folder.

A campaign runs, in order, the phases of :data:`PHASES` into one folder:

* ``identity``  what ran: ``nvidia-smi -q``, driver, CUDA, cuDNN, torch, DaCe, CuPy (or the
  CPU's name on the CPU rehearsal);
* ``ceilings``  FP32 SGEMM (TF32 off), TF32 and FP16 tensor GEMM, device-to-device copy;
* ``builds``    every build the remaining cases need, in parallel (one process per core,
  each in its own build folder of the campaign's cache);
* ``cases``     each case (implementation x layer) verified against torch float64 (and
  cuDNN on a GPU), then timed next to cuDNN (Find, IEEE FP32) and torch (TF32 off), in a
  worker process with a time limit: a crash, a hang or a wrong result is recorded with
  its log and the campaign goes on;
* ``tests``     the ``gpu``-marked tests;
* ``roofline``  Nsight Compute counters of cuDNN and the best DaCe kernel per layer
  (:mod:`convbench.ncu`) on the measured ceilings;
* ``table``     ``README.md``: per layer the best DaCe implementation, its time, cuDNN's,
  the ratio, the % of FP32 peak, next to the original work's V100 ratios.

Every result is written when it is known (a case's JSON when the case ends), so a run
cut off at its time limit loses only what was in flight, and ``--resume`` skips what is
already there.  A phase that cannot run on this device is recorded as "not measured"
with the reason, never filled with a stand-in.

Case workers.  A worker process imports torch and DaCe once (2-4 s) and runs cases sent
to it one at a time, each with its output redirected to the case's log.  A worker that
crashes or overruns a case's time limit is killed and the case recorded as ``crash`` or
``timeout``; after any case that did not verify, the worker is replaced, so that a
corrupted CUDA context cannot reach the next case.  ``--isolate`` gives every case a fresh
process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import UsageError, check_at_least
from .layers import Layer, load_layers
from .files import write_atomic

TIERS = ("smoke", "core", "full")
PHASES = ("identity", "ceilings", "builds", "cases", "tests", "roofline", "table")
TARGETS = ("gpu", "cpu")
PLANTED = ("crash", "hang", "wrong")

#: The layer every implementation runs on in the smoke tier: 256 channels on 4^3 (one
#: output tile), cheap on both targets.
SMOKE_LAYER = ("cosmoflow", "conv7", 1)
#: The core tier's representative layers for every implementation x pass: the 4-channel,
#: padded first layer of MLPerf CosmoFlow (the most pixels), and the smallest spatial size.
REPRESENTATIVE = (("cosmoflow_mlperf", "conv1", 2), ("cosmoflow", "conv7", 16))
#: The batch sizes of the original work (V100): v1 at 16, MLPerf at 8.
ORIGINAL_BATCH = {"cosmoflow": 16, "cosmoflow_mlperf": 8}
#: The forward kernels the core tier runs on every CosmoFlow layer at the original batch;
#: the best of them that verifies is "the best DaCe implementation" of the layer.
BEST_OF = ("implicitGemmNCDHW", "implicitGemmWarpTiled", "implicitGemmsplitK")
#: The implementation the planted cases use.
PLANTED_IMPL = "implicitGemmNCDHW"
#: A planted hang's time limit: long enough to start, short enough for a rehearsal.
PLANTED_HANG_TIMEOUT_S = 8.0

#: The original work's forward ratios, DaCe time over cuDNN time on a V100 (thesis
#: "Optimizing GPU Convnets", DaCe 0.14): the range it reports per set and batch.
V100_RATIOS = {"cosmoflow_mlperf": "2.2x-4.9x (batch 8)", "cosmoflow": "2.5x-48x (batch 16)"}

#: Build seconds per build where no campaign or cache has measured them here: CPU builds
#: 2.7-7 s and GPU builds about 50 s (parse, schedule, nvcc 21-29 s) on this project's
#: 2-core development machine (README, "Measured here").
DEFAULT_BUILD_SECONDS = {"cpu": 5.0, "gpu": 50.0}
#: Assumed rates for the run-time estimate (GFLOP/s): pessimistic for DaCe (the original
#: work was up to 48x slower than cuDNN), the vendor libraries at a fraction of peak.
ESTIMATE_GFLOPS = {"gpu": {"dace": 1000.0, "ref": 15000.0},
                   "cpu": {"dace": 15.0, "ref": 80.0}}
#: Per-case overhead (s): loading the build, the reference, verification, the result file.
CASE_OVERHEAD_S = {"gpu": 1.5, "cpu": 0.5}
WORKER_START_S = 4.0
#: Device set-up per call (machine start, wheel install), from the device tool's notes.
CALL_SETUP_S = 120.0
#: One call's command limit, and the share of it the plan fills.
CALL_LIMIT_S = 600.0
CALL_FILL = 0.9
#: Phases a tier leaves out: smoke is the quick check (at most 3 minutes on the host).
TIER_SKIPS = {"smoke": ("tests", "roofline")}
#: The whole campaign's device-time budget (core must fit it, set-up included).
BUDGET_S = {"smoke": 10 * 60.0, "core": 20 * 60.0, "full": 30 * 60.0}


@dataclasses.dataclass(frozen=True)
class Case:
    """One implementation on one layer (of a named set), and how to run it."""

    impl: str
    layer: Layer
    layer_set: str
    target: str = "gpu"
    group: str = "every-impl"
    #: Time the references (cuDNN, torch) too: once per layer and pass.
    time_refs: bool = True
    #: A planted failure: "crash", "hang" or "wrong" (the rehearsal's checks of the harness).
    planted: str = ""

    @property
    def id(self) -> str:
        text = f"{self.impl}.{self.layer_set}.{self.layer.name}.b{self.layer.batch}"
        return text + (f".planted-{self.planted}" if self.planted else "")

    @property
    def implementation(self):
        from . import registry
        return registry.get(self.impl)

    def params(self) -> Dict[str, int]:
        from . import tuning
        return tuning.tuned_params(self.implementation, self.layer, self.target, {})

    def job(self):
        from .cache import Job
        return Job(self.impl, self.layer, self.target, self.params(), label=self.id)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        data = dict(data)
        data["layer"] = Layer(**data["layer"])
        return cls(**data)


# -- the plan -----------------------------------------------------------------------------------

def _layer(layer_set: str, name: str, batch: int) -> Layer:
    for layer in load_layers(layer_set):
        if layer.name == name:
            return layer.with_batch(batch)
    raise UsageError(f"layer {name} is not in {layer_set}")


def plan_cases(tier: str, target: str, planted: bool) -> List[Case]:
    """The cases of ``tier`` on ``target`` (with the three planted ones if ``planted``)."""
    from . import registry
    if tier not in TIERS:
        raise UsageError(f"--tier: unknown tier '{tier}' (choose from {', '.join(TIERS)})")
    impls = [n for n, i in registry.all_implementations().items() if target in i.targets]
    every = [SMOKE_LAYER] if tier == "smoke" else list(REPRESENTATIVE)
    pairs = [(impl, s, _layer(s, n, b), "every-impl") for s, n, b in every for impl in impls]
    sets = [(s, layer.with_batch(ORIGINAL_BATCH[s])) for s in ORIGINAL_BATCH
            for layer in load_layers(s)]
    if tier == "core":
        pairs += [(impl, s, layer, "best-of") for s, layer in sets for impl in BEST_OF
                  if target in registry.get(impl).targets]
    elif tier == "full":
        pairs += [(impl, s, layer, "every-layer") for s, layer in sets for impl in impls]
    cases, seen, timed = [], set(), set()
    for impl, layer_set, layer, group in pairs:
        key = (impl, layer_set, layer)
        if key in seen:
            continue
        seen.add(key)
        refs_key = (layer_set, layer, registry.get(impl).pass_)
        cases.append(Case(impl, layer, layer_set, target, group, refs_key not in timed))
        timed.add(refs_key)
    if planted:
        s, n, b = SMOKE_LAYER
        cases += [Case(PLANTED_IMPL, _layer(s, n, b), s, target, "planted", False, kind)
                  for kind in PLANTED]
    return cases


def measured_build_seconds(target: str, cachedir: Optional[os.PathLike]) -> Tuple[float, str]:
    """Median seconds per build of ``target`` in the manifests of ``cachedir`` (a build
    cache that has GPU builds in it, say), else :data:`DEFAULT_BUILD_SECONDS`."""
    times = []
    root = Path(cachedir) if cachedir else None
    if root is not None and root.is_dir():
        for manifest in root.glob("*/manifest.json"):
            try:
                data = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue
            if data.get("key", {}).get("target") == target:
                times.append(sum(v for v in data.get("build_seconds", {}).values()
                                 if isinstance(v, (int, float))))
    if len(times) >= 3:
        times.sort()
        return times[len(times) // 2], f"median of {len(times)} builds in {root}"
    return DEFAULT_BUILD_SECONDS[target], "this project's measured build time (README)"


@dataclasses.dataclass
class Estimate:
    phases: Dict[str, float]
    calls: List[List[str]]
    build_seconds: float
    build_source: str
    cores: int
    builds: int

    @property
    def run_s(self) -> float:
        return sum(self.phases.values())

    @property
    def total_s(self) -> float:
        return self.run_s + CALL_SETUP_S * len(self.calls)


def _case_seconds(case: Case, iterations: int, warmup: int, time_limit: float) -> float:
    rates = ESTIMATE_GFLOPS[case.target]
    gflop = case.layer.flops() / 1e9
    backends = [rates["dace"]] + ([rates["ref"]] * (2 if case.target == "gpu" else 1)
                                  if case.time_refs else [])
    timed = sum(min(time_limit, (warmup + iterations) * gflop / r) for r in backends)
    first = gflop / rates["dace"]  # the verification run
    return CASE_OVERHEAD_S[case.target] + first + timed


def estimate(cases: Sequence[Case], target: str, cores: int, iterations: int, warmup: int,
             time_limit: float, cachedir=None, roofline_layers: int = 0,
             skip: Sequence[str] = ()) -> Estimate:
    """Host seconds per phase, and the phases split into calls of at most
    ``CALL_FILL * CALL_LIMIT_S`` (a later call builds again what its cases need)."""
    per_build, source = measured_build_seconds(target, cachedir)
    builds = len({c.job().spec().name for c in cases})  # planted cases share a build
    waves = math.ceil(builds / max(1, cores))
    phases = {"identity": 5.0, "ceilings": 20.0 if target == "gpu" else 8.0,
              "builds": waves * per_build,
              "cases": WORKER_START_S + sum(_case_seconds(c, iterations, warmup, time_limit)
                                            for c in cases)
              + sum(WORKER_START_S for c in cases if c.planted)
              + sum(PLANTED_HANG_TIMEOUT_S for c in cases if c.planted == "hang"),
              # test_gpu.py: 13 implementations x 3 shapes of GPU builds, then the runs.
              "tests": (math.ceil(39 / max(1, cores)) * per_build + 60.0)
              if target == "gpu" else 0.0,
              # ncu: one profiled process, a few replays per kernel, two targets per layer.
              "roofline": (30.0 + 2 * roofline_layers * 5.0) if target == "gpu" else 0.0,
              "table": 2.0}
    for phase in skip:
        phases[phase] = 0.0
    calls, current, used = [], [], 0.0
    limit = CALL_FILL * CALL_LIMIT_S
    for phase in PHASES:
        seconds = phases[phase]
        if phase in skip:
            continue
        if current and used + seconds > limit:
            calls.append(current)
            current, used = [], 0.0
            # A fresh host keeps no builds: the cases' builds (those left) and the best
            # kernels' builds (roofline) are compiled again; the tests build their own.
            if phase == "cases":
                used += phases["builds"]
            elif phase == "roofline":
                used += math.ceil(roofline_layers / max(1, cores)) * per_build
        current.append(phase)
        used += seconds
    calls.append(current)
    return Estimate(phases, calls, per_build, source, cores, builds)


# -- the folder ---------------------------------------------------------------------------------

class Folder:
    """The campaign's result folder and what is done in it."""

    def __init__(self, root: os.PathLike):
        self.root = Path(root)
        for sub in ("cases", "logs", "identity"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    def state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {"phases": {}}

    def mark(self, phase: str, status: str, detail: str = "", seconds: float = 0.0) -> None:
        state = self.state()
        state["phases"][phase] = {"status": status, "detail": detail,
                                  "seconds": round(seconds, 1), "at": _now()}
        self.write_json("state.json", state)

    def done(self, phase: str) -> bool:
        return self.state()["phases"].get(phase, {}).get("status") in ("done", "not measured")

    def case_path(self, case: Case) -> Path:
        return self.root / "cases" / f"{case.id}.json"

    def log_path(self, case: Case) -> Path:
        return self.root / "logs" / f"{case.id}.log"

    def records(self) -> List[dict]:
        out = []
        for path in sorted((self.root / "cases").glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def write_json(self, name: str, data) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")

    def read_json(self, name: str, default=None):
        try:
            return json.loads((self.root / name).read_text())
        except (OSError, ValueError):
            return default

    def archive(self, dest: Optional[os.PathLike]) -> None:
        """The folder as a .tar.gz at ``dest`` (written aside, then renamed)."""
        if not dest:
            return
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.root, arcname=self.root.name)
        os.replace(tmp, dest)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


# -- phases: identity and ceilings ---------------------------------------------------------------

def _command(argv: List[str], timeout: float = 60) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as err:
        return f"not available: {type(err).__name__}: {err}"


def identity(folder: Folder, target: str) -> dict:
    import platform

    import dace
    import numpy
    import torch

    from . import devices, toolchain
    info = {"target": target, "host": platform.node(), "python": platform.python_version(),
            "dace": dace.__version__, "numpy": numpy.__version__, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cpu": devices.describe("cpu"),
            "git": _git_state(), "nvcc": _command(["nvcc", "--version"]).splitlines()[-1:],
            "ncu": _command(["ncu", "--version"]).splitlines()[-1:]}
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except Exception as err:  # noqa: BLE001 - optional
        info["cupy"] = f"not importable: {type(err).__name__}"
    if target == "gpu":
        smi = _command(["nvidia-smi", "-q"])
        (folder.root / "identity" / "nvidia-smi.txt").write_text(smi + "\n")
        info["gpu"] = devices.describe("gpu")
        info["cudnn_torch"] = torch.backends.cudnn.version()
        props = torch.cuda.get_device_properties(0)
        info["sm_count"] = props.multi_processor_count
        info["memory_gib"] = round(props.total_memory / 2 ** 30, 1)
        info["clocks"] = _command(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,"
                                   "clocks.max.mem,power.draw,temperature.gpu,driver_version,compute_mode",
                                   "--format=csv"])
        try:
            import cudnn_bindings
            lib = cudnn_bindings.load()
            info["cudnn_bindings"] = {"version": ".".join(map(str, lib.version_tuple)),
                                      "library": str(lib.path)}
        except Exception as err:  # noqa: BLE001 - recorded, the campaign goes on
            info["cudnn_bindings"] = f"not usable: {type(err).__name__}: {err}"
        info["cuda_arch"] = toolchain.CUDA_ARCH
    info["device"] = info.get("gpu") or info["cpu"]
    folder.write_json("identity/versions.json", info)
    return info


def _git_state() -> dict:
    from .results import git_commit
    from .toolchain import PROJECT_ROOT
    return git_commit(PROJECT_ROOT)


def measure_ceilings(folder: Folder, target: str) -> dict:
    from . import ceilings
    out = ceilings.measure(target)
    if target == "gpu":
        out.update(ceilings.tensor_core_peaks())
    else:
        reason = "not measured: tensor-core GEMM needs a GPU"
        out.update({"tf32_gflops": None, "fp16_gflops": None, "tensor_method": reason})
    folder.write_json("ceilings.json", out)
    if target == "gpu":
        import torch
        torch.cuda.empty_cache()  # the case workers need the memory, not this process
    return out


# -- phase: builds ---------------------------------------------------------------------------

def run_builds(folder: Folder, cases: Sequence[Case], cachedir, workers: int,
               say: Callable[[str], None]) -> Dict[str, str]:
    """Build what ``cases`` need; the failures by case id (their message)."""
    from . import cache
    jobs, owners = {}, {}
    for case in cases:
        job = case.job()
        name = job.spec().name
        jobs.setdefault(name, job)
        owners.setdefault(name, []).append(case.id)
    failed: Dict[str, str] = {}
    rows = folder.read_json("builds.json", {})
    if not jobs:
        return failed
    say(f"[builds] {len(jobs)} build(s) with {workers} process(es)")
    t0, n = time.perf_counter(), 0
    for job, outcome, seconds, message in cache.fill(jobs.values(), cachedir, workers):
        n += 1
        name = job.spec().name
        rows[name] = {"outcome": outcome, "seconds": round(seconds, 2), "message": message,
                      "cases": owners[name]}
        if outcome == "failed":
            for cid in owners[name]:
                failed[cid] = message
            say(f"[builds]   FAILED {job.describe()}: {message}")
        if n % 10 == 0 or n == len(jobs):
            say(f"[builds]   {n}/{len(jobs)} in {time.perf_counter() - t0:.0f}s")
        folder.write_json("builds.json", rows)
    return failed


# -- phase: cases (parent side) ----------------------------------------------------------------

READY, DONE = "@@campaign-ready", "@@campaign-done"


class Worker:
    """A case-worker process, talking through its stdout (one line per event)."""

    def __init__(self, folder: Folder, options: dict):
        cmd = [sys.executable, "-m", "convbench.campaign", "worker", str(folder.root),
               json.dumps(options)]
        self.log = open(folder.root / "logs" / "workers.log", "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, cwd=str(_project_root()),
                                     env=_worker_env(), start_new_session=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.cases = 0

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)  # end of file: the process is gone

    def wait_for(self, marker: str, timeout: float) -> str:
        """``ok`` when a line starting with ``marker`` arrives, ``crash`` at end of file,
        ``timeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return "timeout"
            if line is None:
                return "crash"
            if line.startswith(marker):
                return "ok"

    def send(self, case: Case) -> None:
        self.proc.stdin.write((json.dumps(case.to_json()) + "\n").encode())
        self.proc.stdin.flush()
        self.cases += 1

    def stop(self) -> Optional[int]:
        import signal
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = self.proc.wait()
        self.log.close()
        return code


def _project_root() -> Path:
    from .toolchain import PROJECT_ROOT
    return PROJECT_ROOT


def _worker_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = str(_project_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _run_group(cmd: List[str], timeout: float, stdout, stderr) -> object:
    """``cmd``'s exit status, or "timeout": on timeout its whole process group is killed
    (pytest's build workers, the process ncu profiles), so nothing of it runs on into the
    next phase."""
    import signal
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=str(_project_root()),
                            env=_worker_env(), start_new_session=True)
    try:
        return proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_cases(folder: Folder, cases: Sequence[Case], build_failures: Dict[str, str],
              options: dict, say: Callable[[str], None], deadline: Optional[float],
              after_each: Callable[[], None]) -> int:
    """Run the cases not recorded yet; returns how many were left for lack of time."""
    worker: Optional[Worker] = None
    todo = [c for c in cases if not folder.case_path(c).exists()]
    # The references are timed with the first case of a layer and pass that verifies: a
    # case that is refused, wrong or lost does not take the layer's cuDNN time with it.
    refs_done = {_refs_key(r["case"]) for r in folder.records()
                 if len(r.get("timings", {})) > 1}
    say(f"[cases] {len(todo)} to run ({len(cases) - len(todo)} recorded already)")
    left = 0
    try:
        for i, case in enumerate(todo):
            if deadline is not None and time.monotonic() > deadline:
                left = len(todo) - i
                say(f"[cases] time budget spent: {left} case(s) left for --resume")
                break
            t0 = time.perf_counter()
            if not case.planted:
                case = dataclasses.replace(case, time_refs=_refs_key(case.to_json()) not in refs_done)
            if case.id in build_failures:
                record = {"status": "build-error", "detail": build_failures[case.id]}
            else:
                if worker is None:
                    worker = Worker(folder, options)
                    if worker.wait_for(READY, options["worker_start_timeout"]) != "ok":
                        raise RuntimeError("a case worker did not start; see "
                                           f"{folder.root / 'logs' / 'workers.log'}")
                timeout = (PLANTED_HANG_TIMEOUT_S if case.planted == "hang"
                           else options["case_timeout"])
                if deadline is not None:  # a case started late must not outrun the call
                    timeout = min(timeout, max(30.0, deadline + 60.0 - time.monotonic()))
                worker.send(case)
                outcome = worker.wait_for(DONE, timeout)
                record = None
                if outcome == "ok":
                    record = folder.read_json(f"cases/{case.id}.json")
                if record is None:
                    code = worker.stop()
                    worker = None
                    detail = (f"no result within the {timeout:g} s limit; the worker was "
                              "killed") if outcome == "timeout" else (
                              f"the worker died with exit status {code}" +
                              (f" (signal {-code})" if code is not None and code < 0 else ""))
                    record = {"status": "timeout" if outcome == "timeout" else "crash",
                              "detail": detail, "log_tail": _tail(folder.log_path(case))}
                elif (record["status"] not in ("verified", "refused")
                      or worker.cases >= options["cases_per_worker"]):
                    worker.stop()  # a fresh process (and CUDA context) for the next case
                    worker = None
            if "case" not in record:
                record.update({"id": case.id, "case": case.to_json(),
                               "log": f"logs/{case.id}.log",
                               "seconds": round(time.perf_counter() - t0, 2)})
                folder.write_json(f"cases/{case.id}.json", record)
            if len(record.get("timings", {})) > 1:
                refs_done.add(_refs_key(case.to_json()))
            say(f"[cases] {i + 1}/{len(todo)} {case.id}: {_case_line(record)}")
            after_each()
    finally:
        if worker is not None:
            worker.stop()
    return left


def _refs_key(case: dict) -> tuple:
    """(set, layer, pass) of a case in its JSON form: the references are timed once per key."""
    from . import registry
    return (case["layer_set"], Layer(**case["layer"]), registry.get(case["impl"]).pass_)


def _case_line(record: dict) -> str:
    status = record["status"]
    t = record.get("timings", {})
    if "dace" in t:
        parts = [f"{k} {v['median_ms']:.3f} ms" if "median_ms" in v else f"{k} {v.get('error')}"
                 for k, v in t.items()]
        return f"{status}  " + ", ".join(parts)
    detail = (record.get("detail") or "").splitlines()
    return f"{status}  {detail[0][:160] if detail else ''}"


# -- phase: cases (worker side) ----------------------------------------------------------------

def worker_main(root: str, options_json: str) -> int:
    """The worker: reads cases (JSON lines) on stdin, writes each one's record file and
    ``DONE`` on the protocol channel (the original stdout); the case's own output, native
    code's included, goes to its log."""
    options = json.loads(options_json)
    folder = Folder(root)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints must not reach the protocol channel
    from .devices import set_threads
    set_threads(options.get("threads"))
    import torch  # noqa: F401 - imported before READY, so that its cost is not a case's
    from . import registry
    registry.load_implementations()
    proto.write(READY + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        case = Case.from_json(json.loads(line))
        log = os.open(folder.log_path(case), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log, 1)
        os.dup2(log, 2)
        try:
            record = run_case(case, options)
        except Exception as err:  # noqa: BLE001 - a launch or load error is a result
            import traceback
            traceback.print_exc()
            record = {"status": "error", "detail": f"{type(err).__name__}: {err}".strip()}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, log):
                os.close(fd)
        record.update({"id": case.id, "case": case.to_json(), "log": f"logs/{case.id}.log"})
        folder.write_json(f"cases/{case.id}.json", record)
        proto.write(f"{DONE} {case.id}\n")
    return 0


def run_case(case: Case, options: dict) -> dict:
    """Verify ``case`` against torch float64 (and cuDNN on a GPU), then time it next to
    the references; a record (``status``: verified, wrong or refused)."""
    import torch

    from . import timing, verify
    from .experiment import Experiment, TimingOptions
    from .layouts import PASS_SIGNATURE
    from .references import ReferenceOptions
    t_start = time.perf_counter()
    if case.planted == "crash":
        print("planted crash: reading address 0", flush=True)
        import ctypes
        ctypes.string_at(0)  # SIGSEGV, as a faulting kernel launch or a bad pointer would
    if case.planted == "hang":
        print("planted hang: sleeping past the case's time limit", flush=True)
        while True:
            time.sleep(60)
    impl, layer, device = case.implementation, case.layer, case.target
    params = case.params()
    reason = impl.unsupported_reason(layer, params)
    if reason:
        return {"status": "refused", "detail": reason, "params": params}
    events = options.get("events", "torch")
    exp = Experiment(impl, [layer], device, policy="reuse", cachedir=options["cachedir"],
                     seed=options["seed"], timing=TimingOptions(flush=True, events=events),
                     references=ReferenceOptions(allow_tf32=False, cudnn_algo="find"))
    build = exp.build(impl, layer, params)
    spec = build.spec
    reference = exp.truth(impl.pass_, layer)
    out = verify.run_build(build, reference, device)
    if case.planted == "wrong":
        print("planted wrong result: one output element doubled, plus 1", flush=True)
        out = out.contiguous()
        flat = out.view(-1)
        flat[flat.numel() // 2] = flat[flat.numel() // 2] * 2 + 1
    checks = verify.check_output(out, reference, spec.dtype.unit_roundoff, device)
    del out
    # The verdict is the float64 check's.  The float32 references (torch on the GPU, cuDNN)
    # are recorded beside it: an algorithm they pick (FFT, Winograd) may round worse.
    ok = checks[0].ok
    record = {"status": "verified" if ok else "wrong", "params": params,
              "checks": [dataclasses.asdict(c) for c in checks],
              "detail": "; ".join(f"{c.reference}: {c.summary()}" for c in checks),
              "gflop": layer.flops() / 1e9, "build": {"name": spec.name, "origin": build.origin}}
    for c in checks:
        print(f"check {c.reference}: {c.summary()} -> {'ok' if c.ok else 'WRONG'}", flush=True)
    if not ok:
        return record
    # Timing: DaCe (device arrays through CuPy where it runs), then the references.
    timer = exp.timer
    arrays = verify.program_arrays(impl, layer, reference.inputs, device, spec.dtype.torch, 0.0)
    del reference.ref, reference.absref
    n, w, limit = options["iterations"], options["warmup"], options["time_limit"]
    array_library = "torch"

    def dace_call():
        nonlocal array_library
        if device == "gpu" and events == "cupy":
            import cupy
            try:  # DaCe takes any __cuda_array_interface__ array: CuPy views, no copies
                call = timing.prepared_call(build, {k: cupy.from_dlpack(v)
                                                    for k, v in arrays.items()})
                array_library = f"cupy {cupy.__version__}"
                return call
            except Exception as err:  # noqa: BLE001 - recorded; torch's arrays instead
                print(f"DaCe on CuPy arrays failed ({type(err).__name__}: {err}); "
                      "using torch's", flush=True)
        return timing.prepared_call(build, arrays)
    backends = [("dace", dace_call)]
    if case.time_refs:
        tdev = "cuda" if device == "gpu" else "cpu"
        inputs = {r: t.to(tdev) for r, t in reference.inputs.items()}
        backends += [(r.name, lambda r=r: r.prepare(layer, impl.pass_, impl.layout, device,
                                                     inputs, exp.ref_options))
                     for r in exp.reference_backends]
    timings, infos = {}, {}
    for name, prepare in backends:
        try:
            fn = prepare()
            if getattr(fn, "info", None):
                infos[name] = fn.info
            result = timer.measure(fn, w, n, limit)
        except Exception as err:  # noqa: BLE001 - one backend's failure is its own result
            if name == "dace":
                raise
            timings[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
            print(f"timing {name} failed: {timings[name]['error']}", flush=True)
            continue
        timings[name] = dict(result.stats(), samples_ms=[round(x, 6) for x in result.samples_ms],
                             warmup=result.warmup, limited=result.limited)
        print(f"timed {name}: median {timings[name]['median_ms']:.4f} ms over "
              f"{len(result.samples_ms)} samples", flush=True)
    record.update({"timings": timings, "reference_info": infos, "timer": timer.method,
                   "array_library": array_library,
                   "flush_bytes": timer.flush_bytes, "seconds": round(time.perf_counter() - t_start, 2),
                   "out_role": PASS_SIGNATURE[impl.pass_][1]})
    if device == "gpu":
        torch.cuda.synchronize()
        try:  # cuDNN plans keep their workspaces: free them for the next case
            import cudnn_bindings
            cudnn_bindings.clear_plans()
        except Exception:  # noqa: BLE001
            pass
        torch.cuda.empty_cache()
    return record


# -- phase: tests ---------------------------------------------------------------------------

def run_gpu_tests(folder: Folder, target: str, timeout: float, cores: int) -> dict:
    from . import devices
    if target != "gpu" or devices.gpu_problem() is not None:
        reason = ("not measured: the gpu tests need a GPU" if target != "gpu" else
                  f"not measured: {devices.gpu_problem()}")
        return {"status": "not measured", "detail": reason}
    log = folder.root / "logs" / "pytest-gpu.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           f"--build-jobs={cores}", "--junitxml", str(folder.root / "tests-gpu.xml")]
    t0 = time.perf_counter()
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"status": "not measured", "detail": "not measured: pytest is not installed"}
    with open(log, "w") as f:
        code = _run_group(cmd, timeout, f, subprocess.STDOUT)
    tail = _tail(log, 3)
    summary = tail.splitlines()[-1] if tail else ""
    folder.write_json("tests.json", {"exit": code, "summary": summary, "log": "logs/pytest-gpu.log",
                                     "seconds": round(time.perf_counter() - t0, 1)})
    return {"status": "done" if code == 0 else "failed",
            "detail": f"pytest -m gpu: exit {code}, {summary}"}


# -- phase: table -----------------------------------------------------------------------------

def best_per_layer(records: Iterable[dict]) -> Dict[tuple, dict]:
    """Per (set, layer, batch, pass): the fastest verified DaCe record, and the references'
    medians from whichever record timed them."""
    from . import registry
    rows: Dict[tuple, dict] = {}
    for rec in records:
        case = rec.get("case", {})
        if case.get("planted") or "timings" not in rec:
            continue
        layer = case["layer"]
        key = (case["layer_set"], layer["name"], layer["batch"],
               str(registry.get(case["impl"]).pass_))
        row = rows.setdefault(key, {"best": None, "refs": {}, "gflop": rec.get("gflop")})
        t = rec["timings"]
        for name, stats in t.items():
            if name != "dace":
                row["refs"][name] = stats["median_ms"]
        if row["best"] is None or t["dace"]["median_ms"] < row["best"]["timings"]["dace"]["median_ms"]:
            row["best"] = rec
    return rows


def write_table(folder: Folder, target: str, meta: dict) -> Path:
    records = folder.records()
    ceilings = folder.read_json("ceilings.json", {}) or {}
    state = folder.state()
    peak = ceilings.get("peak_gflops")
    rows = best_per_layer(records)
    device = meta.get("device", "?")
    vendor = "cudnn" if target == "gpu" else "torch"
    lines = [f"# Campaign {folder.root.name}", "",
             f"Tier `{meta.get('tier')}` on {device} (target `{target}`), commit "
             f"{str(meta.get('git', {}).get('commit', '?'))[:10]}"
             f"{' (dirty)' if meta.get('git', {}).get('dirty') else ''}, written {_now()}.", "",
             "## Best DaCe implementation per layer", "",
             f"Medians of CUDA-event (GPU) or wall-clock (CPU) samples, caches flushed before "
             f"each call. Ratio = DaCe / {vendor} (below 1: DaCe is faster). % of peak: "
             f"GFLOP/s over the measured FP32 SGEMM ceiling ({_fmt(peak, '.0f')} GFLOP/s).", "",
             f"| set | layer | batch | pass | best DaCe | DaCe ms | {vendor} ms | "
             f"{'torch ms | ' if target == 'gpu' else ''}ratio | % of FP32 peak | V100 ratio (original) |",
             "|---|---|---:|---|---|---:|---:|" + ("---:|" if target == "gpu" else "") + "---:|---:|---|"]
    for (lset, lname, batch, pass_), row in sorted(rows.items()):
        best, refs = row["best"], row["refs"]
        d = best["timings"]["dace"]["median_ms"]
        v = refs.get(vendor)
        gfs = row["gflop"] / (d * 1e-3) if row["gflop"] else None
        cells = [lset, lname, str(batch), pass_, best["case"]["impl"], f"{d:.3f}", _fmt(v, ".3f")]
        if target == "gpu":
            cells.append(_fmt(refs.get("torch"), ".3f"))
        cells += [_fmt(d / v if v else None, ".2f") + ("x" if v else ""),
                  _fmt(100 * gfs / peak if gfs and peak else None, ".1f"),
                  V100_RATIOS.get(lset, "") if pass_ == "fwd" and batch == ORIGINAL_BATCH.get(lset)
                  else ""]
        lines.append("| " + " | ".join(cells) + " |")
    if not rows:
        lines.append("| (no case was timed) |" + " |" * (9 if target == "gpu" else 8))
    counts: Dict[str, int] = {}
    for rec in records:
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
    lines += ["", "## Cases", "",
              "Totals: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), "",
              "| case | group | status | detail |", "|---|---|---|---|"]
    for rec in records:
        detail = (rec.get("detail") or "").replace("|", "/").splitlines()
        lines.append(f"| {rec['id']} | {rec['case'].get('group')} | {rec['status']} | "
                     f"{detail[0][:140] if detail else ''} |")
    lines += ["", "## Phases", "", "| phase | status | detail | seconds |", "|---|---|---|---:|"]
    for phase in PHASES:
        p = state["phases"].get(phase, {"status": "not run", "detail": "", "seconds": ""})
        lines.append(f"| {phase} | {p['status']} | {str(p['detail']).replace('|', '/')[:200]} | "
                     f"{p['seconds']} |")
    lines += ["", "## Ceilings", ""]
    for key in ("peak_gflops", "bandwidth_gbs", "tf32_gflops", "fp16_gflops",
                "fma_peak_gflops"):
        if key in ceilings:
            lines.append(f"- {key}: {_fmt(ceilings[key], '.0f') if ceilings[key] else 'not measured'}")
    lines += ["", "Files: `campaign.json` (plan, options), `identity/`, `ceilings.json`, "
              "`builds.json`, `cases/<case>.json` (checks, every timing sample), "
              "`logs/<case>.log`, `summary.csv`, `roofline/` (GPU).", ""]
    path = folder.root / "README.md"
    write_atomic(path, "\n".join(lines))
    _write_summary_csv(folder, records)
    return path


def _write_summary_csv(folder: Folder, records: List[dict]) -> None:
    cols = ["id", "impl", "layer_set", "layer", "batch", "group", "planted", "status",
            "dace_ms", "cudnn_ms", "torch_ms", "gflop", "detail"]
    out = [",".join(cols)]
    for rec in records:
        c, t = rec["case"], rec.get("timings", {})
        vals = [rec["id"], c["impl"], c["layer_set"], c["layer"]["name"], c["layer"]["batch"],
                c["group"], c["planted"], rec["status"]] + [
            f"{t[k]['median_ms']:.6f}" if k in t else "" for k in ("dace", "cudnn", "torch")] + [
            rec.get("gflop", ""), '"' + (rec.get("detail") or "").replace('"', "'")[:300] + '"']
        out.append(",".join(str(v) for v in vals))
    write_atomic(folder.root / "summary.csv", "\n".join(out) + "\n")


def _fmt(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def update_index(results_dir: Path) -> Optional[Path]:
    """``results/gpu/README.md``: one line per campaign folder beside it."""
    if not results_dir.is_dir():
        return None
    lines = ["# GPU campaigns", "",
             "One folder per campaign (`scripts/gpu_campaign.py run`), named "
             "`<date>_<device>`; each has its own README.md.", "",
             "| campaign | tier | target | device | cases |", "|---|---|---|---|---|"]
    for sub in sorted(p for p in results_dir.iterdir() if (p / "campaign.json").exists()):
        meta = json.loads((sub / "campaign.json").read_text())
        n = len(list((sub / "cases").glob("*.json")))
        lines.append(f"| [{sub.name}]({sub.name}/README.md) | {meta.get('tier')} | "
                     f"{meta.get('target')} | {meta.get('device')} | {n} |")
    path = results_dir / "README.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


# -- phase: roofline ------------------------------------------------------------------------

def profile_call(target: dict) -> Callable[[], object]:
    """A no-argument call of one roofline target (``backend`` dace or cudnn), for
    :func:`convbench.ncu.profile_main`."""
    from . import references, verify
    from .experiment import Experiment
    case = Case.from_json(target["case"])
    impl, layer = case.implementation, case.layer
    inputs = verify.make_inputs(layer, impl.pass_, seed=0)
    if target["backend"] == "dace":
        exp = Experiment(impl, [layer], "gpu", policy="reuse", cachedir=target["cachedir"])
        return exp.call(exp.build(impl, layer, case.params()), inputs)
    ref = {r.name: r for r in references.REFERENCES}[target["backend"]]
    return ref.prepare(layer, impl.pass_, impl.layout, "gpu",
                       {r: t.cuda() for r, t in inputs.items()},
                       references.ReferenceOptions(allow_tf32=False, cudnn_algo="find"))


def roofline_rows(rows: Dict[tuple, object]) -> Dict[tuple, object]:
    """The rows the roofline profiles: the forward pass of the CosmoFlow layers at the
    original batch where the campaign ran them, else every row (the smoke tier)."""
    main = {k: v for k, v in rows.items()
            if k[2] == ORIGINAL_BATCH.get(k[0]) and k[3] == "fwd"}
    return main or dict(rows)


def run_roofline(folder: Folder, target: str, cachedir, workers: int, timeout: float,
                 say: Callable[[str], None]) -> dict:
    """Nsight Compute counters of cuDNN and the best DaCe kernel per layer, and the plot."""
    from . import devices, ncu
    if target != "gpu":
        return {"status": "not measured", "detail": "not measured: Nsight Compute needs a GPU"}
    if devices.gpu_problem() is not None or shutil.which("ncu") is None:
        why = devices.gpu_problem() or "ncu is not on the PATH"
        return {"status": "not measured", "detail": f"not measured: {why}"}
    rows = roofline_rows(best_per_layer(folder.records()))
    targets, cases = [], []
    for (lset, lname, batch, pass_), row in sorted(rows.items()):
        case = Case.from_json(row["best"]["case"])
        cases.append(case)
        label = f"{lset}.{lname}.b{batch}.{pass_}"
        targets.append({"label": f"{label}.dace", "backend": "dace", "case": case.to_json(),
                        "cachedir": str(cachedir)})
        if "cudnn" in row["refs"]:
            targets.append({"label": f"{label}.cudnn", "backend": "cudnn",
                            "case": case.to_json(), "cachedir": str(cachedir)})
    if not targets:
        return {"status": "not measured", "detail": "not measured: no verified, timed case"}
    failed = run_builds(folder, cases, cachedir, workers, say)
    if failed:
        say(f"[roofline] {len(failed)} build(s) failed; their layers are left out")
        targets = [t for t in targets if Case.from_json(t["case"]).id not in failed]
    rdir = folder.root / "roofline"
    rdir.mkdir(exist_ok=True)
    (rdir / "targets.json").write_text(json.dumps(targets, indent=1))
    cmd = ncu.ncu_command() + [sys.executable, "-m", "convbench.ncu", str(rdir / "targets.json"),
                               str(rdir / "labels.json")]
    say(f"[roofline] ncu on {len(targets)} target(s)")
    with open(rdir / "ncu.csv", "w") as out, open(folder.root / "logs" / "ncu.log", "w") as err:
        code = _run_group(cmd, timeout, out, err)
    text = (rdir / "ncu.csv").read_text(errors="replace") + _tail(folder.root / "logs" / "ncu.log", 50)
    if "ERR_NVGPUCTRPERM" in text:
        return {"status": "not measured",
                "detail": "not measured: ncu may not read the GPU's counters (ERR_NVGPUCTRPERM)"}
    if code == "timeout":
        return {"status": "failed", "detail": f"ncu ran past {timeout:g} s; see logs/ncu.log"}
    if code != 0 or not (rdir / "labels.json").exists():
        return {"status": "failed", "detail": f"ncu exit status {code}; see logs/ncu.log"}
    labels = json.loads((rdir / "labels.json").read_text())
    parts = ncu.segments(ncu.parse_csv((rdir / "ncu.csv").read_text()), labels)
    points = {label: ncu.summarize(kernels) for label, kernels in parts.items()}
    folder.write_json("roofline/roofline.json", points)
    ceilings = folder.read_json("ceilings.json", {}) or {}
    plotted = ncu.plot(points, ceilings, str(rdir / "roofline.png"))
    return {"status": "done", "detail": f"{len(points)} target(s)" +
            (", roofline/roofline.png" if plotted else ", no plot (matplotlib missing)")}


# -- the campaign -----------------------------------------------------------------------------

@dataclasses.dataclass
class Options:
    tier: str = "smoke"
    target: str = "gpu"
    out: Optional[str] = None
    resume: bool = False
    cachedir: Optional[str] = None
    workers: int = 0
    iterations: int = 50
    warmup: int = 5
    time_limit: float = 2.0
    case_timeout: float = 0.0
    planted: Optional[bool] = None
    isolate: bool = False
    events: str = "auto"
    skip: Sequence[str] = ()
    time_budget: Optional[float] = None
    archive: Optional[str] = None
    threads: Optional[int] = None
    seed: int = 0

    def resolved(self) -> "Options":
        o = dataclasses.replace(self)
        o.skip = tuple(dict.fromkeys(tuple(o.skip) + TIER_SKIPS.get(o.tier, ())))
        o.workers = o.workers or (os.cpu_count() or 1)
        o.case_timeout = o.case_timeout or (90.0 if o.target == "gpu" else 120.0)
        o.planted = (o.target == "cpu") if o.planted is None else o.planted
        if o.events == "auto":
            from .timing import cupy_problem
            o.events = "cupy" if o.target == "gpu" and cupy_problem() is None else "torch"
        o.cachedir = o.cachedir or str(_project_root() / ".cache" / f"campaign-{o.target}")
        return o


def default_out(target: str) -> Path:
    from . import devices
    name = devices.describe(target).split(" (")[0] if target == "cpu" else _gpu_name()
    slug = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    base = Path("results/gpu") if target == "gpu" else Path("outputs/campaign")
    return base / f"{time.strftime('%Y-%m-%d')}_{slug}"


def _gpu_name() -> str:
    import torch
    return torch.cuda.get_device_name()


def check_options(o: Options) -> None:
    if o.target not in TARGETS:
        raise UsageError(f"--target: unknown target '{o.target}' (choose from {', '.join(TARGETS)})")
    if o.tier not in TIERS:
        raise UsageError(f"--tier: unknown tier '{o.tier}' (choose from {', '.join(TIERS)})")
    bad = [p for p in o.skip if p not in PHASES]
    if bad:
        raise UsageError(f"--skip: unknown phase(s) {', '.join(bad)} (phases: {', '.join(PHASES)})")
    if o.events not in ("auto", "cupy", "torch"):
        raise UsageError(f"--events: choose from auto, cupy, torch, got '{o.events}'")
    check_at_least(("--iterations", o.iterations, 1), ("--warmup", o.warmup, 0),
                   ("--workers", o.workers, 0))
    for flag, value in (("--time-limit", o.time_limit), ("--time-budget", o.time_budget),
                        ("--case-timeout", o.case_timeout or 1)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag}: must be a positive number of seconds, got {value}")


def format_plan(o: Options, cases: Sequence[Case]) -> str:
    """The dry run's text: cases, builds, estimated host minutes per phase and per call,
    and the device-time budget."""
    cores = o.workers or (16 if o.target == "gpu" else (os.cpu_count() or 1))
    est = estimate(cases, o.target, cores, o.iterations, o.warmup, o.time_limit, o.cachedir,
                   roofline_layers=len(roofline_rows({(c.layer_set, c.layer.name, c.layer.batch,
                                                       str(c.implementation.pass_)): None
                                                      for c in cases if not c.planted})),
                   skip=tuple(o.skip) + TIER_SKIPS.get(o.tier, ()))
    groups: Dict[str, int] = {}
    for c in cases:
        groups[c.group] = groups.get(c.group, 0) + 1
    builds = est.builds
    budget = BUDGET_S[o.tier]
    lines = [f"Campaign plan: tier {o.tier}, target {o.target}, {len(cases)} cases ("
             + ", ".join(f"{n} {g}" for g, n in groups.items()) + f"), {builds} builds.",
             f"Builds: {est.build_seconds:.0f} s each ({est.build_source}), {cores} at a time "
             f"on the host's {cores} cores.", "",
             "| phase | estimated host minutes |", "|---|---:|"]
    lines += [f"| {p} | {est.phases[p] / 60:.1f} |" for p in PHASES]
    lines += [f"| **run** | **{est.run_s / 60:.1f}** |", ""]
    for i, call in enumerate(est.calls, 1):
        lines.append(f"call {i}: {', '.join(call)}")
    total = est.total_s
    lines += [f"device time: {len(est.calls)} call(s) x {CALL_SETUP_S / 60:.1f} min set-up "
              f"(machine start, wheel install) + {est.run_s / 60:.1f} min run = "
              f"{total / 60:.1f} min; budget {budget / 60:.0f} min: "
              + ("fits" if total <= budget else "DOES NOT FIT"), ""]
    lines.append("Cases:")
    lines += [f"  {c.id}  [{c.group}]" for c in cases]
    return "\n".join(lines)


def run_campaign(o: Options, say: Callable[[str], None] = print) -> int:
    """Run (or resume) a campaign; 0 when every phase ran, 3 when the time budget left
    cases or phases for ``--resume``."""
    from . import devices
    check_options(o)
    o = o.resolved()
    if o.target == "gpu" and devices.gpu_problem() is not None:
        raise UsageError(f"--target gpu: {devices.gpu_problem()} (rehearse with --target cpu)")
    cases = plan_cases(o.tier, o.target, o.planted)
    out = Path(o.out) if o.out else default_out(o.target)
    meta_path = out / "campaign.json"
    if meta_path.exists() and not o.resume:
        raise UsageError(f"--out {out}: a campaign is there already; add --resume to go on "
                         "with it, or name another folder")
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if (old.get("tier"), old.get("target")) != (o.tier, o.target):
            raise UsageError(f"--resume: {out} holds a {old.get('tier')} campaign on "
                             f"{old.get('target')}, not {o.tier} on {o.target}")
    folder = Folder(out)
    start = time.monotonic()
    deadline = start + o.time_budget if o.time_budget else None
    opts = {"cachedir": o.cachedir, "iterations": o.iterations, "warmup": o.warmup,
            "time_limit": o.time_limit, "case_timeout": o.case_timeout, "seed": o.seed,
            "events": o.events, "threads": o.threads, "worker_start_timeout": 180.0,
            "cases_per_worker": 1 if o.isolate else 1 << 30}
    say(f"campaign: tier {o.tier}, target {o.target}, {len(cases)} cases -> {out}/")
    info = identity(folder, o.target) if not (o.resume and folder.done("identity")) else \
        folder.read_json("identity/versions.json", {})
    meta = folder.read_json("campaign.json") or {"tier": o.tier, "target": o.target,
                                                  "started": _now(), "runs": []}
    meta.update({"device": info.get("device"), "git": info.get("git"),
                 "cases": [c.id for c in cases], "options": dataclasses.asdict(o)})
    meta["runs"].append({"at": _now(), "command": sys.argv, "git": info.get("git")})
    folder.write_json("campaign.json", meta)
    folder.mark("identity", "done", info.get("device", ""))
    folder.archive(o.archive)

    def phase(name: str, body: Callable[[], dict]) -> None:
        if name in o.skip:
            folder.mark(name, "skipped", f"the {o.tier} tier leaves it out"
                        if name in TIER_SKIPS.get(o.tier, ()) else "--skip")
            return
        if o.resume and folder.done(name):
            say(f"[{name}] recorded already")
            return
        if deadline is not None and time.monotonic() > deadline:
            say(f"[{name}] time budget spent: left for --resume")
            return
        say(f"[{name}] ...")
        t0 = time.perf_counter()
        try:
            result = body() or {}
            status, detail = result.get("status", "done"), result.get("detail", "")
        except Exception as err:  # noqa: BLE001 - a phase's failure is recorded
            status, detail = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
        folder.mark(name, status, detail, time.perf_counter() - t0)
        say(f"[{name}] {status} {detail}".rstrip())
        table()  # the table so far, so that a call cut off still brings one back
        folder.archive(o.archive)

    def table() -> None:
        try:
            write_table(folder, o.target, meta)
        except Exception as err:  # noqa: BLE001 - the results are on disk; say why not
            say(f"[table] failed: {type(err).__name__}: {err}")

    def left(default: float) -> float:
        """A phase's time limit: ``default``, or less where the budget ends sooner."""
        if deadline is None:
            return default
        return min(default, max(60.0, deadline + 60.0 - time.monotonic()))

    def ceilings_phase():
        c = measure_ceilings(folder, o.target)
        return {"detail": f"SGEMM {c['peak_gflops']:.0f} GFLOP/s, copy {c['bandwidth_gbs']:.0f} GB/s"
                + (f", TF32 {c['tf32_gflops']:.0f}, FP16 {c['fp16_gflops']:.0f} GFLOP/s"
                   if c.get("tf32_gflops") else ", tensor cores: not measured")}

    state = {"build_failures": {}, "left": 0}

    def builds_phase():
        todo = [c for c in cases if not folder.case_path(c).exists() and not c.planted]
        planted = [c for c in cases if c.planted and not folder.case_path(c).exists()][:1]
        state["build_failures"] = run_builds(folder, todo + planted, o.cachedir, o.workers, say)
        for c in cases:  # a planted case shares its build with the first
            if c.planted and planted and planted[0].id in state["build_failures"]:
                state["build_failures"][c.id] = state["build_failures"][planted[0].id]
        n = len(state["build_failures"])
        return {"status": "done", "detail": f"{n} case(s) without a build" if n else "all built"}

    def cases_phase():
        state["left"] = run_cases(folder, cases, state["build_failures"], opts, say, deadline,
                                  lambda: folder.archive(o.archive))
        counts: Dict[str, int] = {}
        for rec in folder.records():
            counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return {"status": "partial" if state["left"] else "done",
                "detail": detail + (f"; {state['left']} left" if state["left"] else "")}

    phase("ceilings", ceilings_phase)
    # Builds are redone on every call (a fresh host keeps nothing); cases recorded are skipped.
    if "builds" not in o.skip:
        t0 = time.perf_counter()
        say("[builds] ...")
        try:
            builds_phase()
            folder.mark("builds", "done", f"{len(state['build_failures'])} case(s) without a "
                        "build", time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001 - the workers build on a miss instead
            folder.mark("builds", "failed", f"{type(err).__name__}: {err}".splitlines()[0],
                        time.perf_counter() - t0)
            say(f"[builds] failed ({type(err).__name__}: {err}); cases build on a miss")
    phase("cases", cases_phase)
    phase("tests", lambda: run_gpu_tests(folder, o.target, left(540.0), o.workers))
    phase("roofline", lambda: run_roofline(folder, o.target, o.cachedir, o.workers,
                                           left(420.0), say))
    folder.mark("table", "done", "README.md, summary.csv")
    table()
    if out.parent.name == "gpu":
        update_index(out.parent)
    folder.archive(o.archive)
    incomplete = [p for p in PHASES if p not in o.skip and not folder.done(p)
                  and folder.state()["phases"].get(p, {}).get("status") != "failed"]
    say(f"campaign: {out}/README.md" + (f"; not finished: {', '.join(incomplete)} "
                                         "(run again with --resume)" if incomplete else ""))
    return 3 if incomplete else 0


if __name__ == "__main__":  # the case worker: python -m convbench.campaign worker DIR OPTIONS
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m convbench.campaign worker DIR OPTIONS_JSON")
