"""``directConvNDHWCfew``: the CPU forward convolution for few input channels (CosmoFlow's
conv1: 4 in, 32 out), on NDHWC.

**Why a kernel of its own.**  With ``C`` input channels the reduction of one output pixel
is ``KD x KH x KW x C`` products (108 for conv1) and the output is ``C x 27`` times larger
than the input it is made from: such a layer is a stream of stores behind a short
reduction.  The register-blocked kernel (:mod:`convkernels.cpu.direct.forward`) spends
its time there around the arithmetic (measured on the Zen 4 EPYC, conv1 at 64^3 batch 2:
69-73% of the FMA peak, torch 82-83%): its tile is a DaCe nested function called per
8-pixel tile with a pointer per operand, its four-channel reduction loops run four
iterations each, and every output line goes through the cache on its way to memory.

**The kernel** (C++ in ``include/few_channels.h``; see its comment): one call per output
row and block of ``NV x VL`` output channels.  The row is cut into blocks of ``PB`` pixels,
each an accumulator tile of ``PB x NV`` vectors held in registers through the whole
reduction.  For one ``(kd, kh)`` the ``KW x C`` input values of a pixel lie one after the
other in memory, so that part of the reduction is written out at compile time (12
broadcast steps for conv1, each ``NV`` filter loads and ``PB x NV`` FMAs); with AVX-512
each input value is broadcast inside its FMA (``{1to16}``), so the tile can take 28 of the
32 registers (14 pixels x 2 vectors) without the compiler hoisting broadcasts into the
registers the accumulators need.  Blocks at the width border skip exactly the taps that
would read it; the depth and height borders skip whole rows of taps.  The filter is packed
once per call into ``wp[K / CW, KD, KH, KW, C, CW]``.

**Stores** (``STREAM``): 1 writes the output with non-temporal stores, which skip the
read of each line before it is written (half the memory traffic of a layer whose output
is its largest operand); 0 writes through the cache; 2 (default) streams where the output
is larger than the last-level cache (:mod:`convkernels.cpu.caches`), so that a consumer
of a smaller output still finds it in the cache.

**Plants** (``PLANT``, tests only): 1 drops the last ``(kd, kh)`` row of taps; 2 treats the
last input column as border.
"""

import math

import dace

from convkernels.cpu.calls import call_map, finish, include, layer_sdfg
from convkernels.cpu.caches import caches
from convkernels.cpu.direct.blocking import auto_switch
from convkernels.cpu.isa import has_feature, vector_floats, vector_registers, widest_isa
from convkernels.layer import layer_constants
from convkernels.layouts import Layout

#: The most values of one row of taps (``KW x C``) whose reduction the kernel writes out.
MAX_RUN = 24
#: Registers the tile leaves beside its filter vectors: with AVX-512 two (14 x 2
#: accumulators of the 32), with AVX2 the broadcast's (6 x 2 of the 16).
SPARE = {True: 2, False: 1}


def embedded() -> bool:
    """Whether the FMAs take their broadcast from memory (AVX-512's ``{1to16}``)."""
    return widest_isa() == "avx512f"


