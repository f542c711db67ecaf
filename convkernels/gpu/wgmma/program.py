"""The Hopper tensor-core implicit GEMM (``implicitGemmWGMMA``, ``implicitGemmWGMMABwdData``)
on NDHWC: the pipelined skeleton (:mod:`convkernels.gpu.pipeline.skeleton`) with the
tensor-core gather and epilogue of :mod:`convkernels.gpu.mma` and a ``wgmma`` main loop.

**Tiles.**  A block of ``CTAtileM / 64`` warpgroups (128 threads each) computes a
``CTAtileM x CTAtileN`` output tile; warpgroup ``g`` owns rows ``64 g`` to ``64 g + 63``
and all ``CTAtileN`` columns, one ``wgmma`` m64nNk16 (16-bit) or m64nNk8 (TF32) per 32
bytes of a K tile.  A K tile is 128 bytes of each row (64 16-bit or 32 TF32 values: the
width of the 128-byte swizzle), so the staged layout of :mod:`convkernels.gpu.mma.layout`
is the one the descriptors name (:mod:`convkernels.gpu.wgmma.ptx`).  In the mma kernels'
terms a warp's tile is 16 x ``CTAtileN``: their gather, which stages the tiles, and their
epilogue, which stores a warp's 16-row MMA tiles, serve unchanged.

**Stages** (``stages`` >= 3, always more than 48 KiB, so in dynamic shared memory, each
stage at a multiple of 1024 bytes: :mod:`convkernels.gpu.dynamic_shared`).  Step ``kt``
stages tile ``kt + stages - 2`` into the stage that step ``kt - 2`` read, issues the
``wgmma`` of tile ``kt`` and waits until at most one group (this one) is in flight, so the
tensor cores work on tile ``kt`` while the next step's copies are issued; the barrier DaCe
places after each step (and after the prologue) orders the warpgroups (a stage is written
two steps after it was read, and the group that read it was waited for one step
after).  Then it waits for tile ``kt + 1``'s copies and fences them for the async proxy
that ``wgmma`` reads through.

**CPU emulation.**  The same tasklet code runs thread by thread: ``cp.async`` is a copy,
the fences and waits do nothing, and each thread's ``wgmma`` decodes both descriptors and
sums its own accumulators from the operands' bytes (:func:`convkernels.gpu.wgmma.ptx.helpers`),
so a wrong swizzle mode, SBO or accumulator mapping fails on the CPU.
"""

import dace

from convkernels.declarations import Param
from convkernels.gpu import dynamic_shared
from convkernels.gpu import tiling as T
from convkernels.gpu.mma import epilogue, gather
from convkernels.gpu.mma import tiles as mma_tiles
from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.simt import gather as simt_gather
from convkernels.gpu.wgmma import ptx as wptx
from convkernels.layer import Layer
from convkernels.layouts import Layout, stored_shape
from convkernels.transposed import supports as flipped_supports
from convkernels.transposed import swap_roles, transposed_layer

#: Threads of a warpgroup, rows of its tile.
WARPGROUP, GROUP_ROWS = 128, 64
#: Shared memory a block may have on sm_90 (227 KiB), less the extension's alignment slack.
SHARED_BYTES = 227 * 1024 - dynamic_shared.ALIGN

PARAMS = (
    Param("CTAtileM", 128, "output pixels (GEMM rows) per thread block: 64 per warpgroup",
          T.power_of_two),
    Param("CTAtileN", 128, "output channels (GEMM columns) per thread block: the N of each "
          "wgmma (64 to 256)", T.power_of_two),
    Param("CTAtileK", 64, "16-bit reduction values per K tile (TF32: half as many): 128 "
          "bytes a row, the width of the 128-byte swizzle (fixed)", T.power_of_two),
    Param("stages", 4, "K tiles in shared memory (3 to 6; two ahead of the one computed "
          "when 4)"),
)

#: The tiles and stages a search tries (``Implementation.search_space``; the GPU tune
#: space, ``convbench.tuning.gpuspace.SPACES``, is the same).
SEARCH_SPACE = "CTAtileM=64,128;CTAtileN=64,128,256;stages=3,4,5,6"

#: The precisions (by label, :mod:`convbench.build.precision`).
PRECISIONS = mma_tiles.PRECISIONS

#: The CUDA architecture the kernels need: wgmma is sm_90a's.
CUDA_ARCH = "90a"

#: What the tests plant: the descriptors' fields (swizzle mode, SBO, LBO in bytes).
DESCRIPTOR = {"mode": wptx.SWIZZLE_MODE, "sbo": wptx.SBO_BYTES, "lbo": wptx.LBO_BYTES}


def _mma_params(params):
    """The mma kernels' parameters of this tile: a warp's tile 16 x ``CTAtileN``."""
    return {"CTAtileM": params["CTAtileM"], "CTAtileN": params["CTAtileN"],
            "CTAtileK": params["CTAtileK"], "warpTileM": 16, "warpTileN": params["CTAtileN"],
            "stages": params["stages"]}


