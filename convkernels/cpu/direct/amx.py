"""The bfloat16 convolutions on AMX tiles (``tdpbf16ps``) for the CPU, on NDHWC: the
forward (``directConvNDHWCamx``), the data gradient (``directConvNDHWCamxBwdData``: the
forward kernel on the transposed layer, :mod:`convkernels.transposed`, its filter packed
flipped) and the filter gradient (``directConvNDHWCamxBwdFilter``).

**The instruction.**  ``tdpbf16ps`` multiplies a tile of 16 x 32 bfloat16 values (A) by one
of 32 x 16 (B, stored as 16 rows of 16 pairs) into 16 x 16 float32 sums (C): 16,384
products per instruction, against 32 for ``vdpbf16ps``.  The kernels keep a 2 x 2 block
of C tiles with two A and two B tiles, the 8 tile registers
(``include/amx_bf16.h``, whose comment gives the layouts).

**The forward** is an implicit GEMM over the output plane laid on the padded width (the
header's ``q`` grid): rows are 32 positions ``q`` of one output plane, columns 32 output
channels, the reduction the taps times the input channels in chunks of 32; an A tile is 16
consecutive positions of the zero-padded input (``xp``, one copy per call) loaded with one
stride, a B tile 16 output channels x 32 input channels of one tap from the filter packed
once per call.  **The filter gradient** sums over positions: rows 32 output channels of
dL/dy, transposed per plane (``dyt``), columns 32 input channels, and the B tiles pairs of
consecutive padded input pixels (``xpairs``, both alignments, since a tap's offset may be
odd).

**Where it runs.**  The CPU needs AMX-TILE and AMX-BF16 (``amx_tile``, ``amx_bf16`` in
``/proc/cpuinfo``: Intel Xeons since Sapphire Rapids); elsewhere the kernels are refused
with the reason, and the ``vdpbf16ps`` kernels (``directConvNDHWCblocked`` with ``DOT``)
or the widening ones serve bfloat16.  ``EMULATE=1`` builds the same code with the tile
instructions computed in C++ as the Intel SDM defines them, on any CPU, slowly: the
tests verify the layouts, the packing and the loops that way where no AMX is at hand.
The layers: stride 1, groups 1, dilation 1, input and output channels multiples of 32.

**Rounding.**  The products of bfloat16 values are exact in float32 and the sums are
float32, as in the widening kernels; the store rounds to nearest even.  (The hardware
treats subnormal inputs as zero, which the emulation does not.)

**Plants** (``PLANT``, tests only): 1 drops the forward's last tap (the filter gradient's
last block of positions); 2 swaps the halves of every pair in the packed filter (the
filter gradient's paired input).
"""

from typing import NamedTuple

from convkernels.cpu.calls import call_map, finish, include, layer_sdfg
from convkernels.cpu.direct.blocking import cpu_schedule
from convkernels.cpu.isa import has_feature
from convkernels.cpu.rules import AMX
from convkernels.layer import layer_constants
from convkernels.layouts import Layout
from convkernels.transposed import supports as transposable, swap_roles, transposed_layer

#: The CPU flags the hardware kernels need.
FEATURES = ("amx_tile", "amx_bf16")
#: Products (multiply-adds) above which an emulated build is refused (minutes of C++).
EMULATED_MACS = 2 * 10 ** 8
#: The instruction the main loop's mix counts.
PRODUCT = "tdpbf16ps"


def refusal(layer, params, computed=None) -> str:
    """Why the kernels do not build ``layer`` ("" where they do); ``computed``: the layer
    the kernel computes (the transposed one for the data gradient), default ``layer``."""
    t = computed or layer
    if t.stride != 1 or any(s != 1 for s in t.strides):
        return "stride 1 only (the positions of a plane are one stride apart)"
    if t.in_channels % 32 or t.out_channels % 32:
        return (f"{t.in_channels} channels in and {t.out_channels} out: both must be "
                "multiples of 32 (a tile's reduction chunk and its block of columns)")
    if params["EMULATE"]:
        macs = layer.flops() // 2
        if macs > EMULATED_MACS:
            return f"EMULATE=1 computes each tile in C++: {macs:.2g} products is too many"
        return ""
    missing = [f for f in FEATURES if not has_feature(f)]
    if missing:
        return (f"this CPU has no {' and no '.join(missing)} (AMX; EMULATE=1 computes the "
                "tiles in C++ instead, for tests)")
    return ""


