"""Timing: warm-up, then one sample per call, with the caches flushed before each.

docs/profiling.md ("Method", "Statistics"), describes the
timers, the flush and the statistics.  The GPU timers need torch's current stream to
be the legacy default stream because GPU builds launch there
(``compiler.cuda.max_concurrent_streams = -1``, see :mod:`convbench.build.toolchain`): only
then do the events bracket exactly the kernels of the call.
"""

import ctypes
import dataclasses
import math
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

#: IQR / median above which a measurement is flagged as noisy.
NOISY_IQR = 0.10
GPU_FLUSH_BYTES = 256 << 20
MIN_CPU_FLUSH_BYTES = 64 << 20
#: With a time limit, the fewest samples kept.
MIN_SAMPLES = 3


@dataclasses.dataclass
class Timing:
    """The samples of one (layer, backend) measurement, in milliseconds."""

    samples_ms: List[float]
    warmup: int
    method: str
    #: True when a time limit stopped the sampling before ``iterations``.
    limited: bool = False

    def stats(self) -> Dict[str, float]:
        return summarize(self.samples_ms)


def summarize(samples_ms: List[float]) -> Dict[str, float]:
    """Median, quartiles (numpy's linear interpolation), IQR (absolute and relative to the
    median), min, mean, noisy."""
    import numpy
    values = sorted(samples_ms)
    if values:
        q1, med, q3 = (float(v) for v in numpy.quantile(values, (0.25, 0.5, 0.75)))
    else:
        q1 = med = q3 = math.nan
    iqr = q3 - q1
    rel = iqr / med if med > 0 else math.nan
    return {"samples": len(values), "median_ms": med, "q1_ms": q1, "q3_ms": q3, "iqr_ms": iqr,
            "iqr_over_median": rel, "noisy": bool(rel > NOISY_IQR),
            "min_ms": values[0] if values else math.nan,
            "mean_ms": statistics.fmean(values) if values else math.nan}


