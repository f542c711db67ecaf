"""Measured ceilings for the roofline: compute peak from a large SGEMM and memory
bandwidth from a large copy, on the device the run uses, with its thread count.

CPU: ``torch.mm`` of 3072x3072 float32 matrices (oneDNN/MKL SGEMM) and a copy of
256 MiB.  GPU: ``torch.mm`` of 8192x8192 float32 with TF32 off (IEEE FP32 on the
CUDA cores), and a device-to-device copy of 1 GiB, timed with CUDA events.  Each is
the best of several repetitions after a warm-up: a ceiling is the most the device
showed it can do, not its typical speed.  A copy moves each byte twice (read and
write), and is counted so.
"""

import time
from typing import Dict


def _best_seconds(fn, repeat: int, device: str) -> float:
    import torch
    fn()
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device == "gpu":
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, begin.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def _time_sgemm(n: int, tdev: str, device: str) -> float:
    import torch
    a, b = torch.rand(n, n, device=tdev), torch.rand(n, n, device=tdev)
    c = torch.empty(n, n, device=tdev)
    return _best_seconds(lambda: torch.mm(a, b, out=c), 5, device)


def _time_copy(nbytes: int, tdev: str, device: str) -> float:
    import torch
    src = torch.ones(nbytes // 4, device=tdev)
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), 5, device)


def measure(device: str) -> Dict[str, object]:
    import torch
    if device == "gpu":
        n, copy_bytes, tdev = 8192, 1 << 30, "cuda"
    else:
        n, copy_bytes, tdev = 3072, 256 << 20, "cpu"
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        t_mm = _time_sgemm(n, tdev, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    t_copy = _time_copy(copy_bytes, tdev, device)
    where = "device-to-device copy" if device == "gpu" else "copy"
    return {
        "peak_gflops": 2 * n ** 3 / t_mm / 1e9,
        "peak_method": f"torch.mm {n}x{n} float32" + (", TF32 off" if device == "gpu" else "")
                       + f", best of 5 ({torch.get_num_threads()} threads)" * (device == "cpu"),
        "bandwidth_gbs": 2 * copy_bytes / t_copy / 1e9,
        "bandwidth_method": f"{where} of {copy_bytes >> 20} MiB (read + write), best of 5",
    }
