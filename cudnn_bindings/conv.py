"""3D convolution through cuDNN's legacy API: descriptors, algorithm choice, the
three passes, on torch's tensors, stream and CUDA context.

Ownership.  :class:`Handle` and the descriptor classes own one cuDNN object each and
release it in ``close()``, on leaving a ``with`` block, or when garbage-collected
(``weakref.finalize``), whichever comes first, exactly once.  :class:`ConvPlan` owns
the descriptors and the workspace of one convolution and is cached per shape, so
repeated calls create nothing.  ``live_objects()`` counts what is alive, for tests.

Algorithms.  ``algo="find"`` benchmarks every algorithm once with
``cudnnFind*AlgorithmEx`` on the call's own buffers (the fastest whose status is
success wins), ``"heuristic"`` takes cuDNN's first ``cudnnGet*Algorithm_v7`` choice,
and a name (``"IMPLICIT_PRECOMP_GEMM"``, ``"ALGO_1"``, case-insensitive) fixes it.
The choice happens when the plan is made, so never inside a timed region; the plan
keeps the chosen algorithm, its math type, the seconds Find took and the table.

Math.  ``"ieee"`` (the default for float32) is ``CUDNN_FMA_MATH``: IEEE FP32 on the
CUDA cores, no TF32.  ``"tf32"`` is ``CUDNN_DEFAULT_MATH`` (TF32 tensor cores allowed
on Ampere and later), ``"tensor_op"`` (the default for half) ``CUDNN_TENSOR_OP_MATH``,
and ``"tensor_op_allow_conversion"`` lets float32 be converted to half.
"""

import ctypes
import dataclasses
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

from .enums import (BwdDataAlgo, BwdFilterAlgo, ConvolutionMode, DataType, FwdAlgo, MathType,
                    Status, TensorFormat)
from .library import (BwdDataAlgoPerf, BwdFilterAlgoPerf, CudnnError, FwdAlgoPerf, Library,
                      load)

MATH = {"ieee": MathType.FMA_MATH, "tf32": MathType.DEFAULT_MATH,
        "tensor_op": MathType.TENSOR_OP_MATH,
        "tensor_op_allow_conversion": MathType.TENSOR_OP_MATH_ALLOW_CONVERSION}
PASSES = ("fwd", "bwd_data", "bwd_filter")
#: Find may use up to this much workspace (algorithms needing more are skipped).
FIND_WORKSPACE_LIMIT = 4 << 30

_LIVE: Dict[str, int] = {}
_LIVE_LOCK = threading.Lock()


def live_objects() -> Dict[str, int]:
    """How many cuDNN objects of each kind are alive (created and not yet destroyed)."""
    with _LIVE_LOCK:
        return {k: v for k, v in _LIVE.items() if v}


def _count(kind: str, delta: int) -> None:
    with _LIVE_LOCK:
        _LIVE[kind] = _LIVE.get(kind, 0) + delta


class _Owned:
    """One cuDNN object, destroyed exactly once."""

    kind = ""
    _destroy = ""

    def __init__(self, lib: Library, create: str):
        self.lib = lib
        ptr = ctypes.c_void_p()
        lib(create, ctypes.byref(ptr))
        self.ptr = ptr
        _count(self.kind, +1)
        self._finalizer = weakref.finalize(self, _release, lib, self._destroy, ptr, self.kind)

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _release(lib: Library, destroy: str, ptr: ctypes.c_void_p, kind: str) -> None:
    _count(kind, -1)
    status = getattr(lib, destroy)(ptr)
    if status != Status.SUCCESS:  # pragma: no cover - cannot be provoked on purpose
        import warnings
        warnings.warn(f"{destroy} failed: {lib.error_string(status)}", RuntimeWarning)


def _ints(values: Sequence[int]):
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


class Handle(_Owned):
    """A cuDNN handle on the current CUDA device (torch's context)."""

    kind = "handle"
    _destroy = "cudnnDestroy"

    def __init__(self, lib: Optional[Library] = None):
        lib = lib or load()
        try:
            super().__init__(lib, "cudnnCreate")
        except CudnnError as err:
            raise CudnnError(err.call, err.status, err.status_name,
                             (err.detail + "; " if err.detail else "") +
                             "cuDNN needs a usable CUDA device") from None
        self._stream = None

    def set_stream(self, stream: int) -> None:
        """Run this handle's work on ``stream`` (a ``cudaStream_t`` as an int)."""
        if stream != self._stream:
            self.lib("cudnnSetStream", self.ptr, ctypes.c_void_p(stream))
            self._stream = stream


