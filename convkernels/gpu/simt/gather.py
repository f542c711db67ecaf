"""The SIMT kernels' gathers: per thread, the output pixel and filter row it stages (decoded
once, kept in registers across the K loop), and per K tile the ``cp.async`` copies of its
runs of A and B values into the current stage, zero-filled at the borders.

* **Gather, once per thread.**  Before the K loop each thread decodes the one output
  pixel whose A values it stages (its window origin and image offset) and the one output
  channel whose B values it stages, into registers (``st``).  No table, no padded copy
  of the input: a tap outside the input is a zero-filled copy.
* **Staging by cp.async.**  Per K tile a thread copies a run of ``KVA`` consecutive
  reduction values of its pixel into shared memory (``As[stage][m][k]``, m-major, rows
  padded to ``TK + 4`` floats against bank conflicts) and ``KVB`` values of its filter
  row (``Bs[stage][n][k]``), in vectors of 16, 8 or 4 bytes where the layout keeps them
  contiguous (NDHWC, channels a multiple of the vector) and of 4 bytes otherwise, with
  ``cp.async`` and its zero-fill for the border (the source size is 0).
* **Stages.**  ``stages`` K tiles are in flight: the prologue issues tiles 0 to
  ``stages - 2``; each step issues one more (:mod:`convkernels.gpu.simt.mainloop`).
"""

from convkernels.gpu.pipeline.skeleton import SB, ST
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt.tiles import Shape
from convkernels.layouts import Layout


def load_state(s: Shape, writable: bool) -> str:
    """C++ locals of the state (``sti``/``sbi``: the arrays, row ``tp``)."""
    const = "" if writable else "const "
    ints = "\n".join(f"{const}int {n} = sti[tp * {len(ST)} + {i}];" for i, n in enumerate(ST))
    wide = "\n".join(f"const int64_t {n} = sbi[tp * {len(SB)} + {i}];" for i, n in enumerate(SB))
    return ints + "\n" + wide


def store_state(names) -> str:
    return "\n".join(f"sto[tp * {len(ST)} + {ST.index(n)}] = {n};" for n in names)


def _carry(kd: str, kh: str, kw: str, s: Shape, times: int) -> str:
    """C++ carrying ``kw`` past the filter's width into ``kh`` and ``kd``, at most
    ``times`` times (a tap counter stepped by up to ``times * KW``)."""
    one = f"if ({kw} >= {s.KW}) {{ {kw} -= {s.KW}; if (++{kh} == {s.KH}) {{ {kh} = 0; ++{kd}; }} }}"
    return "\n".join([one] * times)


def packed_stage_code(s: Shape, live: str = "") -> str:
    """C++ staging the K tile of flat reduction values ``c0..`` (taps packed,
    ``Shape.packed``): this thread's run of A is ``KVA / C`` whole taps from its counters
    (``kd, kh, kw``: the run's first tap), each tap's ``C`` channels one copy of a pixel
    (zeros outside the input and past the last tap); its run of B is contiguous in the
    filter's row (zeros past its end).  Then the counters step by ``TK / C`` taps."""
    per_run = s.KVA // s.C
    first = (f"if (c0 < {s.RF}) {{ // a K tile is left: values c0.. of the flat (tap, channel) "
             f"reduction" if not live else
             "{ // this slice's next K tile (zeros past it): values c0.. of (tap, channel)")
    pre = f"{live} && " if live else ""
    if s.tap_table:
        return first + "\n" + _table_taps(s, pre) + _packed_b(s, pre)
    return f"""{first}
    float* adst = As_ + sslot * {s.TM * s.TKP} + am * {s.TKP} + akv;
    #pragma unroll
    for (int q = 0; q < {per_run}; ++q) {{  // tap q of the run (not j: the prologue's)
        int jd = kd, jh = kh, jw = kw + q;
{indent(_carry("jd", "jh", "jw", s, -(-(per_run - 1) // s.KW)), 8)}
        const int dd = d0 + jd, hh = h0 + jh, ww = w0 + jw;
        const bool ok = {pre}abase >= 0 && jd < {s.KD} && (unsigned)dd < {s.D}u
                        && (unsigned)hh < {s.H}u && (unsigned)ww < {s.W}u;
        // the pixel's offset ends in an add (a product widened to 64 bits alone would
        // take an IMAD.WIDE)
        const float* src = ok ? xa + (abase + (int64_t)((dd * {s.H} + hh) * {s.W * s.C} + ww * {s.C})) : xa;
        #pragma unroll
        for (int e = 0; e < {s.C}; e += {s.VA})
            cb_cp_async<{4 * s.VA}>(adst + q * {s.C} + e, src + e, ok);
    }}
""" + _packed_b(s, pre)


