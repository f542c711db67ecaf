"""The tensor-core kernels' gathers (forward and data gradient): per thread its warp, lane
and the rows and chunks of A and B it stages, and per K tile the ``cp.async`` copies of its
16-byte chunks into the swizzled (K-major) or blocked (N-major TF32) layouts, zero-filled
past the borders; the prologue that issues the first stages.

**Taps packed.**  A forward layer with at most half a K tile of channels (CosmoFlow's
first layers) walks the filter's flat (tap, channel) reduction in K tiles instead of one
tap's channel blocks (``Shape.packed``, :func:`_packed_stage_code`): no tile is mostly
zeros, and each copy decodes its own tap.
"""

from typing import Optional

from convkernels.gpu.mma.layout import CHUNK, blocked, blocked_thread, swizzle
from convkernels.gpu.mma.tiles import WARP, Shape
from convkernels.gpu.pipeline.skeleton import SB, ST
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import gather as simt_gather


def thread_code(s: Shape, gpu: bool) -> str:
    """This thread's row of the per-thread arrays, its warp and lane, and the rows and
    chunks of A and B it stages."""
    tpa = s.NT // s.TM
    if s.b_mode == "lds":  # one chunk column of rows bk + i GB (blocked_thread)
        b = "const int bk = {}, bc = {};".format(*blocked_thread(s.NCH))
    elif s.flip:
        tpr = s.NCH // s.CBN  # threads per reduction row of an N-major B
        b = f"const int bk = (int)t / {tpr}, bc = ((int)t % {tpr}) * {s.CBN};"
    else:
        tpb = s.NT // s.TN
        b = f"const int bn = (int)t / {tpb}, bc = ((int)t % {tpb}) * {s.CBK};"
    return f"""const int tp = {"0" if gpu else "(int)t"};
const int lane = (int)t % {WARP}, warp = (int)t / {WARP};
const int wm = warp % {s.WARPS_M}, wn = warp / {s.WARPS_M};
const int am = (int)t / {tpa}, ac = ((int)t % {tpa}) * {s.CA};
{b}
(void)lane; (void)wm; (void)wn; (void)am; (void)ac;"""


def vector(extent: int, ce: int) -> int:
    """Values per copy: the largest power of two up to a chunk that divides the
    contiguous ``extent`` (one 16-bit value, 2 bytes, is an ordinary copy)."""
    v = ce
    while extent % v:
        v //= 2
    return v


def _copies(s: Shape, dst: str, rows: int, cpr: int, row: str, chunk0: str, first: str,
            limit: int, whole: int, ok: str, vec: int, operand: str) -> str:
    """C++ staging one run of this thread: chunks ``chunk0 + j`` (``j`` < ``rows``) of row
    ``row`` of a stage of ``operand``'s rows of ``cpr`` chunks at ``dst``, from ``src``
    (value ``v`` of chunk ``j`` at ``j * CE + v``), ``vec`` values per ``cp.async``.
    Value ``first + j * CE + v`` past ``limit`` is zero-filled, unless ``limit`` is a
    multiple of ``whole`` (the tile's extent along ``first``): then no value passes it,
    and the run's copies share ``ok`` and constant offsets from one pointer."""
    full = limit % whole == 0 and vec == s.CE
    cond = ok if full else f"{ok} && {first} + j * {s.CE} + v < {limit}"
    source = f"src + j * {s.CE} + v" if full else f"okv ? src + j * {s.CE} + v : base"
    return f"""#pragma unroll
for (int j = 0; j < {rows}; ++j) {{
    char* d = {dst} + {s.swizzle(operand, cpr, row, chunk0 + " + j")} * {CHUNK};
    #pragma unroll
    for (int v = 0; v < {s.CE}; v += {vec}) {{
        const bool okv = {cond};
        cb_cp_async<{vec * s.EB}>(d + v * {s.EB}, {source}, okv);
    }}
}}"""


