"""Int8 convolution: the convention, the exact references, the kernel's builds and its check.

**The convention** (oneDNN's and fbgemm's, torch's quantized ``Conv3d``): the input is
uint8 with a scale ``sx`` and a zero point ``zx`` (``x ~ sx (xq - zx)``), the filter int8
with a scale per output channel ``sw[k]`` and no zero point, the output uint8 with
``sy``, ``zy``; the bias stays in float and is folded into the requantization.  The scales
are calibrated on the layer's data (:func:`make_case`: the ranges of the input, of each
output channel's filter, and of the float output of the quantized operands).

**The check is exact where the arithmetic is** (:func:`check_outputs`):

* the int32 sums (the kernel's ``OUT=0``) against the exact ones, bit for bit.  The exact
  sums are float64 convolutions of the integers ``xq - zx`` and ``wq``: every product and
  partial sum is an integer far below 2^53, so float64 adds them without rounding, in any
  order;
* the requantized uint8 output (``OUT=1``) against ``round(acc m + bq) + zy`` computed in
  float64: equal, except where the float64 value lies within the float32 arithmetic's
  error of a rounding boundary (a tie), where either neighbour passes.  A wrong output
  zero point moves every value and fails, as a tolerance of one unit would not see;
* against torch's quantized ``Conv3d`` (engine x86), within one unit (torch rounds its
  own way).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from convbench.build.precision import INT8
from convbench.registry import Implementation, Layout, Param, Pass, stored_shape
from convkernels.cpu.direct import int8_dot
from convkernels.cpu.direct.blocking import auto_switch, cpu_schedule, switch_param
from convkernels.cpu.isa import fit_pixels

#: Plants a test can ask for (:func:`run_kernel`): ``zero-point`` gives the kernel the
#: input's zero point plus one, ``output-zero-point`` the output's plus one, ``scale-channel``
#: each channel's requantization scale and bias on the next channel, ``tap`` builds the
#: kernel with ``PLANT=1`` (its last row of taps dropped).
PLANTS = ("zero-point", "output-zero-point", "scale-channel", "tap")


def _isa(value: int) -> Optional[str]:
    return None if value in (0, *int8_dot.ISAS) else "0 (the best the CPU has), 1, 2 or 3"


KERNEL = Implementation(
    name="directConvNDHWCint8", layout=Layout.NDHWC, pass_=Pass.FWD,
    summary="int8 direct convolution on NDHWC for the CPU: u8 x s8 quads per instruction "
            "(vpdpbusd), int32 sums, requantized to uint8 with the bias folded in",
    algorithm=int8_dot.algorithm, schedules={"cpu": cpu_schedule},
    params=(Param("PIX", fit_pixels(8, 2), "output pixels per micro-tile"),
            Param("WB", 16, "at most this many of them along the width"),
            Param("NV", 2, "vectors of output channels per micro-tile (a divisor of K / lanes)"),
            Param("KOUTER", 2, "1 the channel blocks outermost in the tile map, 0 innermost, "
                               "2 outermost where the packed filter passes 512 KiB",
                  minimum=0, check=auto_switch),
            Param("ISA", 0, "1 AVX512-VNNI, 2 AVX-VNNI, 3 AVX2 (exact products in 16 bits); "
                            "0 the first the CPU has", minimum=0, check=_isa),
            switch_param("OUT", 1, "1 the requantized uint8 output, 0 the int32 sums"),
            switch_param("PLANT", 0, "tests only: 1 drops the last row of taps")),
    supports=int8_dot.supports,
    constraints="no groups or dilation; K a multiple of the vector's int32 lanes",
    precisions=(INT8.label,))


def _winograd_kernel():
    from convkernels.cpu.winograd import int8 as wq
    return Implementation(
        name="winogradF2int8", layout=Layout.NDHWC, pass_=Pass.FWD,
        summary="exact int8 Winograd F(2^3, 3^3) on NDHWC for the CPU: integer transforms "
                "(2G for G), 16-bit products of channel pairs per instruction (vpdpwssd) "
                "into int32 sums equal to the direct convolution's, requantized to uint8",
        algorithm=wq.program, schedules={"cpu": cpu_schedule}, params=wq.params(),
        supports=wq.supports,
        constraints="3 x 3 x 3 filters at stride 1, C even, K a multiple of the vector's "
                    "int32 lanes, no groups or dilation",
        precisions=(INT8.label,))


#: The exact int8 Winograd forward (:mod:`convkernels.cpu.winograd.int8`).
WINOGRAD_KERNEL = _winograd_kernel()
#: The int8 CPU kernels by the name ``--kernel`` gives.
KERNELS = {"direct": KERNEL, "winograd": WINOGRAD_KERNEL}


def _gpu_kernel():
    from convkernels.gpu.mma import program as mma
    return Implementation(**mma.fields(
        name="implicitGemmIMMA", pass_=Pass.FWD,
        summary="implicit GEMM on NDHWC on int8 tensor cores: the mma.sync kernels' "
                "stages, swizzle and ldmatrix fragments on bytes, mma.sync m16n8k32 with "
                "int32 sums (CPU: ldmatrix and the MMA emulated lane by lane)",
        algorithm=mma.int8_program, schedules={t: mma.schedule(t) for t in ("cpu", "gpu")},
        supports=mma.int8_supports,
        constraints="C a multiple of 4; one image of the input below 2^31 elements") | {
        "precisions": (INT8.label,)})


#: The int8 tensor-core forward (GPU; its CPU schedule emulates the MMAs): symmetric int8
#: input and filter, int32 sums out.
GPU_KERNEL = _gpu_kernel()


@dataclasses.dataclass
class Case:
    """One layer's quantized operands (logical NCDHW, on the CPU) and their parameters."""

    layer: object
    xq: object      # uint8 input
    wq: object      # int8 filter
    bias: object    # float64, per output channel
    sx: float
    zx: int
    sw: object      # float64, per output channel
    sy: float
    zy: int

    def multipliers(self):
        """``(m, bq)`` in float64: ``y = acc m[k] + bq[k]`` before rounding and ``zy``."""
        return self.sx * self.sw / self.sy, self.bias / self.sy