def _packed_b(s: Shape, pre: str) -> str:
    """C++ of a packed tile's B run (contiguous in the filter row, zeros past its end)
    and the counters' step (``TK / C`` taps; with the tap table, one counter)."""
    # with split-K a slice stages past the reduction's end (as zeros): the tap counter
    # wraps there, so that the table and the mask's shift stay in range
    wrap = f"\n    if (kd >= {s.table_taps}) kd = 0;" if s.split else ""
    step = (f"    kd += {s.TK // s.C};{wrap}" if s.tap_table else
            f"    kw += {s.TK // s.C};\n{indent(_carry('kd', 'kh', 'kw', s, -(-(s.TK // s.C) // s.KW)), 4)}")
    return f"""    float* bdst = Bs_ + sslot * {s.TN * s.TKP} + bn * {s.TKP} + bkv;
    // one address a run, its copies at constant distances (a zero fill reads nothing)
    const float* bsrc = (const float*)((const char*)(wb + (bbase >= 0 ? bbase : 0)) + 4 * (c0 + bkv));
    #pragma unroll
    for (int e = 0; e < {s.KVB}; e += {s.VB})
        cb_cp_async<{4 * s.VB}>(bdst + e, bsrc + e, {pre}bbase >= 0 && c0 + bkv + e < {s.RF});
    c0 += {s.TK};
{step}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


#: The table of the taps' offsets from a pixel's window origin (``Shape.tap_table``).
TAP_TABLE = "cb_packed_taps"


def _table_taps(s: Shape, pre: str) -> str:
    """C++ of a packed tile's A run with the tap table: tap ``kd + q`` is inside where its
    bit of the pixel's mask (``d0``) is set, ``abase`` (its window origin) plus its entry
    of :data:`TAP_TABLE` (bytes) from ``xa``.  The mask has no bit past the last tap and
    the table is padded with zeros to the K tiles' taps, so no tap count is compared; the
    address is formed whether or not the copy reads (a zero fill reads nothing)."""
    return f"""    float* adst = As_ + sslot * {s.TM * s.TKP} + am * {s.TKP} + akv;
    const unsigned bits = (unsigned)d0 >> kd;  // the mask from this run's first tap on
    const char* pa = (const char*)(xa + abase);
    #pragma unroll
    for (int q = 0; q < {s.KVA // s.C}; ++q) {{  // tap kd + q: its bit of the mask, its offset
        const bool ok = {pre}((bits >> q) & 1u);
        const float* src = (const float*)(pa + {TAP_TABLE}[kd + q]);
        #pragma unroll
        for (int e = 0; e < {s.C}; e += {s.VA})
            cb_cp_async<{4 * s.VA}>(adst + q * {s.C} + e, src + e, ok);
    }}
