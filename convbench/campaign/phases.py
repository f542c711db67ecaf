"""The phases a campaign runs around its cases: identity, ceilings, builds, the
end-to-end training step (tune tier), the GPU tests and the Nsight Compute roofline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from .folder import _not_measured
from .plan import Case, ORIGINAL_BATCH
from .report import best_per_layer
from .worker import _run_group, _tail



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

    from convbench.timing import devices
    from convbench.build import toolchain
    from convbench.results.writer import git_commit
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
    from convbench.timing import ceilings
    out = ceilings.measure(target)
    out.update(ceilings.tensor_core_peaks() if target == "gpu" else
               {"tf32_gflops": None, "fp16_gflops": None,
                "tensor_method": "not measured: tensor-core GEMM needs a GPU"})
    if target == "gpu":
        device = (folder.read_json("identity/versions.json", {}) or {}).get("device")
        out.update(against_recorded(out, device, folder.root.parent, exclude=folder.root))
    folder.write_json("ceilings.json", out)
    if target == "gpu":
        import torch
        torch.cuda.empty_cache()  # the case workers need the memory, not this process
    return out


#: Below this share of a device's recorded SGEMM ceiling, the GPU is taken to be busy.
IMPAIRED_SHARE = 0.8


def against_recorded(ceilings: dict, device: Optional[str], results_dir: Path,
                     exclude: Optional[Path] = None) -> dict:
    """This campaign's SGEMM ceiling over the median of the campaigns in ``results_dir``
    on the same device, and a warning below :data:`IMPAIRED_SHARE`.  A kernel that hung in
    an earlier process can keep running on the GPU after its process is killed (an H200
    read half its SGEMM rate so), and every time measured then is wrong."""
    import statistics
    recorded = []
    for other in sorted(results_dir.glob("*/ceilings.json")):
        if exclude is not None and other.parent.resolve() == Path(exclude).resolve():
            continue
        try:
            same = json.loads((other.parent / "identity" / "versions.json").read_text())
            peak = json.loads(other.read_text()).get("peak_gflops")
        except (OSError, ValueError):
            continue
        if device and same.get("device") == device and peak:
            recorded.append(float(peak))
    if not recorded or not ceilings.get("peak_gflops"):
        return {}
    share = ceilings["peak_gflops"] / statistics.median(recorded)
    out = {"peak_vs_recorded": round(share, 3), "recorded_campaigns": len(recorded)}
    if share < IMPAIRED_SHARE:
        out["warning"] = (f"SGEMM at {share:.2f}x of this device's recorded ceiling "
                          f"({len(recorded)} campaign(s)): the GPU is likely busy (a hung "
                          f"kernel of an earlier process?); times of this call are suspect")
    return out


# -- phase: builds ---------------------------------------------------------------------------

def run_builds(folder: Folder, cases: Sequence[Case], cachedir, workers: int,
               say: Callable[[str], None]) -> Dict[str, str]:
    """Build what ``cases`` need; the failures by case id (their message)."""
    from convbench.build import cache
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
        # a build reused by a later call keeps the cases of the earlier calls
        before = [c for c in rows.get(name, {}).get("cases", []) if c not in owners[name]]
        rows[name] = {"outcome": outcome, "seconds": round(seconds, 2), "message": message,
                      "cases": before + owners[name]}
        if outcome != "failed" and job.target == "gpu":
            rows[name]["sass"] = read_build(job, cachedir)
        if outcome == "failed":
            failed.update(dict.fromkeys(owners[name], message))
            say(f"[builds]   FAILED {job.describe()}: {message}")
        if n % 10 == 0 or n == len(jobs):
            say(f"[builds]   {n}/{len(jobs)} in {time.perf_counter() - t0:.0f}s")
        folder.write_json("builds.json", rows)
    return failed


def read_build(job, cachedir) -> dict:
    """The main kernel's reading of a cached GPU build (:func:`convbench.build.sass.summary`),
    or why it was not read.  Disassembling a library takes well under a second."""
    from convbench.build import cache, sass
    if sass.tool_dir() is None:
        return {"error": "cuobjdump/nvdisasm not found"}
    try:
        entry = cache.BuildCache(cachedir).entry(job.spec())
        manifest = json.loads((entry / cache.MANIFEST).read_text())
        readings = sass.read_listing(sass.disassemble(entry / manifest["library"]))
    except Exception as err:  # noqa: BLE001 - recorded, the campaign goes on
        return {"error": f"{type(err).__name__}: {err}".splitlines()[0][:200]}
    return sass.summary(sass.main_reading(readings))


def run_gpu_tests(folder: Folder, target: str, timeout: float, cores: int) -> dict:
    from convbench.timing import devices
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


def roofline_rows(rows: Dict[tuple, object]) -> Dict[tuple, object]:
    """The rows the roofline profiles: the forward pass of the CosmoFlow layers at the
    original batch where the campaign ran them, else every row (the smoke tier)."""
    main = {k: v for k, v in rows.items()
            if k[2] == ORIGINAL_BATCH.get(k[0]) and k[3] == "fwd"}
    return main or dict(rows)


def run_roofline(folder: Folder, target: str, cachedir, workers: int, timeout: float,
                 say: Callable[[str], None]) -> dict:
    """Nsight Compute counters of cuDNN and the best DaCe kernel per layer, and the plot."""
    from convbench.timing import devices
    from convbench.campaign import ncu
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
    cmd = ncu.ncu_command() + [sys.executable, "-m", "convbench.campaign.ncu", str(rdir / "targets.json"),
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


#: The end-to-end phase's run on the CPU rehearsal: the training step at 32^3 (128^3 is
#: the GPU's, minutes on a CPU).
END2END_CPU_SIZE = 32


def run_end2end(folder: Folder, target: str, cachedir, timeout, say: Callable[[str], None],
                dtype: Optional[str] = None, runs=None, campaign_winners: bool = True,
                time_left: Optional[Callable[[], float]] = None) -> dict:
    """The training step (``scripts/cosmoflow_end2end.py --train --check``, TF32 off), once
    per run of ``runs`` ((precision, extra flags); default: one, in ``dtype`` or float32),
    each in its own folder (``end2end`` for the first, ``end2end_<precision>`` for the
    others) with its record (``end2end.json``, ``end2end_<precision>.json``) and log; a
    run recorded already is not run again (``--resume``), but for one that timed out.  With ``campaign_winners`` its tuned entries are the
    campaign's winners (``end2end/tuning.json``: the tune tier), else the project's.
    ``timeout``: seconds per run, or a function of a default that gives them; a run whose
    estimate exceeds ``time_left()`` is left for the next call (status ``partial``)."""
    from .plan import end2end_run_seconds
    runs = runs or ((dtype or "float32", ()),)
    results = []
    for i, (precision, flags) in enumerate(runs):
        name = "end2end" if i == 0 else f"end2end_{precision}"
        record = folder.read_json(f"{name}.json")
        if record and record.get("exit") != "timeout":  # a failure is a result too
            results.append((record.get("exit"), f"{precision}: recorded already (exit "
                            f"{record.get('exit')})"))
            continue
        if time_left is not None and time_left() < end2end_run_seconds(target, flags):
            return {"status": "partial", "detail": "; ".join(
                [d for _, d in results] + [f"{precision} and after: left for --resume"])}
        seconds = timeout(420.0) if callable(timeout) else timeout
        results.append(_run_step(folder, target, cachedir, seconds, say, name, precision,
                                 tuple(flags), campaign_winners))
    failed = [detail for code, detail in results if code != 0]
    return {"status": "failed" if failed else "done",
            "detail": "; ".join(detail for _, detail in results)}


def _run_step(folder: Folder, target: str, cachedir, timeout: float, say, name: str,
              precision: str, flags: Tuple[str, ...], campaign_winners: bool):
    from convbench.base.files import write_atomic
    from convbench.build.toolchain import PROJECT_ROOT
    from .plan import END2END
    from .report import tune_winners
    out = folder.root / name
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if campaign_winners:
        tuned = out / "tuning.json"
        write_atomic(tuned, json.dumps({"entries": tune_winners(folder.records())["entries"]},
                                       indent=1, sort_keys=True) + "\n")
        env["CONVBENCH_TUNING"] = str(tuned)
    model, size, batch = END2END
    size = size if target == "gpu" else END2END_CPU_SIZE
    cmd = [sys.executable, str(PROJECT_ROOT / "scripts" / "cosmoflow_end2end.py"),
           "--model", model, "--size", str(size), "--batch", str(batch), "--device", target,
           "--train", "--check", *flags] + (
               ["--dtype", precision] if precision != "float32" else []) + ["--outdir", str(out)]
    if cachedir:
        cmd += ["--cachedir", str(cachedir)]
    log = folder.root / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"[end2end] {' '.join(cmd[1:])} (tuned entries: "
        + (f"{(out / 'tuning.json').relative_to(folder.root)})" if campaign_winners
           else "the project's)"))
    with open(log, "w") as f:
        code = _run_group(cmd, timeout, f, subprocess.STDOUT, env=env)
    last = next((line for line in reversed(_tail(log, 40).splitlines())
                 if line.startswith("end2end ")), "")
    folder.write_json(f"{name}.json", {"exit": code, "summary": last, "command": cmd[1:],
                                       "log": f"logs/{name}.log",
                                       "tuning": f"{name}/tuning.json" if campaign_winners
                                       else "the project's"})
    return code, last or f"exit {code}, see logs/{name}.log"
