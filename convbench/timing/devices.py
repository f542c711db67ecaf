"""Device selection: ``--device cpu|gpu|auto``."""

from __future__ import annotations

import functools
import os
from typing import Optional, Tuple

from convbench.base.errors import UsageError

DEVICES = ("cpu", "gpu", "auto")


@functools.lru_cache(maxsize=None)
def gpu_problem():
    """None if a CUDA device is usable from torch, else the reason why not."""
    try:
        import torch
    except ImportError as err:  # pragma: no cover - torch is a dependency
        return f"torch is not importable ({err})"
    if not torch.cuda.is_available():
        return "torch sees no usable CUDA device"
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - any failure means "not usable"
        return f"CUDA device is not usable: {err}".splitlines()[0]
    return None


def arch_problem(arch: str, device: str = "gpu") -> Optional[str]:
    """Why this machine's GPU cannot run a build for the architecture-specific target
    ``sm_<arch>`` (``"90a"``: ``wgmma``, Hopper only), or None (also for other targets,
    for the CPU, and where no GPU is usable: :func:`gpu_problem` says so)."""
    if device != "gpu" or not arch or not arch.endswith("a") or gpu_problem():
        return None
    import torch
    major, minor = torch.cuda.get_device_capability()
    if f"{major}{minor}" == arch[:-1]:
        return None
    return (f"is built for sm_{arch} (Hopper's wgmma: H100, H200, GH200); this GPU, "
            f"{torch.cuda.get_device_name()}, is sm_{major}{minor}: use the mma.sync kernels")


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if device == "gpu":
        import torch
        torch.cuda.synchronize()


def gpu_usable() -> bool:
    return gpu_problem() is None


def resolve_device(requested: str) -> str:
    """``cpu`` or ``gpu``; ``auto`` picks the GPU when one is usable."""
    if requested not in DEVICES:
        raise UsageError(f"--device: unknown device '{requested}' (choose from "
                         f"{', '.join(DEVICES)})")
    if requested == "auto":
        return "gpu" if gpu_usable() else "cpu"
    if requested == "gpu" and not gpu_usable():
        raise UsageError(f"--device gpu: {gpu_problem()}")
    return requested


def describe(device: str) -> str:
    """A one-line name of the device, for reports."""
    import platform
    if device == "gpu":
        import torch
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import os
    return f"{cpu} ({os.cpu_count()} logical cores)"


def set_threads(threads: Optional[int]) -> Optional[int]:
    """One thread count for torch and for DaCe's OpenMP code (before either starts)."""
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch
        torch.set_num_threads(threads)  # also DaCe's: both use the libgomp torch loads
    return threads


def cpu_available_memory() -> Tuple[int, str]:
    """(bytes, what they are): the memory the CPU side can take now (``MemAvailable``,
    else the free physical pages)."""
    found = (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
             "free physical pages (sysconf)")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        pass
    return found