def shape(layer: Layer, ctype: str, params, flip: bool = False) -> mma_tiles.Shape:
    """The constants of ``layer`` with the tiles of ``params`` (those of the mma kernels,
    :func:`_mma_params`)."""
    return mma_tiles.shape(layer, ctype, _mma_params(params), flip)


def check_params(params):
    """Why the tiles and stages of ``params`` cannot be built, or None."""
    tm, tn, tk, s = (params[k] for k in ("CTAtileM", "CTAtileN", "CTAtileK", "stages"))
    nt = tm // GROUP_ROWS * WARPGROUP
    smem = s * (tm + tn) * wptx.ROW_BYTES
    return T.require(
        (tk == 64, f"CTAtileK={tk}: 64 (a K tile is one 128-byte swizzled row)"),
        (tm >= GROUP_ROWS, f"CTAtileM={tm}: at least {GROUP_ROWS} (one warpgroup)"),
        (64 <= tn <= 256, f"CTAtileN={tn}: 64 to 256 (the N of one wgmma)"),
        (3 <= s <= 6, f"stages={s}: 3 to 6"),
        (nt <= T.MAX_THREADS, f"{nt} threads > {T.MAX_THREADS}"),
        (nt >= tn, f"{nt} threads: at least one per row of the B tile ({tn})"),
        (nt and tn * 8 >= nt and tn * 8 % nt == 0,
         f"the {tn} rows of 8 chunks of B must split evenly over {nt} threads"),
        # dynamic shared memory puts each stage at a multiple of 1024 bytes, which the
        # swizzle the descriptors name needs; DaCe's static arrays are 16-byte aligned
        (smem > dynamic_shared.STATIC_LIMIT,
         f"{s} stages of tiles take {smem} bytes: more than "
         f"{dynamic_shared.STATIC_LIMIT} (in dynamic shared memory, 1024-byte aligned)"),
        (smem <= SHARED_BYTES, f"{s} stages of tiles need {smem} bytes of shared memory "
                               f"> {SHARED_BYTES}"),
    )


def supports(layer: Layer, params):
    """Every image's offsets in int32 (``convkernels.gpu.simt.tiles.supports``)."""
    return mma_tiles.supports(layer, params)


def group_code(s, gpu: bool, group: str, steps: int, step: int) -> str:
    """C++ issuing one wgmma group on the K tile in stage ``cslot``: ``steps`` wgmma, the
    operands of step ``kk`` starting ``kk * step`` bytes into the stage (A: ``group``
    bytes on, this warpgroup's rows), then waiting until only this group is in flight.
    The main loop of every wgmma kernel."""
    da, db = f"cb_wgmma_desc(a_c + kk * {step}, as)", f"cb_wgmma_desc(b_c + kk * {step}, bs)"
    # the CPU's emulation also takes the thread's lane in its warpgroup and the arrays
    args = f"{da}, {db}" if gpu else f"(int)t % {WARPGROUP}, as, {da}, bs, {db}"
    mma = f"cb_wgmma_n{s.TN}(acc, {args});"
    return f"""{{
    float* acc = acco + tp * {s.RR};
    const char* a_c = as + cslot * {s.ASB} + {group};
    const char* b_c = bs + cslot * {s.BSB};
    {wptx.fence_operands(s.RR)}
    cb_wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < {steps}; ++kk)
        {mma}
    cb_wgmma_commit();
    cb_wgmma_wait<1>();
    {wptx.fence_operands(s.RR)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;"""


def step_wait(s) -> str:
    """C++ closing every step: wait for the next K tile's copies (``stages - 3`` younger
    ones stay in flight) and make them visible to the async proxy ``wgmma`` reads through."""
    return f"cb_cp_wait<{s.S - 3}>();\ncb_fence_proxy_async();\n"


def step_code(s, gpu: bool) -> str:
    """Step ``kt`` (the module docstring): stage a tile two steps ahead, issue this
    tile's wgmma group, wait for the previous group and for the next tile's copies."""
    group = f"(warp / 4) * {GROUP_ROWS * wptx.ROW_BYTES}"
    steps = s.TK // (2 * s.CE)  # a wgmma reads 32 bytes of each row
    return f"""{gather.thread_code(s, gpu)}
{simt_gather.load_state(s, writable=True)}
{gather.stage_code(s)}
{group_code(s, gpu, group, steps, 32)}
{simt_gather.store_state(("kd", "kh", "kw", "c0", "sslot", "cslot"))}
{step_wait(s)}"""


def prologue_code(s, gpu: bool) -> str:
    """The mma kernels' prologue with ``stages - 2`` tiles ahead, fenced for wgmma."""
    return gather.prologue_code(s, gpu, ahead=s.S - 2, after="cb_fence_proxy_async();\n")


