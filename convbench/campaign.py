"""The GPU campaign: from "a GPU for a few minutes" to a committed results folder.

Its phases, tiers, files and CPU rehearsal are described in README.md ("Running on an
offline GPU node").  Every result is written when it is known, so that a run cut off at
its time limit loses only what was in flight and ``--resume`` skips what is there.  A
case worker that crashes, overruns or does not verify its case is replaced, so that a
corrupted CUDA context cannot reach the next case.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import tables
from .errors import UsageError, check_at_least, check_choice
from .files import write_atomic
from .layers import Layer, load_layers

TIERS = ("smoke", "core", "full")
PHASES = ("identity", "ceilings", "builds", "cases", "tests", "roofline", "table")
TARGETS = ("gpu", "cpu")
PLANTED = ("crash", "hang", "wrong")

#: The smoke tier's layer: 256 channels on 4^3 (one output tile), cheap on both targets.
SMOKE_LAYER = ("cosmoflow", "conv7", 1)
#: The core tier's layers for every implementation x pass: MLPerf CosmoFlow's 4-channel,
#: padded first layer (the most pixels), and the smallest spatial size.
REPRESENTATIVE = (("cosmoflow_mlperf", "conv1", 2), ("cosmoflow", "conv7", 16))
#: The batch sizes of the original work (V100).
ORIGINAL_BATCH = {"cosmoflow": 16, "cosmoflow_mlperf": 8}
# The core tier also runs the implementations that declare ``best-of`` on every CosmoFlow
# layer at the original batch; the best of them that verifies is "the best DaCe
# implementation" of the layer.
PLANTED_IMPL = "implicitGemmNCDHW"
#: A planted hang's time limit: long enough to start, short enough for a rehearsal.
PLANTED_HANG_TIMEOUT_S = 8.0

#: The original work's forward ratios, DaCe time over cuDNN time on a V100 (thesis
#: "Optimizing GPU Convnets", DaCe 0.14): the range it reports per set and batch.
V100_RATIOS = {"cosmoflow_mlperf": "2.2x-4.9x (batch 8)", "cosmoflow": "2.5x-48x (batch 16)"}

#: Seconds per build where no cache has measured them: on this project's 2-core
#: development machine (README, "Measured here").
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
#: Phases a tier leaves out: smoke is the quick check.
TIER_SKIPS = {"smoke": ("tests", "roofline")}
#: The whole campaign's device-time budget (core must fit it, set-up included).
BUDGET_S = {"smoke": 10 * 60.0, "core": 20 * 60.0, "full": 30 * 60.0}


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """One implementation on one layer of a named set: the base of the campaign's cases
    and of the tests' (``tests/cases.py``), each with its own ``id`` and
    ``resolved_params()``."""

    impl: str
    layer: Layer
    layer_set: str
    target: str = "gpu"

    @property
    def implementation(self):
        from . import registry
        return registry.get(self.impl)

    @property
    def pass_(self):
        return self.implementation.pass_

    def job(self):
        from .cache import Job
        return Job(self.impl, self.layer, self.target, self.resolved_params(), label=self.id)


@dataclasses.dataclass(frozen=True)
class Case(LayerCase):
    """A campaign's case: its group in the plan, and how to run it."""

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
    def refs_key(self) -> tuple:
        return self.layer_set, self.layer, self.pass_

    def resolved_params(self) -> Dict[str, int]:
        from . import tuning
        return tuning.tuned_params(self.implementation, self.layer, self.target, {})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        return cls(**dict(data, layer=Layer(**data["layer"])))


# -- the plan -----------------------------------------------------------------------------------

def _layer(layer_set: str, name: str, batch: int) -> Layer:
    for layer in load_layers(layer_set):
        if layer.name == name:
            return layer.with_batch(batch)
    raise UsageError(f"layer {name} is not in {layer_set}")


def plan_cases(tier: str, target: str, planted: bool) -> List[Case]:
    """The cases of ``tier`` on ``target`` (with the three planted ones if ``planted``)."""
    from . import registry
    check_choice("--tier", tier, TIERS, "tier")
    impls = [n for n, i in registry.all_implementations().items() if target in i.targets]
    every = [SMOKE_LAYER] if tier == "smoke" else list(REPRESENTATIVE)
    pairs = [(impl, s, _layer(s, n, b), "every-impl") for s, n, b in every for impl in impls]
    sets = [(s, layer.with_batch(ORIGINAL_BATCH[s])) for s in ORIGINAL_BATCH
            for layer in load_layers(s)]
    if tier == "core":
        pairs += [(impl, s, layer, "best-of") for s, layer in sets for impl in registry.members("best-of")
                  if target in registry.get(impl).targets]
    elif tier == "full":
        pairs += [(impl, s, layer, "every-layer") for s, layer in sets for impl in impls]
    cases, seen, timed = [], set(), set()
    for impl, layer_set, layer, group in pairs:
        if (impl, layer_set, layer) not in seen:
            seen.add((impl, layer_set, layer))
            case = Case(impl, layer, layer_set, target, group)
            cases.append(dataclasses.replace(case, time_refs=case.refs_key not in timed))
            timed.add(case.refs_key)
    if planted:
        s, n, b = SMOKE_LAYER
        cases += [Case(PLANTED_IMPL, _layer(s, n, b), s, target, "planted", False, kind)
                  for kind in PLANTED]
    return cases