def stage_code(s: Shape) -> str:
    """C++ that stages the K tile at (``kd, kh, kw``, ``c0``) into stage ``sslot``, then
    advances those to the next tile and stage (the reduction walks channel blocks, then
    taps, as the SIMT gather does).  Each operand's run starts at one pointer, the
    operand's base where the run is outside it (every copy then zero-fills)."""
    if s.packed:
        return _packed_stage_code(s)
    tap = f"((kd * {s.KH} + kh) * {s.KW} + kw)"
    va, vk = vector(s.C, s.CE), vector(s.K, s.CE)
    a = f"""{{ // A: this thread's pixel, chunks ac.. of channels c0..
    const int dd = d0 + kd, hh = h0 + kh, ww = w0 + kw;
    const bool inside = abase >= 0 && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u
                        && (unsigned)ww < {s.W}u;
    const int ch = c0 + ac * {s.CE};
    const auto* base = xa;
    const auto* src = inside ? xa + abase + (int64_t)((dd * {s.H} + hh) * {s.W} + ww) * {s.C} + ch : xa;
{indent(_copies(s, f"as + sslot * {s.ASB}", s.CA, s.CPR, "am", "ac", "ch", s.C, s.TK,
                  "inside", va, "a"), 4)}
}}"""
    if s.b_mode == "lds":  # N-major TF32, blocked: chunk bc of rows bk + i GB
        gb = s.NT // s.NCH
        assert s.NT % s.NCH == 0 and gb % 4 == 0 and s.TK % gb == 0, (s.NT, s.NCH, s.TK)
        b = f"""{{ // B (N-major, blocked): output channels n.., rows c0 + bk + i * {gb}
    const int n = blk_n + bc * {s.CE};
    const auto* row0 = wb + (int64_t)(c0 + bk) * {s.taps * s.K}
                       + ({s.taps - 1} - {tap}) * {s.K} + n;
    char* d0 = bs + sslot * {s.BSB} + {blocked(s.NCH, "bk", "bc")} * {CHUNK};
    #pragma unroll
    for (int i = 0; i < {s.TK // gb}; ++i) {{
        const bool ok = c0 + bk + i * {gb} < {s.C};
        #pragma unroll
        for (int v = 0; v < {s.CE}; v += {vk}) {{
            const bool okv = ok{"" if s.K % s.TN == 0 and vk == s.CE else f" && n + v < {s.K}"};
            cb_cp_async<{vk * s.EB}>(d0 + (i * {gb * s.NCH} * {s.CE} + v) * {s.EB},
                                    okv ? row0 + (int64_t)i * {gb * s.taps * s.K} + v : wb, okv);
        }}
    }}
}}"""
    elif s.flip:  # N-major: rows are reduction channels c0 + bk, chunks output channels
        b = f"""{{ // B (N-major): reduction channel c0 + bk, output channels from blk_n + bc * {s.CE}
    const int ck = c0 + bk, n = blk_n + bc * {s.CE};
    const auto* base = wb;
    const auto* src = ck < {s.C} ? wb + (int64_t)ck * {s.taps * s.K} + ({s.taps - 1} - {tap}) * {s.K} + n : wb;
{indent(_copies(s, f"bs + sslot * {s.BSB}", s.CBN, s.NCH, "bk", "bc", "n", s.K, s.TN,
                  f"ck < {s.C}", vk, "b"), 4)}
}}"""
    else:
        z = s.BZ
        b = _kmajor_b(s, f"(int64_t){tap} * {s.C // z} + ", s.C // z, vector(s.C // z, s.CE),
                      f"{tap} * {s.CB} + c0 / {s.TK}")
    return _staged(s, a, b, f"""if (c0 >= {s.C}) {{
    c0 = 0;
    if (++kw == {s.KW}) {{ kw = 0; if (++kh == {s.KH}) {{ kh = 0; ++kd; }} }}
}}""")


def _kmajor_b(s: Shape, tap: str, limit: int, vec: int, kt: str) -> str:
    """C++ staging this thread's chunks of its output channel's filter row (B, K-major, at
    ``bbase``): stored values ``ch = c0 / BZ + bc * CE`` on, after ``tap`` (C++ ending in
    ``+``, or empty where ``c0`` indexes the whole row), zero-filled from ``limit`` on;
    then what a compressed filter stages besides (``s.filter_extra``, of the K tile's
    index ``kt``)."""
    z = s.BZ
    c0 = f"c0 / {z}" if z > 1 else "c0"
    return f"""{{ // B (K-major): output channel's filter row at bbase, values {c0} + bc * {s.CE}..
    const int ch = {c0} + bc * {s.CE};
    const auto* base = wb;
    const auto* src = bbase >= 0 ? wb + bbase + {tap}ch : wb;
{indent(_copies(s, f"bs + sslot * {s.BSB}", s.CBK, s.CPR // z, "bn", "bc", "ch", limit,
                  s.TK // z, "bbase >= 0", vec, "b"), 4)}
}}""" + s.filter_extra(kt)


