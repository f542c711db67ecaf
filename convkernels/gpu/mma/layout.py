"""The tensor-core kernels' shared-memory layouts and the lanes' addresses in them: the
swizzled K-major layout that ``ldmatrix`` reads, the blocked N-major TF32 layout that 32-bit
loads read, and the byte each lane's ``ldmatrix`` row (or 32-bit register) comes from.

**Shared memory.**  Operands are staged in 16-byte chunks (8 16-bit or 4 TF32 values):
the unit of ``cp.async.cg`` and of one row of ``ldmatrix``.  An operand whose reduction
values are contiguous in memory (the input pixel's channels, the forward filter's) is
stored **K-major**: row ``r`` (a pixel, an output channel) of ``CPR = TK / CE`` chunks.
Chunk ``c`` of row ``r`` lies at chunk :func:`swizzle` ``(r, c)``: the chunk's index XOR
a 3-bit key of its row (``r % 8`` where a row spans 128 bytes or more, else the index of
its 128-byte line), so the eight rows one ``ldmatrix`` phase reads fall in eight
different groups of four banks.  The data gradient's filter has its output channels
contiguous: it is stored **N-major** (row = reduction value, chunks of 8 or 4
channels).  In 16 bits ``ldmatrix.trans`` reads it; in TF32, which ``ldmatrix`` cannot
transpose (it moves 16-bit values), one 32-bit shared load per register does, from the
:func:`blocked` layout: blocks of 4 rows x 8 values, so that one load's 32 lanes read one
block (32 banks) at an immediate offset from each lane's own address.
"""

#: Bytes per staged chunk: the unit of ``cp.async.cg`` and of one ``ldmatrix`` row.
CHUNK = 16


def swizzle(cpr: int, row: str, chunk: str) -> str:
    """C++ of the stored chunk index of chunk ``chunk`` of row ``row`` in rows of ``cpr``
    chunks: the index XOR a 3-bit key of the row (see the module docstring)."""
    lin = f"(({row}) * {cpr} + ({chunk}))"
    key = f"(({row}) & 7)" if cpr >= 8 else f"(({lin} >> 3) & 7)"
    return f"({lin} ^ {key})"


def blocked(cpr: int, row: str, chunk: str) -> str:
    """C++ of the stored chunk index of chunk ``chunk`` of row ``row`` in an N-major TF32
    tile of rows of ``cpr`` chunks, read with 32-bit loads: blocks of 4 rows x 2 chunks
    (8 x 4 values, 128 bytes), the blocks of 4 rows in a row, then the next 4 rows.  One
    load's lanes read one block (values ``g`` of rows ``t``: lane ``4 g + t``), so 32
    different banks, at one offset from each lane's own; 8 threads staging a block's 8
    chunks write 128 consecutive bytes."""
    return (f"(((({row}) >> 2) * {cpr // 2} + (({chunk}) >> 1)) * 8 + (({row}) & 3) * 2"
            f" + (({chunk}) & 1))")


def blocked_thread(cpr: int):
    """C++ of the row and the chunk that thread ``t`` stages in each round of an N-major
    TF32 tile (:func:`blocked`): the ``t``-th stored chunk, so that consecutive threads
    write consecutive bytes; a round covers ``NT / cpr`` rows (a multiple of 4)."""
    assert cpr % 2 == 0, cpr
    return (f"(((int)t >> 3) / {cpr // 2}) * 4 + (((int)t & 7) >> 1)",
            f"(((int)t >> 3) % {cpr // 2}) * 2 + ((int)t & 1)")


def a_address(s) -> str:
    """Byte offset of the 16-byte row lane ``ln`` names in ``ldmatrix.x4`` of A's MMA tile
    ``fm`` at MMA step ``kk``: (rows, chunk) = (0-7, 0), (8-15, 0), (0-7, 1), (8-15, 1).
    N-major (``.trans``): matrix ``j`` is reduction rows ``8 (j / 2)`` on of the 8 rows of
    A from ``8 (j % 2)``.  ``lds``: the byte of lane ``ln``'s register ``j`` itself
    (m16n8k8's A fragment: lane ``4 g + t`` holds rows ``g``, ``g + 8`` of columns ``t``,
    ``t + 4``)."""
    if s.a_mode == "lds":  # A[8 kk + t + 4 (j / 2)][wm WM + 16 fm + g + 8 (j % 2)]
        block = f"(kk * 2 + (j >> 1)) * {s.NCA // 2} + wm * {s.WM // 8} + fm * 2 + (j & 1)"
        return f"cb_lds_lane(ln) + ({block}) * 128"
    if s.a_mode == "trans":
        row = "kk * 16 + (ln >> 4) * 8 + (ln & 7)"
        chunk = f"(wm * {s.WM} + fm * 16 + ((ln >> 3) & 1) * 8) / 8"
        return f"{swizzle(s.NCA, row, chunk)} * {CHUNK}"
    row = f"wm * {s.WM} + fm * 16 + (ln & 7) + ((ln >> 3) & 1) * 8"
    return f"{swizzle(s.CPR, row, 'kk * 2 + (ln >> 4)')} * {CHUNK}"


def b_address(s) -> str:
    """Byte offset of the row lane ``ln`` names in ``ldmatrix.x4`` of B's MMA tiles
    ``2 fp`` and ``2 fp + 1``: (tile, chunk) = (0, 0), (0, 1), (1, 0), (1, 1).  N-major
    (``.trans``): matrix ``j`` is reduction rows ``8 (j % 2)`` on of 8 columns from
    ``8 (j / 2)``.  ``lds``: the byte of lane ``ln``'s register ``j`` (registers 0, 1 of
    tile ``2 fp``, then of ``2 fp + 1``; lane ``4 g + t`` holds rows ``t``, ``t + 4`` of
    column ``g``)."""
    if s.b_mode == "lds":  # B[8 kk + t + 4 (j % 2)][wn WN + 8 (2 fp + j / 2) + g]
        block = f"(kk * 2 + (j & 1)) * {s.NCH // 2} + wn * {s.WN // 8} + (fp * 2 + (j >> 1))"
        return f"cb_lds_lane(ln) + ({block}) * 128"
    if s.b_mode == "trans":
        row = "kk * 16 + ((ln >> 3) & 1) * 8 + (ln & 7)"
        chunk = f"(wn * {s.WN} + fp * 16 + (ln >> 4) * 8) / 8"
        return f"{swizzle(s.NCH, row, chunk)} * {CHUNK}"
    row = f"wn * {s.WN} + fp * 16 + (ln & 7) + (ln >> 4) * 8"
    return f"{swizzle(s.CPR, row, 'kk * 2 + ((ln >> 3) & 1)')} * {CHUNK}"
