"""The tensor-core main loop (``mma.sync`` with float32 sums, in the shape of CUTLASS's sm80
kernels), and its CPU emulation.

**Main loop** (per K tile, per MMA step of ``KM`` = 16 or 8 reduction values = 2 chunks):
``ldmatrix.x4`` gives a lane its A registers of one 16 x KM tile (matrices: rows 0-7
and 8-15 of chunk 0, then of chunk 1) and its B registers of two KM x 8 tiles; then
``FM x FN`` ``mma.sync``.  Lane ``l`` of ``ldmatrix`` names row ``l % 8`` of matrix
``l / 8``; it receives word ``l % 4`` of row ``l / 4`` of each matrix (with ``.trans``:
the 16-bit values of column ``l / 4`` in rows ``2 (l % 4)`` and ``2 (l % 4) + 1``).  In
TF32, where a 4-byte value is one "pair" of ``ldmatrix``'s 16-bit values, the same loads
give m16n8k8's fragments, which the tensor cores read as TF32 (the low 13 bits of each
float32 ignored: no ``cvt``; the emulation truncates the same way).

**The CPU emulation** runs the same tasklet code thread by thread, with the same address
expressions: each thread builds the registers of all 32 lanes of its warp from shared
memory the way ``ldmatrix`` distributes them (:func:`convkernels.gpu.mma.ptx.helpers` with
``gpu=False``), then computes its own
four sums per MMA tile from the lanes and registers where PTX's fragment layout puts
A[r][k] and B[k][n].  A wrong swizzle, lane-to-row mapping, fragment order or
accumulator layout therefore fails on the CPU, not only on the GPU.
"""

from convkernels.gpu.mma import gather, layout
from convkernels.gpu.mma.tiles import WARP, Shape
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import gather as simt_gather


def mma_loop(s: Shape, gpu: bool) -> str:
    """C++ of the main loop on the K tile in stage ``cslot``: per MMA step, the lanes'
    registers through ``ldmatrix.x4`` and the warp tile's ``mma.sync``.  On the CPU each
    thread builds the registers of every lane of its warp (``ln``) and emulates its own
    share of each MMA from them."""
    def load(mode, dst, base, address):
        if mode == "lds":
            return f"cb_lds_x4({dst}, {base}, [&](int ln, int j) {{ return {address}; }}, LN);"
        trans = "true" if mode == "trans" else "false"
        return f"cb_ldsm_x4<{trans}>({dst}, {base}, [&](int ln) {{ return {address}; }}, LN);"
    a_loads = f"""#pragma unroll
for (int fm = 0; fm < {s.FM}; ++fm)
    {load(s.a_mode, "fa[LN][fm]", "as_c", layout.a_address(s))}"""
    b_loads = f"""#pragma unroll
for (int fp = 0; fp < {s.FN // 2}; ++fp) {{
    unsigned r[4];
    {load(s.b_mode, "r", "bs_c", layout.b_address(s))}
    fb[LN][2 * fp][0] = r[0]; fb[LN][2 * fp][1] = r[1];
    fb[LN][2 * fp + 1][0] = r[2]; fb[LN][2 * fp + 1][1] = r[3];
}}"""
    loads = a_loads + "\n" + b_loads
    if gpu:
        frags = f"unsigned fa[1][{s.FM}][4], fb[1][{s.FN}][2];\n" + loads.replace("LN]", "0]")
        frags = frags.replace(", LN)", ", lane)")
        mma = "cb_mma(acc + (fm * {FN} + fn) * 4, fa[0][fm], fb[0][fn]);"
    else:
        frags = (f"unsigned fa[{WARP}][{s.FM}][4], fb[{WARP}][{s.FN}][2];\n"
                 f"for (int LN = 0; LN < {WARP}; ++LN) {{\n{indent(loads, 4)}\n}}")
        mma = "cb_mma_emulated(acc + (fm * {FN} + fn) * 4, lane, fa, fb, fm, fn);"
    return f"""const char* as_c = as + cslot * {s.ASB};
const char* bs_c = bs + cslot * {s.BSB};
#pragma unroll
for (int kk = 0; kk < {s.TK // s.KM}; ++kk) {{
{indent(frags, 4)}
    #pragma unroll
    for (int fm = 0; fm < {s.FM}; ++fm)
        #pragma unroll
        for (int fn = 0; fn < {s.FN}; ++fn)
            {mma.format(FN=s.FN)}
}}"""


def step_code(s: Shape, gpu: bool, loop=mma_loop) -> str:
    """Step ``kt``: issue the next K tile, compute the one in stage ``cslot`` (with the
    main loop ``loop(s, gpu)``), wait for the tile after it."""
    return f"""{gather.thread_code(s, gpu)}
{simt_gather.load_state(s, writable=True)}
{gather.stage_code(s)}
{{
    {s.acc_t}* acc = acco + tp * {s.RR};
{indent(loop(s, gpu), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{simt_gather.store_state(("kd", "kh", "kw", "c0", "sslot", "cslot"))}
cb_cp_wait<{s.S - 2}>();
"""