def _affine(lo: float, hi: float):
    """The uint8 scale and zero point of the range ``[lo, hi]`` (widened to hold 0)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255 or 1.0
    return scale, int(min(255, max(0, round(-lo / scale))))


def make_case(layer, seed: int = 0) -> Case:
    """Random operands for ``layer``, quantized: the input uniform on [-1, 2) (so its zero
    point is not 0), each output channel's filter uniform on its own range, a small bias;
    the scales calibrated on them (the output's on the float output of the quantized
    operands, as a calibration pass over the layer's data would give it)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    rand = lambda shape: torch.rand(shape, generator=gen, dtype=torch.float64)
    K = layer.out_channels
    x = rand(layer.input_shape) * 3 - 1
    w = (rand(layer.filter_shape) * 2 - 1) * (0.5 + rand((K, 1, 1, 1, 1)))
    bias = (rand((K,)) * 2 - 1) * 0.5
    sx, zx = _affine(float(x.min()), float(x.max()))
    xq = torch.clamp(torch.round(x / sx) + zx, 0, 255).to(torch.uint8)
    sw = w.abs().amax(dim=(1, 2, 3, 4)).clamp_min(1e-12) / 127
    wq = torch.clamp(torch.round(w / sw.view(-1, 1, 1, 1, 1)), -127, 127).to(torch.int8)
    case = Case(layer, xq, wq, bias, sx, zx, sw, 1.0, 0)
    y = exact_sums(case).double() * (sx * sw).view(1, -1, 1, 1, 1) + bias.view(1, -1, 1, 1, 1)
    case.sy, case.zy = _affine(float(y.min()), float(y.max()))
    return case


def _conv64(layer, x, w):
    from convbench.check.references import torch_pass
    return torch_pass(layer, Pass.FWD, {"x": x, "w": w})


def exact_conv(layer, x, w):
    """The exact sums of a convolution of integers ``x`` and ``w`` (any tensors holding
    integers), as int64: float64 sums of integers below 2^53 are exact in any order.
    A ValueError where they leave int32 (what the kernels sum in)."""
    import torch
    s = _conv64(layer, x.double(), w.double())
    if float(s.abs().max()) >= 2.0 ** 31:
        raise ValueError(f"{layer.name}: the sums overflow int32")
    return torch.round(s).to(torch.int64)


def exact_sums(case: Case):
    """The exact int32 sums ``sum (xq - zx) wq`` (int64 tensor, logical NCDHW)."""
    return exact_conv(case.layer, case.xq.double() - case.zx, case.wq)


#: The float32 roundings between the exact sums and the kernel's value before it rounds
#: to an integer (the multiplier's and the bias term's, the sum's conversion, the fused
#: multiply-add's), with a factor of two to spare: half-integers within this relative
#: distance are ties.
TIE_ROUNDOFFS = 8 * 2.0 ** -24


def requantized(case: Case, sums):
    """``(f, slack)``: the requantized value before rounding, in float64 (logical NCDHW),
    and how far from it the kernel's float32 value can lie."""
    m, bq = case.multipliers()
    view = lambda t: t.view(1, -1, 1, 1, 1)
    f = sums.double() * view(m) + view(bq)
    return f, TIE_ROUNDOFFS * (sums.double().abs() * view(m) + view(bq.abs())) + 1e-12


def u8_violations(out, f, slack, zy: int) -> int:
    """How many uint8 outputs are neither ``round(f) + zy`` (half to even, clamped) nor,
    where ``f`` lies within ``slack`` of a half-integer, its other neighbour."""
    import torch
    clamp = lambda t: torch.clamp(t + zy, 0, 255)
    near, lo, hi = clamp(torch.round(f)), clamp(torch.floor(f)), clamp(torch.ceil(f))
    tie = (f - torch.floor(f) - 0.5).abs() <= slack
    o = out.double()
    ok = (o == near) | (tie & ((o == lo) | (o == hi)))
    return int((~ok).sum())


def pack_filter(case: Case, params):
    """``(wpk, wsum)``: the filter packed as the kernel with ``params`` reads it
    (:func:`convkernels.cpu.direct.int8_dot.packed_shape`: quads of the ``KW x C`` run,
    zero past it, ``CW`` channels' quads side by side) and each channel's sum (int32)."""
    import torch
    import torch.nn.functional as F
    L = case.layer
    blocks, KD, KH, Q, cw, _ = int8_dot.packed_shape(L, params)
    run = case.wq.permute(0, 2, 3, 4, 1).reshape(L.out_channels, KD, KH, -1)
    run = F.pad(run, (0, 4 * Q - run.shape[-1]))  # int8: padded with zeros
    wpk = run.reshape(blocks, cw, KD, KH, Q, 4).permute(0, 2, 3, 4, 1, 5).contiguous()
    wsum = case.wq.to(torch.int32).sum(dim=(1, 2, 3, 4), dtype=torch.int32)
    return wpk, wsum


def kernel_arrays(case: Case, out: int, plant: str = "", params=None, kernel=KERNEL):
    """``kernel``'s arguments (NDHWC, the filter packed for ``params``), with a plant of
    :data:`PLANTS` applied."""
    import torch
    m, bq = case.multipliers()
    zx = case.zx + (plant == "zero-point")
    zy = case.zy + (plant == "output-zero-point")
    qs = torch.stack([m, bq]).float()
    if plant == "scale-channel":
        qs = torch.roll(qs, 1, dims=1)
    L = case.layer
    y_shape = stored_shape(Layout.NDHWC, "y", L.output_shape)
    resolved = kernel.resolve_params(dict(params or {}, OUT=out))
    if kernel is WINOGRAD_KERNEL:
        from convkernels.cpu.winograd import int8 as wq
        filters = {"u": torch.from_numpy(wq.pack(L, resolved, case.wq.numpy()))}
    else:
        wpk, wsum = pack_filter(case, resolved)
        filters = {"wpk": wpk, "wsum": wsum}
    return {"x": case.xq.permute(0, 2, 3, 4, 1).contiguous(), **filters,
            "zp": torch.tensor([zx, zy], dtype=torch.int32), "qs": qs.contiguous(),
            "y": torch.empty(y_shape, dtype=torch.int32 if out == 0 else torch.uint8)}


def build(layer, params: Optional[Dict[str, int]] = None, cachedir=None, policy: str = "rebuild",
          kernel=KERNEL):
    """``kernel``'s build for ``layer`` (``params`` over its defaults), from the cache."""
    from convbench.build import cache, toolchain
    return cache.build(toolchain.make_spec(kernel, layer, INT8, "cpu", params or {}),
                       cachedir, policy=policy)


def run_kernel(case: Case, out: int, params=None, plant: str = "", cachedir=None,
               policy: str = "rebuild", kernel=KERNEL):
    """The kernel's output on ``case`` (logical NCDHW): int32 sums (``out`` 0) or uint8."""
    if plant and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r} (known: {', '.join(PLANTS)})")
    params = dict(params or {}, OUT=out, PLANT=int(plant == "tap"))
    b = build(case.layer, params, cachedir, policy, kernel)
    arrays = kernel_arrays(case, out, plant, params, kernel)
    b(**arrays)
    return arrays["y"].permute(0, 4, 1, 2, 3)


