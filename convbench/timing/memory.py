"""Memory of one large layer: what each phase needs, what is available, and the peak a
phase reached (``convbench stress``).

The estimate lists, by item, the bytes torch's phase and DaCe's phase need (they run one
after the other); :class:`PeakMemory` measures a phase's peak: the process's peak RSS on
the CPU (reset through ``/proc/self/clear_refs``), the driver's used memory sampled every
2 ms on the GPU.
"""

import gc
import math
import re
import resource
import threading

GIB = float(1 << 30)
#: Interval of the GPU memory sampler, seconds.
GPU_SAMPLE_S = 0.002
#: Elements that :func:`convbench.check.verify.compare` works through at a time.
COMPARE_CHUNK = 1 << 22


def check_regions(out_d: int, planes: int):
    """Output depth ranges ``[o0, o1)`` the sub-volume check covers: the first and the
    last ``planes`` planes (the whole depth where they would overlap)."""
    if 2 * planes >= out_d:
        return [(0, out_d)]
    return [(0, planes), (out_d - planes, out_d)]


def input_depth_range(layer, o0: int, o1: int):
    """Input depth range ``[lo, hi)`` (in unpadded coordinates, may reach into the
    padding) that output planes ``o0 .. o1-1`` read."""
    lo = o0 * layer.stride - layer.pads[0]
    return lo, (o1 - 1) * layer.stride - layer.pads[0] + layer.k_d


def check_bytes(layer, planes: int) -> int:
    """Host memory of the sub-volume check at its largest region: the float32 input
    slab, its float64 copy and absolute value, the float64 reference and absolute
    reference, torch's float64 im2col columns (``slow_conv3d``, whole batch), the
    output sub-volume copied out, and :func:`~convbench.check.verify.compare`'s chunks."""
    most = 0
    for o0, o1 in check_regions(layer.out_d, planes):
        lo, hi = input_depth_range(layer, o0, o1)
        slab = layer.batch * layer.in_channels * (hi - lo) * layer.in_h * layer.in_w
        out = layer.batch * layer.out_channels * (o1 - o0) * layer.out_h * layer.out_w
        cols = (layer.batch * layer.in_channels * layer.k_d * layer.k_h * layer.k_w
                * (o1 - o0) * layer.out_h * layer.out_w)
        most = max(most, 4 * slab + 16 * slab + 16 * out + 8 * cols + 4 * out
                   + 8 * 8 * COMPARE_CHUNK)
    return most


def memory_estimate(layer, device: str, flush_bytes: int, check_planes: int = 0,
                    skip_torch: bool = False, dace_transients=None) -> dict:
    """Bytes each phase needs, by item; torch and DaCe run one after the other, so the
    need is the larger phase.  ``X``, ``W``, ``Y``: input, filter and output (float32);
    ``Xp``: the zero-padded input.

    * both phases: the logical inputs ``X + W`` and the timer's flush buffer;
    * torch: the inputs in its memory format ``X + W`` (a copy for channels_last_3d),
      its output ``Y``, and oneDNN/cuDNN workspace, taken as ``Xp + Y`` (reorders of
      the input and the output into blocked formats);
    * DaCe: the inputs in the stored layout ``X + W``, the poisoned output ``Y``,
      the program's transients, taken as ``Xp + Y`` (the padded input, one output-sized
      buffer to spare), or what its SDFG declares (``dace_transients``) where that is
      more; and on the CPU the sub-volume check (:func:`check_bytes`), which runs
      while the DaCe arrays are alive.
    """
    pd, ph, pw = layer.pads
    X = 4 * math.prod(layer.input_shape)
    W = 4 * math.prod(layer.filter_shape)
    Y = 4 * math.prod(layer.output_shape)
    Xp = 4 * (layer.batch * layer.in_channels * (layer.in_d + 2 * pd) * (layer.in_h + 2 * ph)
              * (layer.in_w + 2 * pw))
    common = {"logical inputs (x, w)": X + W, "timer flush buffer": flush_bytes}
    torch_items = {"inputs in torch's memory format": X + W, "torch output": Y,
                   "oneDNN/cuDNN workspace (allowance: padded input + output)": Xp + Y}
    transients = Xp + Y
    label = "program transients (allowance: padded input + output)"
    if dace_transients is not None and dace_transients > transients:
        transients, label = dace_transients, "program transients (from its SDFG)"
    dace_items = {"inputs in the stored layout": X + W, "DaCe output": Y, label: transients}
    if check_planes and device == "cpu":
        dace_items[f"sub-volume check ({check_planes} planes per end, float64)"] = \
            check_bytes(layer, check_planes)
    base = sum(common.values())
    torch_total = 0 if skip_torch else base + sum(torch_items.values())
    dace_total = base + sum(dace_items.values())
    return {"common": common, "torch": {} if skip_torch else torch_items, "dace": dace_items,
            "torch_phase_bytes": torch_total, "dace_phase_bytes": dace_total,
            "peak_bytes": max(torch_total, dace_total), "sdfg_transient_bytes": dace_transients}