"""


def tap_table_code(s: Shape, gpu: bool) -> str:
    """C++ of :data:`TAP_TABLE`: tap ``t``'s offset ``((kd H + kh) W + kw) C`` in bytes
    (constant memory on the GPU), zeros from the last tap to the K tiles' end."""
    offsets = [4 * ((t // (s.KH * s.KW) * s.H + t // s.KW % s.KH) * s.W + t % s.KW) * s.C
               for t in range(s.taps)]
    offsets += [0] * (s.table_taps - s.taps)
    qual = "__constant__" if gpu else "static const"
    guard = "CB_PACKED_TAPS_GPU" if gpu else "CB_PACKED_TAPS_CPU"
    return (f"\n#ifndef {guard}\n#define {guard}\n{qual} int {TAP_TABLE}[{s.table_taps}] = "
            f"{{{', '.join(map(str, offsets))}}};\n#endif\n")


def tap_mask(s: Shape) -> str:
    """C++ (in the prologue, after the staged pixel's decode) replacing ``d0, h0, w0`` by
    the tap table's state: the mask of the pixel's taps inside the input, 0, 0; ``abase``
    becomes the window origin's offset (no longer a row's flag: the mask is 0 past the
    GEMM's rows)."""
    if not s.tap_table:
        return ""
    td, th, tw = tap_parts(s, "t")
    return f"""{{ // the taps of this pixel's window inside the input, a bit each
    unsigned mask = 0u;
    if (abase >= 0)
        for (int t = 0; t < {s.taps}; ++t) {{
            const int dd = d0 + {td}, hh = h0 + {th}, ww = w0 + {tw};
            if ((unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u && (unsigned)ww < {s.W}u) mask |= 1u << t;
        }}
    if (abase >= 0) abase += ((d0 * {s.H} + h0) * {s.W} + w0) * {s.C};  // the window origin
    d0 = (int)mask;
    h0 = 0;
    w0 = 0;
}}
"""


def stage_code(s: Shape, live: str = "") -> str:
    """C++ that stages the K tile at (``kd, kh, kw``, ``c0``) into stage ``sslot`` (this
    thread's part), then advances those to the next tile and stage: no division, the
    reduction walks channel blocks, then taps.  Where the channels fill whole K tiles,
    a run never passes the last channel: one address and one predicate per run, the
    run's copies at constant distances from it.  ``live`` (split-K): C++ of whether the
    tile is in this slice; a tile past it is staged as zeros (its step still computes).
    With taps packed, :func:`packed_stage_code`."""
    if s.packed:
        return packed_stage_code(s, live)
    ndhwc = s.layout == Layout.NDHWC
    full = s.C % s.TK == 0
    spatial = "((dd * {H} + hh) * {W} + ww)".format(H=s.H, W=s.W)
    a_step, b_step = (1, 1) if ndhwc else (s.D * s.H * s.W, s.taps)
    if s.flip:  # a reduction channel of the flipped filter is an output channel of w
        b_step = s.taps * s.K
    # a run's first channel; where a K tile may reach past the last channel, clamped to it
    # (the copies past it are zero fills), so that no offset leaves the image's int32 range
    ca = "(c0 + akv)" if full else f"(c0 + akv < {s.C} ? c0 + akv : {s.C - 1})"
    cb = "(c0 + bkv)" if full else f"(c0 + bkv < {s.C} ? c0 + bkv : {s.C - 1})"
    a_off = (f"abase + (int64_t)({spatial} * {s.C} + {ca})" if ndhwc else
             f"abase + (int64_t)({ca} * {a_step} + {spatial})")
    tap = f"((kd * {s.KH} + kh) * {s.KW} + kw)"
    if s.flip:  # w[c][n][taps-1-tap] (NCDHW), w[c][taps-1-tap][n] (NDHWC); bbase: n's part
        flipped = f"({s.taps - 1} - {tap})"
        b_off = (f"bbase + (int64_t)({cb} * {b_step} + {flipped} * {s.K})" if ndhwc
                 else f"bbase + (int64_t)({cb} * {b_step} + {flipped})")
    else:
        b_off = (f"bbase + (int64_t)({tap} * {s.C} + {cb})" if ndhwc
                 else f"bbase + (int64_t)({cb} * {b_step} + {tap})")

    def copies(dst, run, vec, step, ok):
        if full:
            return f"""    #pragma unroll
    for (int e = 0; e < {run}; e += {vec})
        cb_cp_async<{4 * vec}>({dst} + e, src + e * {step}, {ok});"""
        return f"""    #pragma unroll
    for (int e = 0; e < {run}; e += {vec}) {{
        const bool oke = {ok} && c0 + {dst[0]}kv + e < {s.C};
        cb_cp_async<{4 * vec}>({dst} + e, oke ? src + e * {step} : base, oke);
    }}"""
    # split-K: every step stages (zeros past the slice); else only while tiles are left
    first = (f"if (kd < {s.KD}) {{ // a K tile is left to stage: tap (kd, kh, kw), channels c0.."
             if not live else "{ // this slice's next K tile (zeros past it): tap (kd, kh, kw)")
    b_ok = f"{live} && bbase >= 0" if live else "bbase >= 0"
    return f"""{first}
    const int dd = d0 + kd, hh = h0 + kh, ww = w0 + kw;
    const bool inside = {live + " && " if live else ""}abase >= 0 && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u
                        && (unsigned)ww < {s.W}u;
    float* adst = As_ + sslot * {s.TM * s.TKP} + am * {s.TKP} + akv;
    {{
    const float* base = xa;
    const float* src = inside ? xa + ({a_off}) : xa;
{copies("adst", s.KVA, s.VA, a_step, "inside")}
    }}
    float* bdst = Bs_ + sslot * {s.TN * s.TKP} + bn * {s.TKP} + bkv;
    {{
    const float* base = wb;
    const float* src = {b_ok} ? wb + ({b_off}) : wb;
{copies("bdst", s.KVB, s.VB, b_step, b_ok)}
    }}
    c0 += {s.TK};
    if (c0 >= {s.C}) {{
        c0 = 0;
        if (++kw == {s.KW}) {{ kw = 0; if (++kh == {s.KH}) {{ kh = 0; ++kd; }} }}
    }}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def thread_code(s: Shape, gpu: bool) -> str:
    """C++ that names this thread's row in the per-thread arrays (``tp``: 0 on the GPU,
    where each thread's arrays are its own registers), its tile coordinates, and the row
    and run of A and B values it stages."""
    tp = "0" if gpu else "(int)t"
    return f"""const int tp = {tp};
const int ti = (int)t % {s.NTM}, tj = (int)t / {s.NTM};
const int am = {a_row(s)}, akv = {a_run(s)};
const int bn = {b_row(s)}, bkv = {b_run(s)};
(void)ti; (void)tj; (void)am; (void)akv; (void)bn; (void)bkv;"""


def a_row(s: Shape) -> str:
    # NCDHW: consecutive threads on consecutive pixels (consecutive w: coalesced);
    # NDHWC: consecutive threads on consecutive channel runs of one pixel
    return f"(int)t % {s.TM}" if s.layout == Layout.NCDHW else f"(int)t / {s.NT // s.TM}"


def a_run(s: Shape) -> str:
    return (f"((int)t / {s.TM}) * {s.KVA}" if s.layout == Layout.NCDHW
            else f"((int)t % {s.NT // s.TM}) * {s.KVA}")


def b_row(s: Shape) -> str:
    return f"(int)t % {s.TN}" if s.layout == Layout.NCDHW else f"(int)t / {s.NT // s.TN}"


def b_run(s: Shape) -> str:
    return (f"((int)t / {s.TN}) * {s.KVB}" if s.layout == Layout.NCDHW
            else f"((int)t % {s.NT // s.TN}) * {s.KVB}")


def prologue_code(s: Shape, gpu: bool) -> str:
    """Zero the accumulators, decode the staged pixel and filter row, issue the first
    ``stages - 1`` K tiles, and wait for the first."""
    return f"""{thread_code(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RM * s.RN}; ++i) acco[tp * {s.RM * s.RN} + i] = 0.0f;
{staged_pixel(s)}
    const int64_t n = (int64_t)blk_n + bn;
    if (n < {s.K}) bbase = n * {b_row_stride(s)};
}}
{tap_mask(s)}{first_tile(s)}
const int cslot = 0;
for (int j = 0; j < {s.S - 1}; ++j) {{
{indent(stage_code(s, "j < tiles" if s.split else ""), 4)}
}}
{store_state(ST)}
sbo[tp * {len(SB)}] = abase;
sbo[tp * {len(SB)} + 1] = bbase;
cb_cp_wait<{s.S - 2}>();
"""


def slice_tiles(s: Shape) -> str:
    """C++ declaring ``tiles``: the K tiles of slice ``blk_z`` (split-K)."""
    return (f"const int tiles = {s.KT} - (int)blk_z * {s.TPS} < {s.TPS} ? "
            f"{s.KT} - (int)blk_z * {s.TPS} : {s.TPS};")


def tap_parts(s: Shape, tap: str):
    """C++ of filter tap ``tap``'s (kd, kh, kw)."""
    return (f"{tap} / {s.KH * s.KW}", f"({tap} / {s.KW}) % {s.KH}", f"{tap} % {s.KW}")