def torch_quantized(case: Case, engine: str = "x86", channels_last: bool = True):
    """A no-argument call of torch's quantized ``Conv3d`` on ``case`` (``engine``: one of
    ``torch.backends.quantized.supported_engines``) returning its uint8 output (logical
    NCDHW, as a quantized tensor)."""
    import torch
    from torch.ao.nn.quantized import Conv3d
    L = case.layer
    if tuple(L.pads) != tuple(L.pads_end):
        raise ValueError("torch's quantized Conv3d pads both sides alike")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        conv = Conv3d(L.in_channels, L.out_channels, (L.k_d, L.k_h, L.k_w), stride=L.strides,
                      padding=L.pads, dilation=L.dilations, groups=L.groups, bias=True)
        qw = torch._make_per_channel_quantized_tensor(
            case.wq, case.sw.double(), torch.zeros(L.out_channels, dtype=torch.int64), 0)
        conv.set_weight_bias(qw, case.bias.float())
        conv.scale, conv.zero_point = float(case.sy), int(case.zy)
    finally:
        torch.backends.quantized.engine = previous
    qx = torch._make_per_tensor_quantized_tensor(case.xq, case.sx, case.zx)
    if channels_last:
        qx = qx.contiguous(memory_format=torch.channels_last_3d)

    def call():
        torch.backends.quantized.engine = engine
        return conv(qx)
    call.engine = engine
    return call