def program_transient_bytes(sdfg, threads: int = 1) -> int:
    """Bytes of the transients an SDFG allocates: every non-view transient of a
    constant size, in every nested SDFG, except registers and GPU shared memory;
    thread-local storage once per thread."""
    from dace import data, dtypes
    total = 0
    for _, _, desc in sdfg.arrays_recursive():
        if not desc.transient or isinstance(desc, data.View):
            continue
        if desc.storage in (dtypes.StorageType.Register, dtypes.StorageType.GPU_Shared):
            continue
        try:
            size = int(desc.total_size) * desc.dtype.bytes
        except (TypeError, ValueError):  # a symbolic size: not in these builds
            continue
        if desc.storage == dtypes.StorageType.CPU_ThreadLocal:
            size *= threads
        total += size
    return total


def available_memory(device: str, limit_gib=None):
    """(bytes, what they are) available on ``device`` now, at most ``limit_gib``."""
    if device == "gpu":
        import torch
        free, _ = torch.cuda.mem_get_info()
        found = free, "free GPU memory (cudaMemGetInfo)"
    else:
        from convbench.timing.devices import cpu_available_memory
        found = cpu_available_memory()
    if limit_gib is not None and int(limit_gib * GIB) < found[0]:
        return int(limit_gib * GIB), f"{found[1]}, limited by --memory-limit"
    return found


def _proc_status_bytes(field: str):
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_peak_rss() -> bool:
    """Reset the process's VmHWM to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _gpu_used() -> int:
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free


class PeakMemory:
    """Context manager measuring the peak memory of one phase on ``device``."""

    def __init__(self, device: str):
        self.device = device
        self.method = ""
        self.baseline = self.peak = None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        gc.collect()
        if self.device == "gpu":
            import torch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.baseline = self.peak = _gpu_used()
            self.method = (f"GPU memory in use from cudaMemGetInfo (driver level, sees DaCe's "
                           f"cudaMalloc; other processes too), sampled every "
                           f"{GPU_SAMPLE_S * 1e3:.0f} ms; peak minus the use before the phase")
            self._thread = threading.Thread(target=self._sample_gpu, daemon=True)
            self._thread.start()
        else:
            self.baseline = _proc_status_bytes("VmRSS")
            if _reset_peak_rss():
                self.method = ("process peak RSS (VmHWM, reset through /proc/self/clear_refs "
                               "before the phase) minus the RSS before the phase")
            else:
                self.method = ("process peak RSS (ru_maxrss: cannot be reset, so the peak since "
                               "the process started) minus the RSS before the phase")
        return self

    def _sample_gpu(self):
        while not self._stop.wait(GPU_SAMPLE_S):
            self.peak = max(self.peak, _gpu_used())

    def __exit__(self, *exc):
        if self.device == "gpu":
            from convbench.timing.devices import synchronize
            synchronize("gpu")
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _gpu_used())
        else:
            peak = _proc_status_bytes("VmHWM")
            if peak is None or "ru_maxrss" in self.method:
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.peak = peak
        return False

    def result(self) -> dict:
        increase = None
        if self.peak is not None and self.baseline is not None:
            increase = max(self.peak - self.baseline, 0)
        return {"peak_mem_bytes": increase,
                "peak_mem_gib": None if increase is None else increase / GIB,
                "baseline_bytes": self.baseline,
                ("peak_used_bytes" if self.device == "gpu" else "peak_rss_bytes"): self.peak,
                "method": self.method}