def first_tile(s: Shape) -> str:
    """C++ declaring the counters of the first K tile to stage: 0, or with split-K slice
    ``blk_z``'s first (tap ``first / CB``, channel block ``first % CB``) and its ``tiles``.
    With taps packed, ``c0`` is the tile's first flat value and ``kd, kh, kw`` the tap of
    this thread's run in it."""
    kd, kh, kw = tap_parts(s, "tap0")
    if s.packed:
        start = (f"{slice_tiles(s)}\nconst int first = (int)blk_z * {s.TPS};\n"
                 if s.split else "const int first = 0;\n")
        if s.tap_table:  # one counter: the run's first tap
            return start + f"""int c0 = first * {s.TK}, sslot = 0;
int kd = (c0 + akv) / {s.C}, kh = 0, kw = 0;"""
        return start + f"""int c0 = first * {s.TK}, sslot = 0;
const int tap0 = (c0 + akv) / {s.C};
int kd = {kd}, kh = {kh}, kw = {kw};"""
    if not s.split:
        return "int kd = 0, kh = 0, kw = 0, c0 = 0, sslot = 0;"
    return f"""{slice_tiles(s)}
const int first = (int)blk_z * {s.TPS}, tap0 = first / {s.CB};
int kd = {kd}, kh = {kh}, kw = {kw};
int c0 = (first - tap0 * {s.CB}) * {s.TK}, sslot = 0;"""