def measured_build_seconds(target: str, cachedir: Optional[os.PathLike]) -> Tuple[float, str]:
    """Median seconds per build of ``target`` in the manifests of ``cachedir`` (a build
    cache that has GPU builds in it, say), else :data:`DEFAULT_BUILD_SECONDS`."""
    root = Path(cachedir) if cachedir else None
    manifests = (_load(m, {}) for m in (root.glob("*/manifest.json") if root else ()))
    times = sorted(sum(v for v in m.get("build_seconds", {}).values()
                       if isinstance(v, (int, float)))
                   for m in manifests if m.get("key", {}).get("target") == target)
    if len(times) >= 3:
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
    refs = (2 if case.target == "gpu" else 1) if case.time_refs else 0
    timed = sum(min(time_limit, (warmup + iterations) * gflop / r)
                for r in [rates["dace"]] + [rates["ref"]] * refs)
    verification = gflop / rates["dace"]
    return CASE_OVERHEAD_S[case.target] + verification + timed


def estimate(cases: Sequence[Case], target: str, cores: int, iterations: int, warmup: int,
             time_limit: float, cachedir=None, roofline_layers: int = 0,
             skip: Sequence[str] = ()) -> Estimate:
    """Host seconds per phase, and the phases split into calls of at most
    ``CALL_FILL * CALL_LIMIT_S`` (a later call builds again what its cases need)."""
    per_build, source = measured_build_seconds(target, cachedir)
    builds = len({c.job().spec().name for c in cases})  # planted cases share a build
    gpu = target == "gpu"
    phases = {"identity": 5.0, "ceilings": 20.0 if gpu else 8.0,
              "builds": math.ceil(builds / max(1, cores)) * per_build,
              "cases": WORKER_START_S + sum(_case_seconds(c, iterations, warmup, time_limit)
                                            for c in cases)
              + sum(WORKER_START_S for c in cases if c.planted)
              + sum(PLANTED_HANG_TIMEOUT_S for c in cases if c.planted == "hang"),
              # test_gpu.py: 13 implementations x 3 shapes of GPU builds, then the runs.
              "tests": math.ceil(39 / max(1, cores)) * per_build + 60.0 if gpu else 0.0,
              # ncu: one profiled process, a few replays per kernel, two targets per layer.
              "roofline": 30.0 + 2 * roofline_layers * 5.0 if gpu else 0.0,
              "table": 2.0}
    phases.update(dict.fromkeys(skip, 0.0))
    calls, current, used = [], [], 0.0
    for phase in (p for p in PHASES if p not in skip):
        if current and used + phases[phase] > CALL_FILL * CALL_LIMIT_S:
            calls.append(current)
            current, used = [], 0.0
            # A fresh host keeps no builds: the cases' builds (those left) and the best
            # kernels' builds (roofline) are compiled again; the tests build their own.
            if phase == "cases":
                used += phases["builds"]
            elif phase == "roofline":
                used += math.ceil(roofline_layers / max(1, cores)) * per_build
        current.append(phase)
        used += phases[phase]
    calls.append(current)
    return Estimate(phases, calls, per_build, source, cores, builds)


# -- the folder ---------------------------------------------------------------------------------

