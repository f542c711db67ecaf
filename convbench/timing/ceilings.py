"""Measured ceilings for the roofline: compute peak from a large SGEMM and memory
bandwidth from a large copy, on the device the run uses, with its thread count.

On the CPU also the FMA peak (:func:`cpu_fma_peak`), which a convolution can approach
more closely than a library SGEMM of one size does.  Each ceiling is the best of
several repetitions after a warm-up: the most the device showed it can do, not its
typical speed.  A copy moves each byte twice (read and write), and is counted so.
"""

import os
import subprocess
import tempfile
import time
from typing import Dict, Optional

from convkernels.cpu import isa

#: ``CHAINS`` independent chains of vector FMAs per thread, each vector one register of
#: the host (``LANES`` floats: GCC's vector extension), so that neither the FMA latency
#: nor loads nor register spills limit them; prints GFLOP/s of the best of 3 rounds.
#: (A fixed 12 x 16 floats took 24 of AVX2's 16 registers and spilled: 9.2 GFLOP/s on
#: the 2-core AVX2 EPYC, against 125 for this probe, both measured beside a busy tuner.)
_FMA_SOURCE = r"""
#include <stdio.h>
#include <omp.h>
#define LANES @LANES@
#define CHAINS @CHAINS@
typedef float vec __attribute__((vector_size(4 * LANES)));
int main(void) {
    const long iters = 40000000L;
    double best = 0.0;
    for (int round = 0; round < 3; ++round) {
        float sink = 0.0f;
        double t0 = omp_get_wtime();
        #pragma omp parallel reduction(+:sink)
        {
            vec acc[CHAINS], b, c;
            for (int j = 0; j < LANES; ++j) { b[j] = 1.0000001f; c[j] = 1e-7f; }
            for (int i = 0; i < CHAINS; ++i) for (int j = 0; j < LANES; ++j) acc[i][j] = (float)i;
            for (long it = 0; it < iters; ++it) {
                #pragma GCC unroll 32
                for (int i = 0; i < CHAINS; ++i) acc[i] = acc[i] * b + c;
            }
            for (int i = 0; i < CHAINS; ++i) for (int j = 0; j < LANES; ++j) sink += acc[i][j];
        }
        double gflops = 2.0 * LANES * CHAINS * iters * omp_get_max_threads()
                        / (omp_get_wtime() - t0) / 1e9;
        if (gflops > best) best = gflops;
        if (sink == 12345.0f) printf("#");
    }
    printf("%.2f\n", best);
    return 0;
}
"""


def fma_source() -> str:
    """The FMA probe for this CPU: one vector register per chain, and as many chains as
    a micro-tile may keep accumulators (:func:`convkernels.cpu.isa.accumulator_budget`, at
    most 12: enough to hide the FMA latency on two ports)."""
    return (_FMA_SOURCE.replace("@LANES@", str(isa.vector_floats()))
            .replace("@CHAINS@", str(min(12, isa.accumulator_budget()))))


def cpu_fma_peak(threads: int) -> Optional[float]:
    """GFLOP/s of back-to-back vector FMAs on ``threads`` threads, compiled with the host
    compiler (``c++ -O2 -march=native -ffp-contract=fast -fopenmp``), or None where that
    cannot be compiled or run."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "fma.c"), os.path.join(tmp, "fma")
        with open(src, "w") as f:
            f.write(fma_source())
        try:
            subprocess.run(["c++", "-x", "c", "-O2", "-march=native", "-ffp-contract=fast",
                            "-fopenmp", src, "-o", exe], check=True, capture_output=True,
                           timeout=120)
            out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
            return float(out.strip().lstrip("#"))
        except (OSError, subprocess.SubprocessError, ValueError):
            return None


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


def _time_gemm(n: int, tdev: str, device: str, dtype=None, tf32: bool = False) -> float:
    """Best seconds of ``torch.mm`` of ``n`` x ``n`` random ``dtype`` (float32) matrices,
    with torch's TF32 switch set to ``tf32`` meanwhile (it matters on a GPU only)."""
    import torch
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        dtype = dtype or torch.float32
        a, b = (torch.rand(n, n, device=tdev, dtype=dtype) for _ in range(2))
        c = torch.empty(n, n, device=tdev, dtype=dtype)
        return _best_seconds(lambda: torch.mm(a, b, out=c), 5, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _time_copy(nbytes: int, tdev: str, device: str) -> float:
    import torch
    src = torch.ones(nbytes // 4, device=tdev)
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), 5, device)


#: Ceilings measured in this process, per device and thread count (:func:`measure`).
_MEASURED: Dict[tuple, Dict[str, object]] = {}


def measure(device: str) -> Dict[str, object]:
    """The device's GEMM and copy ceilings (and the CPU's FMA peak), measured once per
    process, device and thread count: a later run in the same process (a test session, a
    campaign) reuses them rather than spending seconds on them again."""
    import torch
    key = (device, torch.get_num_threads())
    if key not in _MEASURED:
        _MEASURED[key] = _measure(device)
    return dict(_MEASURED[key])


def _measure(device: str) -> Dict[str, object]:
    import torch
    if device == "gpu":
        n, copy_bytes, tdev = 8192, 1 << 30, "cuda"
    else:
        n, copy_bytes, tdev = 3072, 256 << 20, "cpu"
    t_mm = _time_gemm(n, tdev, device)
    t_copy = _time_copy(copy_bytes, tdev, device)
    where = "device-to-device copy" if device == "gpu" else "copy"
    extra = {}
    if device == "cpu":
        extra = {"fma_peak_gflops": cpu_fma_peak(torch.get_num_threads()),
                 "fma_peak_method": "12 independent 64-byte vector FMA chains per thread, "
                                    "c++ -O2 -march=native, best of 3"}
    return {
        "peak_gflops": 2 * n ** 3 / t_mm / 1e9,
        "peak_method": f"torch.mm {n}x{n} float32" + (", TF32 off" if device == "gpu" else "")
                       + f", best of 5 ({torch.get_num_threads()} threads)" * (device == "cpu"),
        "bandwidth_gbs": 2 * copy_bytes / t_copy / 1e9,
        "bandwidth_method": f"{where} of {copy_bytes >> 20} MiB (read + write), best of 5",
        **extra,
    }


def tensor_core_peaks(n: int = 8192) -> Dict[str, object]:
    """The GPU's tensor-core GEMM rates (GFLOP/s): TF32 (float32 operands, ``allow_tf32``)
    and FP16 (half operands, float accumulation by cuBLAS), ``torch.mm`` of ``n`` x ``n``,
    best of 5 with CUDA events, on random data (never zeros)."""
    import torch
    flop = 2 * n ** 3
    return {"tf32_gflops": flop / _time_gemm(n, "cuda", "gpu", torch.float32, True) / 1e9,
            "fp16_gflops": flop / _time_gemm(n, "cuda", "gpu", torch.float16) / 1e9,
            "tensor_method": f"torch.mm {n}x{n}, TF32 (float32, allow_tf32) and FP16 "
                             "(float16), best of 5, CUDA events"}