def staged_pixel(s) -> str:
    """C++ declaring the staged pixel's window origin (``d0, h0, w0``), its image's offset
    (``abase``, -1 past the GEMM's rows) and ``bbase`` (-1), and decoding the output
    pixel of A's row ``am``; it leaves a block open for the caller's filter row."""
    plane = s.OD * s.OH * s.OW
    return f"""int d0 = 0, h0 = 0, w0 = 0;
int64_t abase = -1, bbase = -1;
{{
    const int64_t m = (int64_t)blk_m + am;
    if (m < {s.GM}) {{
        const int64_t b = m / {plane};
        const int p = (int)(m - b * {plane});
        const int od = p / {s.OH * s.OW};
        const int oh = (p - od * {s.OH * s.OW}) / {s.OW};
        const int ow = p - od * {s.OH * s.OW} - oh * {s.OW};
        d0 = od * {s.SD} - {s.PD};
        h0 = oh * {s.SH} - {s.PH};
        w0 = ow * {s.SW} - {s.PW};
        abase = b * {s.C * s.D * s.H * s.W};
    }}"""


def b_row_stride(s: Shape) -> int:
    """Elements between the filter values of consecutive GEMM columns (output channels)."""
    if not s.flip:
        return s.taps * s.C
    return s.taps if s.layout == Layout.NCDHW else 1