class TensorDescriptor(_Owned):
    kind = "tensor"
    _destroy = "cudnnDestroyTensorDescriptor"

    def __init__(self, dtype: DataType, dims: Sequence[int], strides: Sequence[int],
                 lib: Optional[Library] = None):
        super().__init__(lib or load(), "cudnnCreateTensorDescriptor")
        self.dims, self.strides = tuple(dims), tuple(strides)
        self.lib("cudnnSetTensorNdDescriptor", self.ptr, int(dtype), len(dims), _ints(dims),
                 _ints(strides))


class FilterDescriptor(_Owned):
    kind = "filter"
    _destroy = "cudnnDestroyFilterDescriptor"

    def __init__(self, dtype: DataType, fmt: TensorFormat, dims: Sequence[int],
                 lib: Optional[Library] = None):
        super().__init__(lib or load(), "cudnnCreateFilterDescriptor")
        self.dims = tuple(dims)
        self.lib("cudnnSetFilterNdDescriptor", self.ptr, int(dtype), int(fmt), len(dims),
                 _ints(dims))


class ConvolutionDescriptor(_Owned):
    kind = "convolution"
    _destroy = "cudnnDestroyConvolutionDescriptor"

    def __init__(self, pad: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                 compute: DataType, math: MathType, lib: Optional[Library] = None,
                 groups: int = 1):
        super().__init__(lib or load(), "cudnnCreateConvolutionDescriptor")
        self.lib("cudnnSetConvolutionNdDescriptor", self.ptr, len(pad), _ints(pad),
                 _ints(stride), _ints(dilation), int(ConvolutionMode.CROSS_CORRELATION),
                 int(compute))
        if groups != 1:  # the filter then holds C/groups input channels
            self.lib("cudnnSetConvolutionGroupCount", self.ptr, int(groups))
        self.set_math(math)

    def set_math(self, math: MathType) -> None:
        self.lib("cudnnSetConvolutionMathType", self.ptr, int(math))
        self.math = MathType(math)


def output_dims(x: TensorDescriptor, w: FilterDescriptor, conv: ConvolutionDescriptor):
    """cuDNN's forward output shape for these descriptors (needs no GPU)."""
    out = (ctypes.c_int * len(x.dims))()
    x.lib("cudnnGetConvolutionNdForwardOutputDim", conv.ptr, x.ptr, w.ptr, len(x.dims), out)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# torch tensors -> descriptors
# ---------------------------------------------------------------------------------------------

def data_type(tdtype) -> Tuple[DataType, DataType]:
    """(data type, compute type) for a torch dtype: float16 and bfloat16 compute in float."""
    import torch
    table = {torch.float32: (DataType.FLOAT, DataType.FLOAT),
             torch.float16: (DataType.HALF, DataType.FLOAT),
             torch.bfloat16: (DataType.BFLOAT16, DataType.FLOAT),
             torch.float64: (DataType.DOUBLE, DataType.DOUBLE)}
    if tdtype not in table:
        raise TypeError(f"cuDNN bindings: unsupported dtype {tdtype} (float32, float16, "
                        "bfloat16, float64)")
    return table[tdtype]


def filter_format(w) -> TensorFormat:
    """NCHW for a contiguous KCTRS filter, NHWC for a channels-last (KTRSC) one."""
    import torch
    if w.is_contiguous():
        return TensorFormat.NCHW
    if w.dim() == 5 and w.is_contiguous(memory_format=torch.channels_last_3d):
        return TensorFormat.NHWC
    raise ValueError("cuDNN bindings: the filter must be contiguous or channels_last_3d, "
                     f"got strides {tuple(w.stride())}")


def _triple(v) -> Tuple[int, int, int]:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)
    if len(t) != 3 or any(not isinstance(i, int) for i in t):
        raise ValueError(f"expected an int or three ints, got {v!r}")
    return t


