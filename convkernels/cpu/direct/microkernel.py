"""The description of a register-blocked CPU kernel, before any text is written: the
taps each tile runs along a dimension (:class:`TapRange`), the bodies of the width tiles
(:class:`WidthCase`, :class:`WidthTap`), the statements of a micro-tile with the loads
they use (:class:`Load`, :class:`Update`, written out by :func:`vector_loops`), and the
decisions taken on it: which width tiles get bodies of their own
(:func:`written_out_tiles`) and whether the input is read where it lies
(:func:`reads_in_place`).  :mod:`convkernels.cpu.direct.blocking` emits the program text from it.
"""

import dataclasses
from typing import Callable, FrozenSet, List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class TapRange:
    """The taps of one spatial dimension that a tile of ``b`` output pixels runs: in a
    padded dimension a tap runs only if it reads the input (not the zero border) for at
    least one of the tile's pixels.  For the tile starting at output ``o0``,
    ``max(0, P - (o0 + b - 1) * S) <= k < min(K, I + P - o0 * S)``; tiles away from the
    border get every tap.  (Per-tile bounds are what a library's direct convolution
    does; padding costs no arithmetic then.)"""

    tap: str      # the loop variable: kd, kh or kw
    tile: str     # the tile index it is bounded by: odb, ohb or owb
    k: int        # taps
    pad: int
    size: int     # input size
    out: int      # output size
    b: int        # output pixels per tile
    S: int        # stride

    @property
    def tiles(self) -> int:
        return -(-self.out // self.b)

    def bounds(self, ob: int) -> Tuple[int, int]:
        """``(lo, hi)``: the taps tile ``ob`` runs (``lo >= hi``: none)."""
        o0 = ob * self.b
        return (max(0, self.pad - (o0 + self.b - 1) * self.S),
                min(self.k, self.size + self.pad - o0 * self.S))

    def loop(self, index: str, indent: str) -> str:
        """The ``for`` header of these bounds, with the tile index ``index`` a variable
        (the same bounds as :meth:`bounds`, as program text)."""
        if self.pad == 0:
            return f"{indent}for {self.tap} in range({self.k}):"
        o0 = f"{index} * {self.b}"
        return (f"{indent}for {self.tap} in range(max(0, {self.pad} - ({o0} + {self.b - 1}) * "
                f"{self.S}), min({self.k}, {self.size + self.pad} - {o0} * {self.S})):")

    def reads_input(self, o: int, k: int) -> bool:
        return reads_input(o, k, self.S, self.pad, self.size)


def tap_ranges(L, pixel_tile_shape) -> Tuple[TapRange, TapRange, TapRange]:
    """The :class:`TapRange` of the depth, height and width taps of a micro-tile."""
    db, hb, wb = pixel_tile_shape
    return (TapRange("kd", "odb", L.KD, L.PD, L.D, L.OD, db, L.S),
            TapRange("kh", "ohb", L.KH, L.PH, L.H, L.OH, hb, L.S),
            TapRange("kw", "owb", L.KW, L.PW, L.W, L.OW, wb, L.S))


@dataclasses.dataclass(frozen=True)
class Load:
    """A vector operand loaded once per vector loop: ``name = value(at)``, where ``at``
    is the text of the position the kernel's statements are written for (a width tap or
    an output column: its loop variable, or a constant where the loop is unrolled)."""

    name: str
    value: Callable[[str], str]


@dataclasses.dataclass(frozen=True)
class Update:
    """One statement of a micro-tile, ``text(at)``, and the :class:`Load` names it uses."""

    text: Callable[[str], str]
    uses: FrozenSet[str]


def vector_loops(indent, width, loads: Sequence[Load], groups: Sequence[Sequence[Update]],
                 size=0, at=None):
    """``for j in range(width)`` loops at ``indent`` minus one level, each with the
    ``loads`` that its statements use and the statements of ``size`` consecutive
    ``groups`` (0: all in one loop), written for position ``at`` (None: the statements'
    own loop variable).
    GCC's vectoriser puts every broadcast of a loop body at its top, so a micro-tile of
    many broadcasts in one loop has them all live beside its accumulators, and on 16
    vector registers some accumulators then live on the stack (every FMA a load-add-store
    chain); loops of a few groups each keep only theirs live (the loads that repeat are
    shared by the compiler).  The first line is the first loop's header."""
    size = size or len(groups)
    outer = indent[:-4]
    lines = []
    for start in range(0, len(groups), size):
        body = [update for group in groups[start:start + size] for update in group]
        names = set().union(*(update.uses for update in body))
        lines.append(f"{outer}for j in range({width}):")
        lines += [f"{indent}{load.name} = {_at(load.value, at)}" for load in loads
                  if load.name in names]
        lines += [f"{indent}{_at(update.text, at)}" for update in body]
    return lines


def _at(render: Callable[..., str], at: Optional[str]) -> str:
    return render() if at is None else render(at)


def reads_input(o, k, S, pad, size):
    """Whether output ``o``'s tap ``k`` reads the input (not the zero border) in a
    dimension of ``size`` padded by ``pad`` at stride ``S``."""
    return 0 <= o * S + k - pad < size


@dataclasses.dataclass(frozen=True)
class WidthTap:
    """A width tap written out in an edge body, with the tile columns whose input it
    reads (not the zero border)."""

    kw: int
    columns: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class WidthCase:
    """One body of the micro-tile along the width.  ``tile``: the width tile it is
    written for (None: the tiles between, or every tile); ``keyword``: ``if``, ``elif``,
    ``else`` or None (one body for all tiles); ``taps`` None: the width taps run as a
    loop bounded per tile (:class:`TapRange`), else written out; ``width``: the tile's
    pixels along the width (None: ``wb``)."""

    tile: Optional[int]
    keyword: Optional[str]
    taps: Optional[Tuple[WidthTap, ...]]
    width: Optional[int]

    def condition(self, owb: str) -> Optional[str]:
        """The ``if``/``elif``/``else`` text on the width tile index ``owb``."""
        if self.keyword in (None, "else"):
            return self.keyword
        return f"{self.keyword} {owb} == {self.tile}"


def width_cases(L, pixel_tile_shape) -> List[WidthCase]:
    """The bodies of the micro-tile along the width (:class:`WidthCase`).

    The first and the last width tile get bodies of their own when the width is padded
    (a tap that reads the border for one of the tile's pixels then costs nothing for the
    others: in the transposed convolution of the backward data pass, the border is
    ``k - 1`` wide, and whole-row tiles would otherwise spend a quarter of their FMAs on
    zeros at CosmoFlow's 8^3) or when ``wb`` does not divide the width (the last tile is
    then shorter).  Every other layer keeps the single body.  The tiles between keep the
    loop bounded per tile, which still runs a border tap for all of a tile's pixels where
    the border reaches past the first tile (``wb * S`` below the padding) or past a short
    last one: correct (the border is zero), only not exact there."""
    width = tap_ranges(L, pixel_tile_shape)[2]
    wb, tiles = width.b, width.tiles
    last = L.OW - (tiles - 1) * wb

    def taps(tile, pixels):
        o0 = tile * wb
        used = [WidthTap(kw, tuple(wi for wi in range(pixels) if width.reads_input(o0 + wi, kw)))
                for kw in range(L.KW)]
        return tuple(tap for tap in used if tap.columns)

    if tiles == 1:
        return [WidthCase(0, None, taps(0, last) if L.PW or last != wb else None, None)]
    if not L.PW and last == wb:
        return [WidthCase(None, None, None, None)]
    cases = []
    if L.PW:
        cases.append(WidthCase(0, "if", taps(0, wb), None))
    if tiles > 2 or not cases:
        cases.append(WidthCase(tiles - 1, "elif" if cases else "if", taps(tiles - 1, last),
                               last))
        cases.append(WidthCase(None, "else", None, None))
    else:
        cases.append(WidthCase(tiles - 1, "else", taps(tiles - 1, last), last))
    return cases


def written_out_tiles(L, pixel_tile_shape):
    """The width tile indices whose body has its width taps written out per pixel
    (:func:`width_cases` with edge bodies)."""
    return {case.tile for case in width_cases(L, pixel_tile_shape) if case.taps is not None}


def reads_in_place(L, pixel_tile_shape, edge):
    """Whether every tap that a micro-tile runs reads the input (not the zero border) for
    every one of its pixels, in every tile: then the kernel can read the unpadded input
    where it lies, and the padded copy (a pass over the whole input per call: up to a
    quarter of the pass on CosmoFlow's large layers on the Xeon) is not needed.  True in a
    padded dimension when its tiles are one pixel deep (the per-tile tap bounds of
    :func:`convkernels.cpu.direct.blocking.tap_loops` are then exact), and along the width with ``edge`` bodies
    (:func:`width_cases`) when the border does not
    reach past the first or the last width tile."""
    exact = written_out_tiles(L, pixel_tile_shape) if edge else set()
    for taps, skip in zip(tap_ranges(L, pixel_tile_shape), (set(), set(), exact)):
        for ob in range(taps.tiles):
            lo, hi = taps.bounds(ob)
            if ob in skip or lo >= hi:
                continue
            o0 = ob * taps.b
            if not all(taps.reads_input(o0 + i, k)
                       for i in range(min(taps.b, taps.out - o0)) for k in (lo, hi - 1)):
                return False
    return True
