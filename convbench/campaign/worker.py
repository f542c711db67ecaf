"""The cases phase: a parent that feeds cases to worker processes (one case at a time,
replaced after a crash, a hang or a wrong result), and the worker that runs a case.
The worker runs as ``python -m convbench.campaign worker DIR OPTIONS_JSON``."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence
from .folder import Folder
from .plan import Case, PLANTED_HANG_TIMEOUT_S



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
    from convbench.build.toolchain import PROJECT_ROOT
    return PROJECT_ROOT


def _spawn(cmd: List[str], env=None, **kwargs) -> subprocess.Popen:
    """``cmd`` in the project root, importing this checkout, in a process group of its own
    (so that :func:`_kill` ends what it started too: pytest's build workers, the process
    ncu profiles); ``env``: its environment (default: this process's)."""
    root = str(_project_root())
    env = dict(os.environ if env is None else env)
    path = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(cmd, cwd=root, start_new_session=True,
                            env=dict(env, PYTHONUNBUFFERED="1", PYTHONPATH=path), **kwargs)


def _kill(proc: subprocess.Popen) -> int:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait()


def _run_group(cmd: List[str], timeout: float, stdout, stderr, env=None) -> object:
    """``cmd``'s exit status, or "timeout" (its process group killed); ``env``: its
    environment (default: this process's)."""
    proc = _spawn(cmd, stdout=stdout, stderr=stderr, env=env)
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


def worker_main(root: str, options_json: str) -> int:
    """The worker: reads cases (JSON lines) on stdin, writes each one's record file and
    ``DONE`` on the protocol channel (the original stdout); the case's own output, native
    code's included, goes to its log."""
    options = json.loads(options_json)
    folder = Folder(root)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints must not reach the protocol channel
    from convbench.timing.devices import set_threads
    set_threads(options.get("threads"))
    import torch  # noqa: F401 - imported before READY, so that its cost is not a case's
    from .. import registry
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
    from convkernels.layouts import Layout
    own = Layout(layout)
    return [own] + ([other for other in Layout if other != own] if device == "gpu" else [])


def _plant_wrong(out):
    print("planted wrong result: one output element doubled, plus 1", flush=True)
    out = out.contiguous()
    flat = out.view(-1)
    flat[flat.numel() // 2] = flat[flat.numel() // 2] * 2 + 1
    return out


def run_case(case: Case, options: dict) -> dict:
    """Verify ``case`` against torch float64 (and cuDNN on a GPU), then time it next to
    the references (:meth:`convbench.experiment.pipeline.Experiment.run_case`); a record
    (``status``: verified, wrong or refused)."""
    from convbench.experiment.pipeline import Experiment, Observer, TimingOptions
    from convkernels.layouts import PASS_SIGNATURE
    from convbench.check.references import ReferenceOptions

    class _CaseLog(Observer):
        """Prints the case's checks and timings into its log."""

        def checked(self, exp, record):
            for c in record.checks:
                print(f"check {c.reference}: {c.summary()} -> {'ok' if c.ok else 'WRONG'}",
                      flush=True)

        def timed(self, exp, record):
            for m in record.measurements:
                print(f"timed {m.backend}: median {m.timing.stats()['median_ms']:.4f} ms over "
                      f"{len(m.timing.samples_ms)} samples", flush=True)
            for name, why in record.errors.items():
                print(f"timing {name} failed: {why}", flush=True)

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
    exp = Experiment(impl, [layer], device, policy="reuse", cachedir=options["cachedir"],
                     seed=options["seed"], observer=_CaseLog(),
                     timing=TimingOptions(options["warmup"], options["iterations"],
                                          options["time_limit"], flush=True,
                                          events=options.get("events", "torch")),
                     references=ReferenceOptions(allow_tf32=False, cudnn_algo="find"),
                     dtype=case.precision)
    # The verdict is the float64 check's.  The references in the case's precision (torch
    # on the GPU, cuDNN) are recorded beside it: an algorithm they pick (FFT, Winograd) may round worse.
    found = exp.run_case(impl, layer, params=params, references=case.time_refs,
                         layouts=vendor_layouts(impl.layout, device), time_wrong=False,
                         tamper=_plant_wrong if case.planted == "wrong" else None, catch=False)
    checks = found.checks
    record = {"status": "verified" if checks[0].ok else "wrong", "params": params,
              "checks": [dataclasses.asdict(c) for c in checks],
              "detail": "; ".join(f"{c.reference}: {c.summary()}" for c in checks),
              "gflop": layer.flops() / 1e9,
              "build": {"name": found.build_name, "origin": found.build_origin}}
    if not checks[0].ok:
        return record
    timings = {m.backend: dict(m.timing.stats(),
                               samples_ms=[round(x, 6) for x in m.timing.samples_ms],
                               warmup=m.timing.warmup, limited=m.timing.limited)
               for m in found.measurements}
    timings.update({name: {"error": why} for name, why in found.errors.items()})
    timer = exp.timer
    record.update({"timings": timings, "reference_info": found.infos, "timer": timer.method,
                   "array_library": exp.array_library, "flush_bytes": timer.flush_bytes,
                   "seconds": round(time.perf_counter() - t_start, 2),
                   "out_role": PASS_SIGNATURE[impl.pass_][1]})
    if device == "gpu":
        import torch
        torch.cuda.synchronize()
        try:  # cuDNN plans keep their workspaces: free them for the next case
            import cudnn_bindings
            cudnn_bindings.clear_plans()
        except Exception:  # noqa: BLE001
            pass
        torch.cuda.empty_cache()
    return record