class Folder:
    """The campaign's result folder and what is done in it."""

    def __init__(self, root: os.PathLike):
        self.root = Path(root)
        for sub in ("cases", "logs", "identity"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def state(self) -> dict:
        return self.read_json("state.json", {"phases": {}})

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

    def save(self, case: Case, record: dict, **more) -> None:
        record.update(id=case.id, case=case.to_json(), log=f"logs/{case.id}.log", **more)
        self.write_json(f"cases/{case.id}.json", record)

    def records(self) -> List[dict]:
        found = (_load(p) for p in sorted((self.root / "cases").glob("*.json")))
        return [r for r in found if r is not None]

    def write_json(self, name: str, data) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")

    def read_json(self, name: str, default=None):
        return _load(self.root / name, default)

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


def _load(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _not_measured(why: str) -> dict:
    return {"status": "not measured", "detail": f"not measured: {why}"}


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
    from .results import git_commit
    info = {"target": target, "host": platform.node(), "python": platform.python_version(),
            "dace": dace.__version__, "numpy": numpy.__version__, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cpu": devices.describe("cpu"),
            "git": git_commit(toolchain.PROJECT_ROOT),
            "nvcc": _command(["nvcc", "--version"]).splitlines()[-1:],
            "ncu": _command(["ncu", "--version"]).splitlines()[-1:]}
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except Exception as err:  # noqa: BLE001 - optional
        info["cupy"] = f"not importable: {type(err).__name__}"
    if target == "gpu":
        smi = _command(["nvidia-smi", "-q"])
        (folder.root / "identity" / "nvidia-smi.txt").write_text(smi + "\n")
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=devices.describe("gpu"), cudnn_torch=torch.backends.cudnn.version(),
                    sm_count=props.multi_processor_count,
                    memory_gib=round(props.total_memory / 2 ** 30, 1),
                    clocks=_command(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,"
                                     "clocks.mem,clocks.max.mem,power.draw,temperature.gpu,"
                                     "driver_version,compute_mode", "--format=csv"]))
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