def parse_algo(pass_: str, algo) -> Optional[int]:
    """None for ``find``/``heuristic``, else the enum value of a named algorithm."""
    if isinstance(algo, str) and algo.lower() in ("find", "heuristic"):
        return None
    enum = {"fwd": FwdAlgo, "bwd_data": BwdDataAlgo, "bwd_filter": BwdFilterAlgo}[pass_]
    if isinstance(algo, int):
        return int(enum(algo))
    key = str(algo).upper()
    for name in (key, f"ALGO_{key}"):
        if name in enum.__members__ and not name.endswith("COUNT"):
            return int(enum[name])
    names = [m for m in enum.__members__ if not m.endswith("COUNT")]
    raise ValueError(f"unknown {pass_} algorithm {algo!r} (find, heuristic, or one of "
                     f"{', '.join(names)})")


def algo_name(pass_: str, value: int) -> str:
    enum = {"fwd": FwdAlgo, "bwd_data": BwdDataAlgo, "bwd_filter": BwdFilterAlgo}[pass_]
    try:
        return enum(value).name
    except ValueError:
        return str(value)


@dataclasses.dataclass
class AlgoResult:
    """One row of Find's (or the heuristic's) table."""

    algo: str
    status: str
    time_ms: float
    memory: int
    deterministic: bool
    math: str


_CALLS = {
    "fwd": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
            "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward", FwdAlgoPerf,
            FwdAlgo.COUNT),
    "bwd_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7",
                 "cudnnFindConvolutionBackwardDataAlgorithmEx",
                 "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData",
                 BwdDataAlgoPerf, BwdDataAlgo.ALGO_COUNT),
    "bwd_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                   "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                   "cudnnConvolutionBackwardFilter", BwdFilterAlgoPerf, BwdFilterAlgo.ALGO_COUNT),
}