def supports(layer, params):
    return refusal(layer, params) or None


def supports_data_gradient(layer, params):
    return transposable(layer, params) or refusal(layer, params, transposed_layer(layer)) or None


def check_params(values):
    if values["EMULATE"] not in (0, 1):
        return "EMULATE must be 0 or 1"
    return None if values["PLANT"] in (0, 1, 2) else "PLANT must be 0, 1 or 2"


class Grid(NamedTuple):
    """The output plane on the padded width (``include/amx_bf16.h``'s comment), in one
    place for the C++ (its prelude) and the buffers' sizes: the padded extents, a padded
    plane's pixels, the blocks of 32 positions ``q`` per plane and their positions, the
    largest tap offset, the pixels the last block reads past the last plane, and the
    pairs per plane of the filter gradient's input."""

    DP: int
    HP: int
    WP: int
    PL: int
    QB: int
    QP: int
    OFF: int
    SLACK: int
    SP: int


def grid(L) -> Grid:
    dp, hp, wp = L.OD + L.KD - 1, L.OH + L.KH - 1, L.OW + L.KW - 1
    qb = -(-L.OH * wp // 32)
    off = (L.KH - 1) * wp + L.KW - 1
    return Grid(dp, hp, wp, hp * wp, qb, 32 * qb, off, 32 + L.KW, (32 * qb + off) // 2 + 1)


def global_code(L, params, flip=False) -> str:
    """The prelude of constants for layer constants ``L`` (and its :func:`grid`), then
    ``include/amx_bf16.h``."""
    longs = dict(AX_N=L.N, AX_C=L.C, AX_K=L.K, AX_D=L.D, AX_H=L.H, AX_W=L.W, AX_KD=L.KD,
                 AX_KH=L.KH, AX_KW=L.KW, AX_PD=L.PD, AX_PH=L.PH, AX_PW=L.PW, AX_OD=L.OD,
                 AX_OH=L.OH, AX_OW=L.OW, **{f"AX_{k}": v for k, v in grid(L)._asdict().items()})
    switches = dict(AX_FLIP=int(flip), AX_EMULATE=params["EMULATE"], AX_PLANT=params["PLANT"])
    return "\n".join([f"#define {k} {v}" for k, v in switches.items()]
                     + [f"static constexpr long {k} = {v};" for k, v in longs.items()]
                     + [include(__file__, "amx_bf16.h")])


def _tag(params):
    return f"e{params['EMULATE']}_p{params['PLANT']}"


def _calls(state, label, ranges, inputs, outputs, function):
    """A parallel map over ``ranges`` whose body is ``function(inputs..., outputs...,
    indices...)``, the bfloat16 arrays passed as ``uint16_t`` pointers."""
    args = ([f"reinterpret_cast<const uint16_t*>({c})" for c in inputs]
            + [f"reinterpret_cast<uint16_t*>({c})" for c in outputs] + list(ranges))
    call_map(state, label, ranges, inputs, f"{function}({', '.join(args)});", outputs)


def _forward_sdfg(name, layer, L, dtype, params, flip=False, w_shape=None):
    """Pack the filter and pad the input (one parallel map each), then the items: per
    sample, output plane, block of 32 positions and block of 32 output channels."""
    g = grid(L)
    sdfg = layer_sdfg(name, layer, L, w_shape, dtype.dace)
    sdfg.add_array("wpk", (L.K * L.KD * L.KH * L.KW * L.C,), dtype.dace, transient=True)
    sdfg.add_array("xp", ((L.N * g.DP * g.PL + g.SLACK) * L.C,), dtype.dace, transient=True)
    state = sdfg.add_state("pack", is_start_block=True)
    _calls(state, "filter_tiles", {"k16": f"0:{L.K // 16}"}, {"win": "w"}, {"wout": "wpk"},
           "ax_pack_filter")
    pad = sdfg.add_state_after(state, "pad")
    _calls(pad, "input_planes", {"b": f"0:{L.N}", "dp": f"0:{g.DP}"}, {"xin": "x"},
           {"xout": "xp"}, "ax_pad_plane")
    items = sdfg.add_state_after(pad, "items")
    _calls(items, "tile_blocks", {"b": f"0:{L.N}", "od": f"0:{L.OD}", "qb": f"0:{g.QB}",
                                  "kb": f"0:{L.K // 32}"},
           {"xin": "xp", "win": "wpk"}, {"yout": "y"}, "ax_forward")
    return finish(sdfg, global_code(L, params, flip), dtype.dace)


def forward(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    return _forward_sdfg(f"amx_fwd_{layer.key()}_{_tag(params)}", layer, L, dtype, params)


def data_gradient(layer, dtype, params):
    """The forward kernel on the transposed layer (its filter the original one, packed
    flipped), with the roles of x and y swapped for the harness."""
    t = transposed_layer(layer)
    L = layer_constants(t, Layout.NDHWC)
    return swap_roles(_forward_sdfg(f"amx_bwdd_{t.key()}_{_tag(params)}", t, L, dtype, params,
                                    flip=True, w_shape=(L.C, L.KD, L.KH, L.KW, L.K)))


def filter_gradient(layer, dtype, params):
    """Transpose dL/dy per plane and pair the input per plane (a parallel map each), then
    the items: per tap, block of 32 output channels and block of 32 input channels."""
    L = layer_constants(layer, Layout.NDHWC)
    g = grid(L)
    sdfg = layer_sdfg(f"amx_bwdf_{layer.key()}_{_tag(params)}", layer, L, dtype=dtype.dace)
    sdfg.add_array("dyt", (L.N * L.OD * L.K * g.QP,), dtype.dace, transient=True)
    sdfg.add_array("xpairs", (2 * L.N * g.DP * g.SP * L.C * 2,), dtype.dace, transient=True)
    state = sdfg.add_state("operands", is_start_block=True)
    _calls(state, "dy_planes", {"b": f"0:{L.N}", "od": f"0:{L.OD}"}, {"yin": "y"},
           {"tout": "dyt"}, "ax_transpose_dy")
    pairs = sdfg.add_state_after(state, "pairs")
    _calls(pairs, "input_planes", {"b": f"0:{L.N}", "dp": f"0:{g.DP}"}, {"xin": "x"},
           {"pout": "xpairs"}, "ax_pair_input")
    items = sdfg.add_state_after(pairs, "items")
    _calls(items, "tile_blocks", {"t": f"0:{L.KD * L.KH * L.KW}", "kb": f"0:{L.K // 32}",
                                  "cb": f"0:{L.C // 32}"},
           {"tin": "dyt", "pin": "xpairs"}, {"wout": "w"}, "ax_filter_gradient")
    return finish(sdfg, global_code(L, params), dtype.dace)


def params():
    from convkernels.declarations import Param
    return (
        Param("EMULATE", 0, "1: the tile instructions computed in C++ (any CPU, slowly: "
                            "tests); 0: AMX itself", minimum=0),
        Param("PLANT", 0, "tests only: 1 drops the forward's last tap (the filter "
                          "gradient's last block of positions), 2 swaps the halves of "
                          "every bfloat16 pair", minimum=0),
    )


def registration(pass_, algorithm, supports_=supports):
    """What the three registrations share (``impls/direct_conv_ndhwc_amx*.py``): the
    fields of :class:`convbench.registry.Implementation` but the name and the summary."""
    return dict(layout=Layout.NDHWC, pass_=pass_, algorithm=algorithm,
                schedules={"cpu": cpu_schedule}, params=params(), supports=supports_,
                constraints="stride 1, channels in and out multiples of 32; a CPU with "
                            "AMX-BF16 (or EMULATE=1)",
                check_params=check_params, anisotropic_pad=True, precisions=("bfloat16",),
                wins=(AMX,))