def measure_ceilings(folder: Folder, target: str) -> dict:
    from . import ceilings
    out = ceilings.measure(target)
    out.update(ceilings.tensor_core_peaks() if target == "gpu" else
               {"tf32_gflops": None, "fp16_gflops": None,
                "tensor_method": "not measured: tensor-core GEMM needs a GPU"})
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
    jobs, owners, failed = {}, {}, {}
    for case in cases:
        job = case.job()
        name = job.spec().name
        jobs.setdefault(name, job)
        owners.setdefault(name, []).append(case.id)
    if not jobs:
        return failed
    rows = folder.read_json("builds.json", {})
    say(f"[builds] {len(jobs)} build(s) with {workers} process(es)")
    t0 = time.perf_counter()
    for n, (job, outcome, seconds, message) in enumerate(
            cache.fill(jobs.values(), cachedir, workers), 1):
        name = job.spec().name
        rows[name] = {"outcome": outcome, "seconds": round(seconds, 2), "message": message,
                      "cases": owners[name]}
        if outcome == "failed":
            failed.update(dict.fromkeys(owners[name], message))
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
        # Unbuffered pipes: what select() finds ready is all there is to read.
        self.proc = _spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                           bufsize=0)
        self.cases = 0

    def wait_for(self, marker: str, timeout: float) -> str:
        """``ok`` when a line starting with ``marker`` arrives, ``crash`` at end of file,
        ``timeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            line = self.proc.stdout.readline()
            if not line:
                return "crash"
            if line.startswith(marker.encode()):
                return "ok"
        return "timeout"

    def send(self, case: Case) -> None:
        self.proc.stdin.write((json.dumps(case.to_json()) + "\n").encode())
        self.cases += 1

    def stop(self) -> Optional[int]:
        code = self.proc.poll()
        code = _kill(self.proc) if code is None else code
        self.log.close()
        return code


def _project_root() -> Path:
    from .toolchain import PROJECT_ROOT
    return PROJECT_ROOT


def _spawn(cmd: List[str], **kwargs) -> subprocess.Popen:
    """``cmd`` in the project root, importing this checkout, in a process group of its own
    (so that :func:`_kill` ends what it started too: pytest's build workers, the process
    ncu profiles)."""
    root = str(_project_root())
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(cmd, cwd=root, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path), **kwargs)


def _kill(proc: subprocess.Popen) -> int:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait()


def _run_group(cmd: List[str], timeout: float, stdout, stderr) -> object:
    """``cmd``'s exit status, or "timeout" (its process group killed)."""
    proc = _spawn(cmd, stdout=stdout, stderr=stderr)
    try:
        return proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        _kill(proc)
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
    refs_done = {Case.from_json(r["case"]).refs_key for r in folder.records()
                 if len(r.get("timings", {})) > 1}
    say(f"[cases] {len(todo)} to run ({len(cases) - len(todo)} recorded already)")
    try:
        for i, case in enumerate(todo):
            if deadline is not None and time.monotonic() > deadline:
                say(f"[cases] time budget spent: {len(todo) - i} case(s) left for --resume")
                return len(todo) - i
            t0 = time.perf_counter()
            if not case.planted:
                case = dataclasses.replace(case, time_refs=case.refs_key not in refs_done)
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
                record = folder.read_json(f"cases/{case.id}.json") if outcome == "ok" else None
                if record is None:
                    code = worker.stop()
                    worker = None
                    if outcome == "timeout":
                        record = {"status": "timeout", "detail": f"no result within the "
                                  f"{timeout:g} s limit; the worker was killed"}
                    else:
                        signal_ = f" (signal {-code})" if code is not None and code < 0 else ""
                        record = {"status": "crash",
                                  "detail": f"the worker died with exit status {code}{signal_}"}
                    record["log_tail"] = _tail(folder.log_path(case))
                elif (record["status"] not in ("verified", "refused")
                      or worker.cases >= options["cases_per_worker"]):
                    worker.stop()  # a fresh process (and CUDA context) for the next case
                    worker = None
            if "case" not in record:
                folder.save(case, record, seconds=round(time.perf_counter() - t0, 2))
            if len(record.get("timings", {})) > 1:
                refs_done.add(case.refs_key)
            if "dace" in record.get("timings", {}):
                line = ", ".join(f"{k} {v['median_ms']:.3f} ms" if "median_ms" in v else
                                 f"{k} {v.get('error')}" for k, v in record["timings"].items())
            else:
                line = ((record.get("detail") or "").splitlines() or [""])[0][:160]
            say(f"[cases] {i + 1}/{len(todo)} {case.id}: {record['status']}  {line}")
            after_each()
    finally:
        if worker is not None:
            worker.stop()
    return 0


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

    def point_output_to(out: int, err: int) -> None:  # Python's and native code's
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(err, 2)
    for line in sys.stdin:
        if not line.strip():
            continue
        case = Case.from_json(json.loads(line))
        log = os.open(folder.log_path(case), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        saved = os.dup(1), os.dup(2)
        point_output_to(log, log)
        try:
            record = run_case(case, options)
        except Exception as err:  # noqa: BLE001 - a launch or load error is a result
            import traceback
            traceback.print_exc()
            record = {"status": "error", "detail": f"{type(err).__name__}: {err}".strip()}
        finally:
            point_output_to(*saved)
            for fd in (*saved, log):
                os.close(fd)
        folder.save(case, record)
        proto.write(f"{DONE} {case.id}\n")
    return 0


def vendor_layouts(layout, device: str) -> list:
    """The memory formats the vendors are timed in: on the GPU both (cuDNN's fastest
    engines differ between them, and the baseline is the fastest vendor path), on the CPU
    the implementation's own."""
    from .layouts import Layout
    own = Layout(layout)
    return [own] + ([other for other in Layout if other != own] if device == "gpu" else [])


def vendor_name(name: str, layout, own) -> str:
    """A vendor path's name in the result files: ``torch``/``cudnn`` in the DaCe
    implementation's layout, ``torch-ndhwc``/``cudnn-ncdhw`` in the other."""
    return name if str(layout) == str(own) else f"{name}-{str(layout).lower()}"


def fastest_vendor(refs: Dict[str, float]) -> Tuple[Optional[str], Optional[float]]:
    """The fastest vendor path among the timed ones (name to median ms): the baseline."""
    timed = {k: v for k, v in refs.items() if v is not None and not math.isnan(v)}
    if not timed:
        return None, None
    name = min(timed, key=timed.get)
    return name, timed[name]


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
    params = case.resolved_params()
    reason = impl.unsupported_reason(layer, params)
    if reason:
        return {"status": "refused", "detail": reason, "params": params}
    events = options.get("events", "torch")
    exp = Experiment(impl, [layer], device, policy="reuse", cachedir=options["cachedir"],
                     seed=options["seed"], timing=TimingOptions(flush=True, events=events),
                     references=ReferenceOptions(allow_tf32=False, cudnn_algo="find"))
    build = exp.build(impl, layer, params)
    reference = exp.truth(impl.pass_, layer)
    out = verify.run_build(build, reference, device)
    if case.planted == "wrong":
        print("planted wrong result: one output element doubled, plus 1", flush=True)
        out = out.contiguous()
        flat = out.view(-1)
        flat[flat.numel() // 2] = flat[flat.numel() // 2] * 2 + 1
    checks = verify.check_output(out, reference, build.spec.dtype.unit_roundoff, device)
    del out
    # The verdict is the float64 check's.  The float32 references (torch on the GPU, cuDNN)
    # are recorded beside it: an algorithm they pick (FFT, Winograd) may round worse.
    ok = checks[0].ok
    record = {"status": "verified" if ok else "wrong", "params": params,
              "checks": [dataclasses.asdict(c) for c in checks],
              "detail": "; ".join(f"{c.reference}: {c.summary()}" for c in checks),
              "gflop": layer.flops() / 1e9,
              "build": {"name": build.spec.name, "origin": build.origin}}
    for c in checks:
        print(f"check {c.reference}: {c.summary()} -> {'ok' if c.ok else 'WRONG'}", flush=True)
    if not ok:
        return record
    timer = exp.timer
    arrays = verify.program_arrays(impl, layer, reference.inputs, device,
                                   build.spec.dtype.torch, 0.0)
    reference.drop()
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
        for layout in vendor_layouts(impl.layout, device):
            backends += [(vendor_name(r.name, layout, impl.layout),
                          lambda r=r, layout=layout: r.prepare(layer, impl.pass_, layout, device,
                                                               inputs, exp.ref_options))
                         for r in exp.reference_backends]
    timings, infos = {}, {}
    for name, prepare in backends:
        try:
            fn = prepare()
            if getattr(fn, "info", None):
                infos[name] = fn.info
            result = timer.measure(fn, options["warmup"], options["iterations"],
                                   options["time_limit"])
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
                   "array_library": array_library, "flush_bytes": timer.flush_bytes,
                   "seconds": round(time.perf_counter() - t_start, 2),
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
    why = "the gpu tests need a GPU" if target != "gpu" else devices.gpu_problem()
    if why is not None:
        return _not_measured(why)
    try:
        import pytest  # noqa: F401
    except ImportError:
        return _not_measured("pytest is not installed")
    log = folder.root / "logs" / "pytest-gpu.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           f"--build-jobs={cores}", "--junitxml", str(folder.root / "tests-gpu.xml")]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = _run_group(cmd, timeout, f, subprocess.STDOUT)
    summary = (_tail(log, 3).splitlines() or [""])[-1]
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
        key = (case["layer_set"], case["layer"]["name"], case["layer"]["batch"],
               str(registry.get(case["impl"]).pass_))
        row = rows.setdefault(key, {"best": None, "refs": {}, "gflop": rec.get("gflop")})
        t = rec["timings"]
        row["refs"].update((name, stats["median_ms"]) for name, stats in t.items()
                           if name != "dace" and "median_ms" in stats)
        if row["best"] is None or t["dace"]["median_ms"] < row["best"]["timings"]["dace"]["median_ms"]:
            row["best"] = rec
    return rows


def write_table(folder: Folder, target: str, meta: dict) -> Path:
    """``README.md`` and ``summary.csv`` of the campaign folder, from what is recorded."""
    records = folder.records()
    ceilings = folder.read_json("ceilings.json", {}) or {}
    peak = ceilings.get("peak_gflops")
    gpu = target == "gpu"
    git = meta.get("git", {})
    header = (["set", "layer", "batch", "pass", "best DaCe", "DaCe ms"]
              + (["cudnn ms", "torch ms", "fastest vendor", "vendor ms"] if gpu
                 else ["torch ms"]) + ["ratio", "% of FP32 peak"])
    best = []
    for (lset, lname, batch, pass_), row in sorted(best_per_layer(records).items()):
        d = row["best"]["timings"]["dace"]["median_ms"]
        refs = row["refs"] if gpu else {"torch": row["refs"].get("torch")}
        winner, v = fastest_vendor(refs)
        gfs = row["gflop"] / (d * 1e-3) if row["gflop"] else None
        best.append([lset, lname, batch, pass_, row["best"]["case"]["impl"], f"{d:.3f}"]
                    + ([_fmt(row["refs"].get("cudnn"), ".3f"), _fmt(row["refs"].get("torch"), ".3f"),
                        winner or "—", _fmt(v, ".3f")] if gpu else [_fmt(v, ".3f")])
                    + [_fmt(d / v if v else None, ".2f") + ("x" if v else ""),
                       _fmt(100 * gfs / peak if gfs and peak else None, ".1f")])
    best = best or [["(no case was timed)"] + [""] * (len(header) - 1)]
    state, phases = folder.state()["phases"], []
    for p in PHASES:
        s = state.get(p, {"status": "not run", "detail": "", "seconds": ""})
        phases.append((p, s["status"], str(s["detail"]).replace("|", "/")[:200], s["seconds"]))
    cases = [(r["id"], r["case"].get("group"), r["status"],
              ((r.get("detail") or "").replace("|", "/").splitlines() or [""])[0][:140])
             for r in records]
    counts = Counter(r["status"] for r in records)
    lines = [f"# Campaign {folder.root.name}", "",
             f"Tier `{meta.get('tier')}` on {meta.get('device', '?')} (target `{target}`), "
             f"commit {str(git.get('commit', '?'))[:10]}{' (dirty)' if git.get('dirty') else ''}"
             f", written {_now()}.", "",
             "## Best DaCe implementation per layer", "",
             f"Medians of CUDA-event (GPU) or wall-clock (CPU) samples, caches flushed before "
             f"each call. Ratio = DaCe / "
             + ("the fastest vendor path: cuDNN (this project's bindings, Find) or torch, each "
                "in both memory formats (`-ndhwc`/`-ncdhw`: the layout other than the DaCe "
                "kernel's)" if gpu else "torch")
             + f" (below 1: DaCe is faster). % of peak: GFLOP/s over the measured FP32 SGEMM "
             f"ceiling ({_fmt(peak, '.0f')} GFLOP/s).", "",
             tables.markdown(header, best, "llrll" + "r" * (len(header) - 5)), "",
             f"The original work (DaCe 0.14 on a V100) reported forward ratios to cuDNN of "
             + "; ".join(f"{s} {r}" for s, r in V100_RATIOS.items()) + ".", "",
             "## Cases", "",
             "Totals: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), "",
             tables.markdown(["case", "group", "status", "detail"], cases, "llll"), "",
             "## Phases", "",
             tables.markdown(["phase", "status", "detail", "seconds"], phases, "lllr"), "",
             "## Ceilings", ""]
    lines += [f"- {key}: {_fmt(ceilings[key], '.0f') if ceilings[key] else 'not measured'}"
              for key in ("peak_gflops", "bandwidth_gbs", "tf32_gflops", "fp16_gflops",
                          "fma_peak_gflops") if key in ceilings]
    lines += ["", "Files: `campaign.json` (plan, options), `identity/`, `ceilings.json`, "
              "`builds.json`, `cases/<case>.json` (checks, every timing sample), "
              "`logs/<case>.log`, `summary.csv`, `roofline/` (GPU).", ""]
    path = folder.root / "README.md"
    write_atomic(path, "\n".join(lines))
    csv = ["id,impl,layer_set,layer,batch,group,planted,status,dace_ms,cudnn_ms,torch_ms,"
           "cudnn_other_ms,torch_other_ms,gflop,detail"]
    for rec in records:
        c, t = rec["case"], rec.get("timings", {})
        detail = '"' + (rec.get("detail") or "").replace('"', "'")[:300] + '"'
        csv.append(",".join(str(v) for v in [
            rec["id"], c["impl"], c["layer_set"], c["layer"]["name"], c["layer"]["batch"],
            c["group"], c["planted"], rec["status"]]
            + [f"{t[k]['median_ms']:.6f}" if "median_ms" in t.get(k, {}) else ""
               for k in ("dace", "cudnn", "torch")]
            + [next((f"{v['median_ms']:.6f}" for k, v in t.items()
                     if k.startswith(f"{ref}-") and "median_ms" in v), "")
               for ref in ("cudnn", "torch")]
            + [rec.get("gflop", ""), detail]))
    write_atomic(folder.root / "summary.csv", "\n".join(csv) + "\n")
    return path


def _fmt(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def update_index(results_dir: Path) -> Optional[Path]:
    """``results/gpu/README.md``: one line per campaign folder beside it."""
    if not results_dir.is_dir():
        return None
    rows = []
    for sub in sorted(p for p in results_dir.iterdir() if (p / "campaign.json").exists()):
        meta = json.loads((sub / "campaign.json").read_text())
        rows.append([f"[{sub.name}]({sub.name}/README.md)", meta.get("tier"), meta.get("target"),
                     meta.get("device"), len(list((sub / "cases").glob("*.json")))])
    path = results_dir / "README.md"
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(INDEX_KEEP_MARKER):] if INDEX_KEEP_MARKER in old else ""
    write_atomic(path, "\n".join([
        "# GPU campaigns", "", "One folder per campaign (`scripts/gpu_campaign.py run`), named "
        "`<date>_<device>`; each has its own README.md.", "",
        tables.markdown(["campaign", "tier", "target", "device", "cases"], rows, "lllll")]) + "\n"
        + ("\n" + kept if kept else ""))
    return path


#: Text of ``results/gpu/README.md`` from this line on is written by hand (the analysis
#: of the campaigns) and kept when the index above it is rewritten.
INDEX_KEEP_MARKER = "<!-- written by hand below; kept by update_index -->"


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
        return exp.call(exp.build(impl, layer, case.resolved_params()), inputs)
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
    why = "Nsight Compute needs a GPU" if target != "gpu" else devices.gpu_problem()
    if why is None and shutil.which("ncu") is None:
        why = "ncu is not on the PATH"
    if why is not None:
        return _not_measured(why)
    targets, cases = [], []
    for (lset, lname, batch, pass_), row in sorted(
            roofline_rows(best_per_layer(folder.records())).items()):
        case = Case.from_json(row["best"]["case"])
        cases.append(case)
        targets += [{"label": f"{lset}.{lname}.b{batch}.{pass_}.{backend}", "backend": backend,
                     "case": case.to_json(), "cachedir": str(cachedir)}
                    for backend in ["dace"] + (["cudnn"] if "cudnn" in row["refs"] else [])]
    if not targets:
        return _not_measured("no verified, timed case")
    failed = run_builds(folder, cases, cachedir, workers, say)
    if failed:
        say(f"[roofline] {len(failed)} build(s) failed; their layers are left out")
        targets = [t for t in targets if Case.from_json(t["case"]).id not in failed]
    rdir = folder.root / "roofline"
    rdir.mkdir(exist_ok=True)
    csv, labels, log = rdir / "ncu.csv", rdir / "labels.json", folder.root / "logs" / "ncu.log"
    (rdir / "targets.json").write_text(json.dumps(targets, indent=1))
    cmd = ncu.ncu_command() + [sys.executable, "-m", "convbench.ncu", str(rdir / "targets.json"),
                               str(labels)]
    say(f"[roofline] ncu on {len(targets)} target(s)")
    with open(csv, "w") as out, open(log, "w") as err:
        code = _run_group(cmd, timeout, out, err)
    if "ERR_NVGPUCTRPERM" in csv.read_text(errors="replace") + _tail(log, 50):
        return _not_measured("ncu may not read the GPU's counters (ERR_NVGPUCTRPERM)")
    if code == "timeout":
        return {"status": "failed", "detail": f"ncu ran past {timeout:g} s; see logs/ncu.log"}
    if code != 0 or not labels.exists():
        return {"status": "failed", "detail": f"ncu exit status {code}; see logs/ncu.log"}
    parts = ncu.segments(ncu.parse_csv(csv.read_text()), json.loads(labels.read_text()))
    points = {label: ncu.summarize(kernels) for label, kernels in parts.items()}
    folder.write_json("roofline/roofline.json", points)
    plotted = ncu.plot(points, folder.read_json("ceilings.json", {}) or {},
                       str(rdir / "roofline.png"))
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
    if target == "cpu":
        name = devices.describe(target).split(" (")[0]
    else:
        import torch
        name = torch.cuda.get_device_name()
    slug = "-".join("".join(ch if ch.isalnum() else " " for ch in name).split())
    base = Path("results/gpu") if target == "gpu" else Path("outputs/campaign")
    return base / f"{time.strftime('%Y-%m-%d')}_{slug}"


def check_options(o: Options) -> None:
    check_choice("--target", o.target, TARGETS, "target")
    check_choice("--tier", o.tier, TIERS, "tier")
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
    layers = {(c.layer_set, c.layer.name, c.layer.batch, str(c.pass_)): None
              for c in cases if not c.planted}
    est = estimate(cases, o.target, cores, o.iterations, o.warmup, o.time_limit, o.cachedir,
                   roofline_layers=len(roofline_rows(layers)),
                   skip=tuple(o.skip) + TIER_SKIPS.get(o.tier, ()))
    groups = Counter(c.group for c in cases)
    budget = BUDGET_S[o.tier]
    minutes = [(p, f"{est.phases[p] / 60:.1f}") for p in PHASES]
    lines = [f"Campaign plan: tier {o.tier}, target {o.target}, {len(cases)} cases ("
             + ", ".join(f"{n} {g}" for g, n in groups.items()) + f"), {est.builds} builds.",
             f"Builds: {est.build_seconds:.0f} s each ({est.build_source}), {cores} at a time "
             f"on the host's {cores} cores.", "",
             tables.markdown(["phase", "estimated host minutes"],
                             minutes + [("**run**", f"**{est.run_s / 60:.1f}**")]), ""]
    lines += [f"call {i}: {', '.join(call)}" for i, call in enumerate(est.calls, 1)]
    lines += [f"device time: {len(est.calls)} call(s) x {CALL_SETUP_S / 60:.1f} min set-up "
              f"(machine start, wheel install) + {est.run_s / 60:.1f} min run = "
              f"{est.total_s / 60:.1f} min; budget {budget / 60:.0f} min: "
              + ("fits" if est.total_s <= budget else "DOES NOT FIT"), "", "Cases:"]
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
    if (out / "campaign.json").exists():
        if not o.resume:
            raise UsageError(f"--out {out}: a campaign is there already; add --resume to go on "
                             "with it, or name another folder")
        old = json.loads((out / "campaign.json").read_text())
        if (old.get("tier"), old.get("target")) != (o.tier, o.target):
            raise UsageError(f"--resume: {out} holds a {old.get('tier')} campaign on "
                             f"{old.get('target')}, not {o.tier} on {o.target}")
    folder = Folder(out)
    deadline = time.monotonic() + o.time_budget if o.time_budget else None
    opts = dict(dataclasses.asdict(o), worker_start_timeout=180.0,
                cases_per_worker=1 if o.isolate else 1 << 30)
    say(f"campaign: tier {o.tier}, target {o.target}, {len(cases)} cases -> {out}/")
    info = (folder.read_json("identity/versions.json", {}) if o.resume and folder.done("identity")
            else identity(folder, o.target))
    meta = folder.read_json("campaign.json") or {"tier": o.tier, "target": o.target,
                                                  "started": _now(), "runs": []}
    meta.update({"device": info.get("device"), "git": info.get("git"),
                 "cases": [c.id for c in cases], "options": dataclasses.asdict(o)})
    meta["runs"].append({"at": _now(), "command": sys.argv, "git": info.get("git")})
    folder.write_json("campaign.json", meta)
    folder.mark("identity", "done", info.get("device", ""))
    folder.archive(o.archive)

    def table() -> None:
        try:
            write_table(folder, o.target, meta)
        except Exception as err:  # noqa: BLE001 - the results are on disk; say why not
            say(f"[table] failed: {type(err).__name__}: {err}")

    def recorded(name: str) -> bool:
        # The cases phase is done while every planned case has its record: a plan that
        # grew (--planted on a later call) runs the new cases.
        return o.resume and folder.done(name) and not (
            name == "cases" and any(not folder.case_path(c).exists() for c in cases))

    def phase(name: str, body: Callable[[], dict]) -> None:
        if name in o.skip:
            if recorded(name):  # a later call's --skip keeps what an earlier call measured
                say(f"[{name}] recorded already; --skip leaves it as it is")
                return
            folder.mark(name, "skipped", f"the {o.tier} tier leaves it out"
                        if name in TIER_SKIPS.get(o.tier, ()) else "--skip")
            return
        if recorded(name):
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

    def limit(default: float) -> float:  # less where the budget ends sooner
        if deadline is None:
            return default
        return min(default, max(60.0, deadline + 60.0 - time.monotonic()))

    def ceilings_phase():
        c = measure_ceilings(folder, o.target)
        return {"detail": f"SGEMM {c['peak_gflops']:.0f} GFLOP/s, copy {c['bandwidth_gbs']:.0f} GB/s"
                + (f", TF32 {c['tf32_gflops']:.0f}, FP16 {c['fp16_gflops']:.0f} GFLOP/s"
                   if c.get("tf32_gflops") else ", tensor cores: not measured")}

    def cases_phase():
        left = run_cases(folder, cases, build_failures, opts, say, deadline,
                         lambda: folder.archive(o.archive))
        counts = Counter(rec["status"] for rec in folder.records())
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return {"status": "partial" if left else "done",
                "detail": detail + (f"; {left} left" if left else "")}

    phase("ceilings", ceilings_phase)
    # Builds are redone on every call, since a fresh host keeps nothing; not phase(), which
    # would skip them on --resume.  Recorded cases need none.
    build_failures: Dict[str, str] = {}
    if "builds" not in o.skip:
        t0 = time.perf_counter()
        say("[builds] ...")
        try:
            todo = [c for c in cases if not folder.case_path(c).exists()]
            planted = [c for c in todo if c.planted][:1]  # the planted cases share one build
            build_failures = run_builds(folder, [c for c in todo if not c.planted] + planted,
                                        o.cachedir, o.workers, say)
            if planted and planted[0].id in build_failures:
                build_failures.update(dict.fromkeys(
                    [c.id for c in cases if c.planted], build_failures[planted[0].id]))
            status, detail = "done", f"{len(build_failures)} case(s) without a build"
        except Exception as err:  # noqa: BLE001 - the workers build on a miss instead
            status, detail = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
            say(f"[builds] failed ({type(err).__name__}: {err}); cases build on a miss")
        folder.mark("builds", status, detail, time.perf_counter() - t0)
    phase("cases", cases_phase)
    phase("tests", lambda: run_gpu_tests(folder, o.target, limit(540.0), o.workers))
    phase("roofline", lambda: run_roofline(folder, o.target, o.cachedir, o.workers,
                                           limit(420.0), say))
    folder.mark("table", "done", "README.md, summary.csv")
    table()
    if out.parent.name == "gpu":
        update_index(out.parent)
    folder.archive(o.archive)
    phases = folder.state()["phases"]
    incomplete = [p for p in PHASES if p not in o.skip and phases.get(p, {}).get("status")
                  not in ("done", "not measured", "failed")]
    say(f"campaign: {out}/README.md" + (f"; not finished: {', '.join(incomplete)} "
                                         "(run again with --resume)" if incomplete else ""))
    return 3 if incomplete else 0


if __name__ == "__main__":  # the case worker: python -m convbench.campaign worker DIR OPTIONS
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m convbench.campaign worker DIR OPTIONS_JSON")