class ConvPlan:
    """Descriptors, algorithm and workspace of one convolution pass on fixed shapes,
    strides and dtype.  ``run(x, w, y)`` computes, for the pass:

    * ``fwd``: y = conv(x, w)
    * ``bwd_data``: x = dL/dx from w and y (= dL/dy)
    * ``bwd_filter``: w = dL/dw from x and y (= dL/dy)
    """

    def __init__(self, handle: Handle, pass_: str, x, w, y, stride, padding, dilation,
                 algo="find", math: Optional[str] = None, groups: int = 1):
        if pass_ not in PASSES:
            raise ValueError(f"unknown pass {pass_!r} (one of {', '.join(PASSES)})")
        self.handle, self.lib, self.pass_ = handle, handle.lib, pass_
        dtype, compute = data_type(x.dtype)
        if math is None:
            math = "tensor_op" if dtype in (DataType.HALF, DataType.BFLOAT16) else "ieee"
        if math not in MATH:
            raise ValueError(f"unknown math {math!r} (one of {', '.join(MATH)})")
        self.math_requested = math
        self.xd = TensorDescriptor(dtype, x.shape, x.stride(), self.lib)
        self.yd = TensorDescriptor(dtype, y.shape, y.stride(), self.lib)
        self.wd = FilterDescriptor(dtype, filter_format(w), w.shape, self.lib)
        self.cd = ConvolutionDescriptor(_triple(padding), _triple(stride), _triple(dilation),
                                        compute, MATH[math], self.lib, groups)
        expected = output_dims(self.xd, self.wd, self.cd)
        if tuple(y.shape) != expected:
            raise ValueError(f"output shape {tuple(y.shape)} does not match cuDNN's {expected}")
        self.alpha, self.beta = ((ctypes.c_double(1.0), ctypes.c_double(0.0))
                                 if dtype == DataType.DOUBLE else
                                 (ctypes.c_float(1.0), ctypes.c_float(0.0)))
        self.results: List[AlgoResult] = []
        self.find_seconds = 0.0
        self.workspace = None
        self.workspace_bytes = 0
        fixed = parse_algo(pass_, algo)
        t0 = time.perf_counter()
        if fixed is not None:
            self.algo, self.method = fixed, "fixed"
        elif str(algo).lower() == "heuristic":
            self.algo, self.method = self._heuristic(), "heuristic"
        else:
            self.algo, self.method = self._find(x, w, y), "find"
        self.find_seconds = time.perf_counter() - t0
        needed = self._workspace_size(self.algo)
        if needed != self.workspace_bytes:  # keep exactly what the chosen algorithm needs
            self.workspace, self.workspace_bytes = None, 0
            self._allocate(needed, x.device)

    # -- operands in the order each pass's calls take them: two inputs, then the output ----
    _ORDER = {"fwd": ("x", "w", "y"), "bwd_data": ("w", "y", "x"), "bwd_filter": ("x", "y", "w")}

    def _descs(self):
        a, b, out = (getattr(self, f"{r}d") for r in self._ORDER[self.pass_])
        return a, b, self.cd, out

    def _operands(self, x, w, y):
        """(input descriptor, pointer) x 2, the convolution descriptor, and the output's
        descriptor and pointer, for this pass."""
        t = {"x": x, "w": w, "y": y}
        (a, pa), (b, pb), (o, po) = ((getattr(self, f"{r}d").ptr, _ptr(t[r]))
                                     for r in self._ORDER[self.pass_])
        return (a, pa, b, pb, self.cd.ptr), (o, po)

    def _workspace_size(self, algo: int) -> int:
        size = ctypes.c_size_t()
        a, b, c, d = self._descs()
        self.lib(_CALLS[self.pass_][2], self.handle.ptr, a.ptr, b.ptr, c.ptr, d.ptr, int(algo),
                 ctypes.byref(size))
        return size.value

    def _allocate(self, nbytes: int, device) -> None:
        import torch
        if nbytes > self.workspace_bytes:
            self.workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.workspace_bytes = nbytes

    def _table(self, perf, count: int) -> List[AlgoResult]:
        out = []
        for p in perf[:count]:
            try:
                status = Status(p.status).name
            except ValueError:
                status = str(p.status)
            math = MathType(p.mathType).name if p.mathType in MathType._value2member_map_ else str(
                p.mathType)
            out.append(AlgoResult(algo_name(self.pass_, p.algo), status, float(p.time),
                                  int(p.memory), bool(p.determinism), math))
        return out

    def _pick(self, perf, count: int) -> int:
        self.results = self._table(perf, count)
        for p in perf[:count]:
            if p.status == Status.SUCCESS:
                if p.mathType != self.cd.math and self.math_requested != "ieee":
                    self.cd.set_math(MathType(p.mathType))
                return int(p.algo)
        raise CudnnError(_CALLS[self.pass_][1], int(Status.NOT_SUPPORTED), "no algorithm",
                         "no algorithm supports this convolution: " +
                         ", ".join(f"{r.algo}={r.status}" for r in self.results))

    def _heuristic(self) -> int:
        get, _, _, _, perf_t, count = _CALLS[self.pass_]
        perf = (perf_t * int(count))()
        returned = ctypes.c_int()
        a, b, c, d = self._descs()
        self.lib(get, self.handle.ptr, a.ptr, b.ptr, c.ptr, d.ptr, int(count),
                 ctypes.byref(returned), perf)
        return self._pick(perf, returned.value)

    def _find(self, x, w, y) -> int:
        _, find, _, _, perf_t, count = _CALLS[self.pass_]
        sizes = []
        for algo in range(int(count)):
            try:
                sizes.append(self._workspace_size(algo))
            except CudnnError:  # that algorithm does not support this case
                continue
        self._allocate(min(max(sizes, default=0), FIND_WORKSPACE_LIMIT), x.device)
        perf = (perf_t * int(count))()
        returned = ctypes.c_int()
        h = self.handle.ptr
        ws, nbytes = self._ws()
        inputs, output = self._operands(x, w, y)
        self._set_stream()
        self.lib(find, h, *inputs, *output, int(count), ctypes.byref(returned), perf, ws, nbytes)
        return self._pick(perf, returned.value)

    def _ws(self):
        if self.workspace is None or self.workspace_bytes == 0:
            return None, 0
        return ctypes.c_void_p(self.workspace.data_ptr()), self.workspace_bytes

    def _set_stream(self) -> None:
        import torch
        self.handle.set_stream(torch.cuda.current_stream().cuda_stream)

    @property
    def algo_name(self) -> str:
        return algo_name(self.pass_, self.algo)

    def info(self) -> Dict[str, object]:
        """What was chosen and how, for reports."""
        return {"pass": self.pass_, "algo": self.algo_name, "method": self.method,
                "math": self.cd.math.name, "find_ms": round(self.find_seconds * 1e3, 3),
                "workspace_bytes": self.workspace_bytes,
                "table": [dataclasses.asdict(r) for r in self.results]}

    def run(self, x, w, y) -> None:
        """Compute this pass on torch CUDA tensors of the planned shapes and strides, on
        torch's current stream."""
        self._set_stream()
        ws, nbytes = self._ws()
        call = _CALLS[self.pass_][3]
        inputs, output = self._operands(x, w, y)
        self.lib(call, self.handle.ptr, ctypes.byref(self.alpha), *inputs, self.algo, ws, nbytes,
                 ctypes.byref(self.beta), *output)

    def close(self) -> None:
        for d in (self.xd, self.yd, self.wd, self.cd):
            d.close()
        self.workspace = None