def cpu_flush_bytes(base: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Four times the L3 (or last-level) cache of CPU 0 (as sysfs in ``base`` gives it), at
    least 64 MiB."""
    largest = 0
    try:
        for index in os.listdir(base):
            try:
                with open(os.path.join(base, index, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
            digits = text[:-1] if text[-1:].isalpha() else text
            if digits.isdigit():
                largest = max(largest, int(digits) * scale)
    except OSError:
        pass
    return max(4 * largest, MIN_CPU_FLUSH_BYTES)


class _Timer:
    method = ""

    def __init__(self, flush: bool = True):
        self.flush_enabled = flush
        self._buffer = None

    def flush(self) -> None:
        if self.flush_enabled:
            self._buffer.fill_(1.0)  # a write: evicts everything, including dirty lines

    def measure(self, fn: Callable[[], object], warmup: int = 10, iterations: int = 100,
                time_limit: Optional[float] = None, progress=None) -> Timing:
        """Call ``fn`` ``warmup`` times, then time ``iterations`` calls.

        With ``time_limit`` (seconds, warm-up included), warm-up stops after a fifth of
        it (one call at least) and sampling once it is spent (``MIN_SAMPLES`` at least).
        ``progress`` (a :class:`~convbench.base.progress.Progress`) advances per call.
        """
        self._check_stream()
        start = time.perf_counter()
        warmed = self._warm(fn, warmup, time_limit, progress, start)
        self._synchronize()
        marks, limited = self._sample(fn, iterations, time_limit, progress, start, self._record)
        self._synchronize()
        return Timing([self._elapsed_ms(m) for m in marks], warmed, self.method, limited)

    # The protocol, for the CPU: a wall-clock sample per call, read at once.  The GPU
    # timers record a pair of CUDA events per call and read them after the last one.
    def _check_stream(self) -> None:
        pass

    def _synchronize(self) -> None:
        pass

    @staticmethod
    def _record(fn):
        """Call ``fn``; what :meth:`_elapsed_ms` reads its time from."""
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) * 1e-6

    @staticmethod
    def _elapsed_ms(mark) -> float:
        return mark

    def _warm(self, fn, warmup, time_limit, progress, start):
        done = 0
        for done in range(1, warmup + 1):
            self.flush()
            fn()
            if progress is not None:
                progress.update()
            if time_limit is not None and time.perf_counter() - start > time_limit / 5:
                break
        return done

    def _sample(self, fn, iterations, time_limit, progress, start, timed_call):
        """``timed_call(fn)`` per sample after a flush, until ``iterations`` samples or
        the time limit (``MIN_SAMPLES`` at least); returns (samples, limited)."""
        samples = []
        for _ in range(iterations):
            self.flush()
            samples.append(timed_call(fn))
            if progress is not None:
                progress.update()
            if (time_limit is not None and MIN_SAMPLES <= len(samples) < iterations
                    and time.perf_counter() - start > time_limit):
                return samples, True
        return samples, False


class CpuTimer(_Timer):
    method = "perf_counter_ns around each call, cache flushed before each"

    def __init__(self, flush: bool = True):
        super().__init__(flush)
        if flush:
            import torch
            self.flush_bytes = cpu_flush_bytes()
            self._buffer = torch.empty(self.flush_bytes // 4, dtype=torch.float32)
        else:
            self.flush_bytes = 0

    def once(self, fn) -> float:
        """One call after a flush; its time in milliseconds."""
        self.flush()
        return self._record(fn)

    def interleaved(self, calls: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, list]:
        """``rounds`` rounds in which every call of ``calls`` runs once (flushed before
        each), so that slow drifts of the machine (clock, other load) hit all of them
        alike; the samples per name, in milliseconds."""
        samples = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                samples[name].append(self.once(fn))
        return samples


class CudaEventTimer(_Timer):
    method = ("CUDA events on the default stream around each call, L2 flushed before each "
              "(256 MiB write)")

    def __init__(self, flush: bool = True):
        super().__init__(flush)
        import torch
        self._torch = torch
        self.flush_bytes = GPU_FLUSH_BYTES if flush else 0
        if flush:
            self._buffer = torch.empty(GPU_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def _check_stream(self) -> None:
        cuda = self._torch.cuda
        if cuda.current_stream() != cuda.default_stream():
            raise RuntimeError("CUDA timing needs torch's current stream to be the default "
                               "stream, where DaCe's GPU builds launch")

    def _synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def _record(self, fn):
        cuda = self._torch.cuda
        stream = cuda.current_stream()
        begin, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        begin.record(stream)
        fn()
        end.record(stream)
        return begin, end

    def _elapsed_ms(self, pair) -> float:
        return pair[0].elapsed_time(pair[1])


class CupyEventTimer(_Timer):
    """CUDA events through CuPy on the legacy default stream (``cupy.cuda.Stream.null``),
    where DaCe's GPU builds and torch's default stream launch; the flush buffer is a CuPy
    array.  The same protocol as :class:`CudaEventTimer`, without torch on the timing path."""

    method = ("CUDA events (CuPy) on the legacy default stream around each call, L2 flushed "
              "before each (256 MiB write)")

    def __init__(self, flush: bool = True):
        super().__init__(flush)
        import cupy
        self._cupy = cupy
        self.flush_bytes = GPU_FLUSH_BYTES if flush else 0
        if flush:
            self._buffer = cupy.empty(GPU_FLUSH_BYTES // 4, dtype=cupy.float32)

    def flush(self) -> None:
        if self.flush_enabled:
            self._buffer.fill(1.0)

    def _synchronize(self) -> None:
        self._cupy.cuda.Device().synchronize()

    def _record(self, fn):
        cuda = self._cupy.cuda
        begin, end = cuda.Event(), cuda.Event()
        begin.record(cuda.Stream.null)
        fn()
        end.record(cuda.Stream.null)
        return begin, end

    def _elapsed_ms(self, pair) -> float:
        return self._cupy.cuda.get_elapsed_time(*pair)


def cupy_problem() -> Optional[str]:
    """None if CuPy can run on a GPU here, else why not."""
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        (cupy.zeros(1) + 1).get()
    except Exception as err:  # noqa: BLE001 - not importable, no device, wrong build
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None


def make_timer(device: str, flush: bool = True, events: str = "torch") -> _Timer:
    """The timer of ``device``; on the GPU, ``events`` picks CuPy's or torch's CUDA events."""
    if device != "gpu":
        return CpuTimer(flush)
    return CupyEventTimer(flush) if events == "cupy" else CudaEventTimer(flush)


def prepared_call(build, arrays: Dict[str, object], fresh: Optional[str] = None
                  ) -> Callable[[], object]:
    """A no-argument function that runs ``build`` on ``arrays``, with DaCe's argument
    conversion done once here rather than in every timed call.

    The first call goes through the checked path (it also initialises the program and,
    on a GPU, checks for launch errors); later calls use ``fast_call``.  The first call's
    wall time is kept as ``call.first_ms`` (a screen for very slow kernels, not a sample).

    With ``fresh`` (the name of the output array), every later call writes into a new
    tensor shaped and strided like ``arrays[fresh]`` and returns it, as torch's
    convolution does with its output: both sides then pay the same allocator
    (:mod:`convbench.timing.heap`).  Without it, every call writes into ``arrays``.
    """
    program = build.program
    if program is None:
        raise RuntimeError(f"build {build.spec.name} is not loaded")
    construct = getattr(program, "_construct_args", None)
    fast = getattr(program, "fast_call", None)
    if construct is None or fast is None:
        raise RuntimeError("this DaCe's compiled programs have no fast_call; the project "
                           "pins dace==1.0.2 (setup.cfg)")
    t0 = time.perf_counter_ns()
    program(**arrays)
    first_ms = (time.perf_counter_ns() - t0) * 1e-6
    if fresh is None:
        callargs, initargs = construct(dict(arrays))

        def call():
            return fast(callargs, initargs)
    else:
        callargs, initargs = construct(dict(arrays))
        slot = _pointer_slot(callargs, arrays[fresh])
        template = arrays[fresh][:0]  # shape, strides, dtype, device; not the buffer
        shape, strides = tuple(arrays[fresh].shape), tuple(arrays[fresh].stride())
        arrays = {k: v for k, v in arrays.items() if k != fresh}  # its slot is replaced

        def call():
            out = template.new_empty_strided(shape, strides)
            args = list(callargs)
            args[slot] = ctypes.c_void_p(out.data_ptr())
            fast(args, initargs)
            return out
    call.keepalive = arrays  # the arrays must outlive the converted pointers
    call.first_ms = first_ms  # the initialising call's time (caches not flushed)
    call.fresh_output = fresh is not None
    return call


def _pointer_slot(callargs, tensor) -> int:
    """The position of ``tensor``'s data pointer among DaCe's converted arguments."""
    ptr = tensor.data_ptr()
    slots = [i for i, a in enumerate(callargs)
             if isinstance(a, ctypes.c_void_p) and a.value == ptr]
    if len(slots) != 1:
        raise RuntimeError(f"the output's pointer is {len(slots)} of the program's arguments")
    return slots[0]