def drain_code(s, gpu: bool) -> str:
    """C++ waiting for the last wgmma group (every wgmma kernel's epilogue starts so)."""
    row = "0" if gpu else f"(int)t * {s.RR}"
    return (f"{{\n    float* acc = const_cast<float*>(acci) + {row};\n"
            f"    cb_wgmma_wait<0>();\n    {wptx.fence_operands(s.RR)}\n}}\n")


def epilogue_code(s, gpu: bool) -> str:
    """Wait for the last wgmma group, then the mma kernels' epilogue."""
    return drain_code(s, gpu) + epilogue.epilogue_code(s, gpu)


_PREAMBLE = ("char* as = reinterpret_cast<char*>(ao);\n"
             "char* bs = reinterpret_cast<char*>(bo);\n")


def code():
    """The tasklet code by role (looked up when called, so a test can plant a bug)."""
    def staged(f):
        return lambda s, gpu: _PREAMBLE + f(s, gpu)
    return {"prologue": staged(prologue_code), "step": staged(step_code),
            "epilogue": epilogue_code}


def helpers(s, gpu: bool) -> str:
    """The wgmma helpers of a build's constants, with the descriptors' fields of
    :data:`DESCRIPTOR`."""
    return wptx.helpers(s.ptx, s.KM, s.TN, gpu, **DESCRIPTOR)


def program(layer: Layer, dtype, params, flip: bool = False, w_shape=None) -> dace.SDFG:
    """The wgmma implicit GEMM of ``layer`` (NDHWC); ``flip``: as
    :func:`convkernels.gpu.mma.program.program`."""
    s = shape(layer, dtype.dace.ctype, params, flip)
    sdfg = skeleton.program(layer, Layout.NDHWC, dtype, params, flip=flip, w_shape=w_shape,
                            s=s, code=code())
    sdfg.append_global_code(helpers(s, gpu=False), "frame")
    return sdfg


def schedule(target: str, flip: bool = False, layer_of=lambda layer: layer):
    """The pipelined skeleton's tiled schedule with the wgmma code of the target; on the
    GPU the stages go to dynamic shared memory (the extension registered here)."""
    def apply(sdfg, layer, params):
        if target == "gpu":
            dynamic_shared.register()
        s = shape(layer_of(layer), sdfg.arrays["x"].dtype.ctype, params, flip)
        skeleton.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, code()))(sdfg, layer, params)
        sdfg.append_global_code(helpers(s, target == "gpu"),
                                "cuda" if target == "gpu" else "frame")
    return apply


def fields(**given):
    """What a wgmma kernel registers with: ``given`` and what every one shares."""
    return {**dict(layout=Layout.NDHWC, params=PARAMS, check_params=check_params,
                   precisions=PRECISIONS, cuda_arch=CUDA_ARCH), **given}


def data_gradient(layer: Layer, dtype, params) -> dace.SDFG:
    """dL/dx of a stride-1 ``layer``: the forward wgmma program on
    ``transposed_layer(layer)``, whose filter is the forward one flipped with its channels
    swapped, written K-major by a first kernel (``wt[c][tap'][k] = w[k][flip(tap')][c]``):
    TF32 ``wgmma`` reads K-major operands only, and one main loop serves both passes.  x and
    y swap roles for the harness."""
    sdfg = program(transposed_layer(layer), dtype, params)
    _flipped_filter_first(sdfg, layer, dtype)
    return swap_roles(sdfg)


def _flipped_filter_first(sdfg: dace.SDFG, layer: Layer, dtype) -> None:
    """Rename the program's filter ``wt`` (a transient) and write it, in a state before the
    rest, from the forward filter ``w`` (the argument the harness passes)."""
    KD, KH, KW = layer.k_d, layer.k_h, layer.k_w
    K, C = layer.out_channels, layer.in_channels
    sdfg.replace("w", "wt")
    sdfg.arrays["wt"].transient = True
    sdfg.add_array("w", stored_shape(Layout.NDHWC, "w", layer.filter_shape), dtype.dace)
    sdfg.arg_names = ["w" if a == "wt" else a for a in sdfg.arg_names]
    first = sdfg.add_state_before(sdfg.start_state, "flipped_filter")
    first.add_mapped_tasklet(
        "flip_filter",
        dict(c=f"0:{C}", a=f"0:{KD}", b=f"0:{KH}", e=f"0:{KW}", k=f"0:{K}"),
        {"v": dace.Memlet(f"w[k, {KD - 1} - a, {KH - 1} - b, {KW - 1} - e, c]")},
        "o = v",
        {"o": dace.Memlet("wt[c, a, b, e, k]")},
        external_edges=True)


def data_gradient_supports(layer: Layer, params=None):
    """Why the data gradient does not handle ``layer``, or None."""
    return flipped_supports(layer, params) or supports(transposed_layer(layer), params)