def tile_of(layer, params):
    """``(pb, nv, vl)``: pixels per block, vectors of output channels per block, floats
    per vector.  ``NV`` 0: 2, or 1 where ``K`` fits one vector; ``PB`` 0: as many
    pixels as the registers hold beside the ``NV`` filter vectors (:data:`SPARE`), at
    most the output width."""
    vl = vector_floats()
    vectors = -(-layer.out_channels // vl)
    nv = min(vectors, params["NV"] or 2)
    pb = params["PB"] or max(1, (vector_registers() - nv - SPARE[embedded()]) // nv)
    return min(pb, layer.out_w), nv, vl


def streams(layer, params) -> bool:
    """Whether the output is written with non-temporal stores (``STREAM``, see the
    module)."""
    if params["STREAM"] != 2:
        return bool(params["STREAM"])
    return 4 * math.prod(layer.output_shape) > caches().l3


def refusal(layer, params) -> str:
    """Why the kernel does not build ``layer`` ("" where it does)."""
    if widest_isa() not in ("avx512f", "avx2") or not has_feature("fma"):
        return f"needs AVX2 and FMA, or AVX-512 (this CPU: {widest_isa()})"
    run = layer.k_w * layer.in_channels
    if run > MAX_RUN:
        return (f"the reduction over a tap row is written out: KW x C = {run} values, at most "
                f"{MAX_RUN} (a kernel for few input channels)")
    pb, nv, _ = tile_of(layer, params)
    need = pb * nv + nv + (0 if embedded() else 1)  # and the broadcast's, with AVX2
    if need > vector_registers():
        return (f"a tile of {pb} pixels x {nv} vectors takes {need} registers, "
                f"this CPU has {vector_registers()}")
    return ""


def supports(layer, params):
    return refusal(layer, params) or None


def check_params(values):
    return None if values["PLANT"] in (0, 1, 2) else "PLANT must be 0, 1 or 2"


def global_code(L, layer, params) -> str:
    """The C++ of the kernel: the prelude of constants, then ``include/few_channels.h``."""
    pb, nv, vl = tile_of(layer, params)
    longs = dict(FC_N=L.N, FC_C=L.C, FC_K=L.K, FC_D=L.D, FC_H=L.H, FC_W=L.W, FC_KD=L.KD,
                 FC_KH=L.KH, FC_KW=L.KW, FC_S=L.S, FC_PD=L.PD, FC_PH=L.PH, FC_PW=L.PW,
                 FC_OD=L.OD, FC_OH=L.OH, FC_OW=L.OW, FC_NV=nv, FC_PB=pb)
    switches = dict(FC_VL=vl, FC_EMBED=int(embedded()), FC_STREAM=int(streams(layer, params)),
                    FC_PLANT=params["PLANT"])
    return "\n".join(
        ["#include <immintrin.h>",
         f"typedef float fc_v __attribute__((vector_size({4 * vl})));",
         f"typedef float fc_vu __attribute__((vector_size({4 * vl}), aligned(4)));"]
        + [f"#define {k} {v}" for k, v in switches.items()]
        + [f"static constexpr long {k} = {v};" for k, v in longs.items()]
        + [include(__file__, "few_channels.h")])


def program(layer, dtype, params):
    """The SDFG: the filter packed per block of output channels, then a parallel map over
    the output rows and channel blocks, each one call into the C++ code."""
    L = layer_constants(layer, Layout.NDHWC)
    pb, nv, vl = tile_of(layer, params)
    blocks = -(-L.K // (nv * vl))  # the last one partly filled where K is not a multiple
    tag = f"{pb}x{nv}x{vl}_s{int(streams(layer, params))}_p{params['PLANT']}"
    sdfg = layer_sdfg(f"direct_few_{layer.key()}_{tag}", layer, L)
    sdfg.add_array("wp", (blocks * nv * vl * L.KD * L.KH * L.KW * L.C,), dace.float32,
                   transient=True)
    state = sdfg.add_state("pack", is_start_block=True)
    call_map(state, "filter_block", {"kb": f"0:{blocks}"}, {"win": "w"},
             "fc_pack(win, wout, kb);", {"wout": "wp"})
    rows = sdfg.add_state_after(state, "rows")
    call_map(rows, "output_row", {"b": f"0:{L.N}", "od": f"0:{L.OD}", "oh": f"0:{L.OH}",
                                  "kb": f"0:{blocks}"},
             {"xin": "x", "win": "wp"}, "fc_row(xin, win, yout, b, od, oh, kb);", {"yout": "y"})
    return finish(sdfg, global_code(L, layer, params))


def params():
    from convkernels.declarations import Param
    return (
        Param("PB", 0, "output pixels per register block along the width (0: as many as "
                       "the vector registers hold beside the filter vectors)", minimum=0),
        Param("NV", 0, "vectors of output channels per register block (0: 2, or 1 where K "
                       "fits one vector); the last block is partly filled where K is not "
                       "a multiple of NV vectors", minimum=0),
        Param("STREAM", 2, "1: the output written with non-temporal stores; 0: through the "
                           "cache; 2: streamed where it is larger than the last-level "
                           "cache", minimum=0, check=auto_switch),
        Param("PLANT", 0, "tests only: 1 drops the last row of taps, 2 treats the last "
                          "input column as border", minimum=0),
    )


def registers(layer, params) -> int:
    """The tile's accumulator registers (for the tuner)."""
    pb, nv, _ = tile_of(layer, params)
    return pb * nv