def _staged(s: Shape, a: str, b: str, advance: str) -> str:
    """C++ staging A and B (their code) while a K tile is left, advancing ``c0`` by a K
    tile and then by ``advance``, and moving to the next stage."""
    return f"""if (kd < {s.KD}) {{ // a K tile is left to stage
{indent(a, 4)}
{indent(b, 4)}
    c0 += {s.TK};
{indent(advance, 4)}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def _packed_stage_code(s: Shape) -> str:
    """:func:`stage_code` with taps packed (``Shape.packed``): the K tile at ``c0`` of the
    flat reduction ``r = tap * C + channel``.  Each A copy (``vec`` values, which divides
    C: one tap) decodes its own tap and checks it against the input's borders; B is a run
    of the filter row (the filter's own order); values past ``RF`` are zero-filled.
    ``kd`` only marks the end (``KD`` once the reduction is staged)."""
    va = vector(s.C, s.CE)
    a = f"""{{ // A (taps packed): this thread's pixel, chunks ac.. of the flat reduction from c0
    #pragma unroll
    for (int j = 0; j < {s.CA}; ++j) {{
        char* d = as + sslot * {s.ASB} + {swizzle(s.CPR, "am", "ac + j")} * {CHUNK};
        #pragma unroll
        for (int v = 0; v < {s.CE}; v += {va}) {{
            const int r = c0 + (ac + j) * {s.CE} + v;  // tap r / C, channel r % C
            const int tap = r / {s.C}, ch = r - tap * {s.C};
            const int dd = d0 + tap / {s.KH * s.KW}, hh = h0 + (tap / {s.KW}) % {s.KH};
            const int ww = w0 + tap % {s.KW};
            const bool ok = abase >= 0 && r < {s.RF} && (unsigned)dd < {s.D}u
                            && (unsigned)hh < {s.H}u && (unsigned)ww < {s.W}u;
            // (past the borders the address is formed, never read: source size 0)
            cb_cp_async<{va * s.EB}>(d + v * {s.EB},
                                    xa + abase + (int64_t)((dd * {s.H} + hh) * {s.W} + ww) * {s.C} + ch, ok);
        }}
    }}
}}"""
    b = _kmajor_b(s, "", s.RF // s.BZ, vector(s.RF // s.BZ, s.CE), f"c0 / {s.TK}")
    return _staged(s, a, b, f"if (c0 >= {s.RF}) kd = {s.KD};")


def prologue_code(s: Shape, gpu: bool, ahead: Optional[int] = None, after: str = "") -> str:
    """Zero the accumulators, decode the staged pixel and filter row, issue the first
    ``ahead`` K tiles (default ``stages - 1``), wait for the first, then run ``after``."""
    ahead = s.S - 1 if ahead is None else ahead
    if s.flip:
        bset = "bbase = 0;"  # its rows are reduction values; columns checked per chunk
        n = ""
    else:
        bset = f"if (n < {s.K}) bbase = n * {s.taps * s.C // s.BZ};"
        n = "const int64_t n = (int64_t)blk_n + bn;"
    return f"""{thread_code(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RR}; ++i) acco[tp * {s.RR} + i] = 0.0f;
{simt_gather.staged_pixel(s)}
    {n}
    {bset}
}}
int kd = 0, kh = 0, kw = 0, c0 = 0, sslot = 0;
const int cslot = 0;
for (int j = 0; j < {ahead}; ++j) {{
{indent(stage_code(s), 4)}
}}
{simt_gather.store_state(ST)}
sbo[tp * {len(SB)}] = abase;
sbo[tp * {len(SB)} + 1] = bbase;
cb_cp_wait<{ahead - 1}>();
{after}"""