def check_outputs(case: Case, sums_out, u8_out, torch_u8=None) -> Dict[str, object]:
    """The checks of the module docstring on the kernel's int32 and uint8 outputs (and
    torch's uint8 output, where given): counts, and ``ok``."""
    sums = exact_sums(case)
    f, slack = requantized(case, sums)
    row = {"int32_mismatches": int((sums_out.to(sums.dtype) != sums).sum()),
           "uint8_violations": u8_violations(u8_out, f, slack, case.zy),
           "elements": sums.numel()}
    ok = row["int32_mismatches"] == 0 and row["uint8_violations"] == 0
    if torch_u8 is not None:
        diff = (u8_out.to(torch_u8.dtype).int() - torch_u8.int()).abs()
        row["torch_max_diff"] = int(diff.max())
        row["torch_off_by_one"] = int((diff == 1).sum())
        ok = ok and row["torch_max_diff"] <= 1
    row["ok"] = ok
    return row


def verify(layer, params=None, seed: int = 0, plant: str = "", torch_engine: str = "x86",
           cachedir=None, policy: str = "rebuild", kernel=KERNEL) -> Dict[str, object]:
    """Build and run the kernel's two outputs on a fresh case and check them
    (:func:`check_outputs`; torch's quantized ``Conv3d`` where it takes the layer)."""
    case = make_case(layer, seed)
    sums = run_kernel(case, 0, params, plant, cachedir, policy, kernel)
    u8 = run_kernel(case, 1, params, plant, cachedir, policy, kernel)
    ref = None
    if torch_engine and tuple(layer.pads) == tuple(layer.pads_end):
        ref = torch_quantized(case, torch_engine)().int_repr()
    return check_outputs(case, sums, u8, ref)


def describe_build(overrides=None, kernel=KERNEL) -> Dict[str, object]:
    """``kernel``'s parameters and the instructions they pick on this CPU (metadata)."""
    params = kernel.resolve_params(overrides or {})
    isa = int8_dot.isa_of(params)
    name, flag, width = int8_dot.ISAS[isa] if isa else ("none", "", 0)
    return {"implementation": kernel.name, "params": dict(params), "isa": name,
            "cpu_flag": flag, "int32_lanes": width}


# -- the int8 tensor-core forward (GPU), checked in its CPU emulation -------------------------

def symmetric_operands(layer, seed: int = 0):
    """Random int8 input and filter (logical NCDHW, symmetric: the GPU kernel's convention,
    whose zero-filled border is then exact) over the whole range."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, layer.input_shape, generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, layer.filter_shape, generator=gen, dtype=torch.int8)
    return x, w


def verify_gpu(layer, params=None, seed: int = 0, target: str = "cpu", cachedir=None,
               policy: str = "rebuild", planted: str = "") -> Dict[str, object]:
    """:data:`GPU_KERNEL`'s int32 sums on random int8 operands against the exact ones, bit
    for bit: on the CPU its emulation (ldmatrix and every MMA lane by lane, as PTX lays out
    the fragments), on the GPU the tensor cores.  ``planted`` tags a build a test broke."""
    import torch
    from convbench.build import cache, toolchain
    x, w = symmetric_operands(layer, seed)
    spec = toolchain.make_spec(GPU_KERNEL, layer, INT8, target, params or {}, planted=planted)
    b = cache.build(spec, cachedir, policy=policy)
    device = "cuda" if target == "gpu" else "cpu"
    y = torch.zeros(stored_shape(Layout.NDHWC, "y", layer.output_shape), dtype=torch.int32,
                    device=device)
    b(x=x.permute(0, 2, 3, 4, 1).contiguous().to(device),
      w=w.permute(0, 2, 3, 4, 1).contiguous().to(device), y=y)
    exact = exact_conv(layer, x, w)
    got = y.cpu().permute(0, 4, 1, 2, 3).to(torch.int64)
    mismatches = int((got != exact).sum())
    return {"int32_mismatches": mismatches, "elements": exact.numel(), "ok": mismatches == 0}