def _ptr(t) -> ctypes.c_void_p:
    if not t.is_cuda:
        raise ValueError("cuDNN bindings: tensors must be on a CUDA device")
    return ctypes.c_void_p(t.data_ptr())


# ---------------------------------------------------------------------------------------------
# The Pythonic layer: cached handles and plans
# ---------------------------------------------------------------------------------------------

_STATE = threading.local()


def handle() -> Handle:
    """This thread's handle for the current CUDA device (created on first use)."""
    import torch
    handles = getattr(_STATE, "handles", None)
    if handles is None:
        handles = _STATE.handles = {}
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    if device not in handles:
        handles[device] = Handle()
    return handles[device]


_PLANS: Dict[tuple, ConvPlan] = {}


def plan(pass_: str, x, w, y, stride=1, padding=0, dilation=1, algo="find",
         math: Optional[str] = None, groups: int = 1) -> ConvPlan:
    """The cached plan for these tensors' shapes, strides, dtype and device (``groups``:
    grouped convolution, ``w`` holding ``C / groups`` input channels)."""
    key = (pass_, tuple(x.shape), tuple(x.stride()), tuple(w.shape), tuple(w.stride()),
           tuple(y.shape), tuple(y.stride()), x.dtype, x.device, _triple(stride),
           _triple(padding), _triple(dilation), str(algo).lower(), math, groups)
    if key not in _PLANS:
        _PLANS[key] = ConvPlan(handle(), pass_, x, w, y, stride, padding, dilation, algo, math,
                               groups)
    return _PLANS[key]


def clear_plans() -> None:
    """Release every cached plan (their descriptors and workspaces)."""
    for p in _PLANS.values():
        p.close()
    _PLANS.clear()


def _out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _like(t, shape):
    """An empty tensor of ``shape`` in ``t``'s dtype, device and memory format
    (channels_last_3d if ``t`` is, else contiguous)."""
    import torch
    fmt = (torch.channels_last_3d if not t.is_contiguous() and
           t.is_contiguous(memory_format=torch.channels_last_3d) else torch.contiguous_format)
    return torch.empty(tuple(shape), dtype=t.dtype, device=t.device, memory_format=fmt)


def conv3d_forward(x, w, stride=1, padding=0, dilation=1, algo="find", math=None, out=None,
                   groups=1):
    """``y = conv3d(x, w)`` (cross-correlation, like torch) on CUDA tensors, NCDHW or
    channels_last_3d.  Returns ``y`` (``out`` if given) in ``x``'s memory format."""
    s, p, d = _triple(stride), _triple(padding), _triple(dilation)
    if out is None:
        out = _like(x, (x.shape[0], w.shape[0]) + tuple(
            _out_size(x.shape[2 + i], w.shape[2 + i], s[i], p[i], d[i]) for i in range(3)))
    plan("fwd", x, w, out, s, p, d, algo, math, groups).run(x, w, out)
    return out


def conv3d_backward_data(dy, w, input_shape, stride=1, padding=0, dilation=1, algo="find",
                         math=None, out=None, groups=1):
    """dL/dx for ``y = conv3d(x, w)`` given ``dy`` = dL/dy; ``out`` takes ``dy``'s format."""
    out = _like(dy, input_shape) if out is None else out
    plan("bwd_data", out, w, dy, stride, padding, dilation, algo, math, groups).run(out, w, dy)
    return out


def conv3d_backward_filter(x, dy, filter_shape, stride=1, padding=0, dilation=1, algo="find",
                           math=None, out=None, groups=1):
    """dL/dw for ``y = conv3d(x, w)`` given ``x`` and ``dy``; ``out`` takes ``x``'s format."""
    out = _like(x, filter_shape) if out is None else out
    plan("bwd_filter", x, out, dy, stride, padding, dilation, algo, math,
         groups).run(x, out, dy)
    return out
