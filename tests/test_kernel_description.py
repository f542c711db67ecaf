"""The register-blocked CPU kernels are described before they are written: the taps each
tile runs, the bodies of the width tiles and the statements with their loads.  These
tests show that the description decides, and that the text only renders it."""

import dataclasses
import itertools
import re

import pytest

from convbench.layersets.layer import Layer
from convkernels.layouts import Layout
from convkernels.cpu.direct import blocking, microkernel
from convkernels.layer import layer_constants

PADDED = Layer("p2", 1, 4, 8, 6, 6, 17, 3, 3, 3, pad=2)


def _blocked_text(layer, tile=(1, 1, 4), **kw):
    L = layer_constants(layer, Layout.NDHWC)
    return blocking.blocked_source(L, "float32", *tile, 8, False, **kw)


DIMS = [(k, pad, size, S, b) for k, pad, size, S, b in itertools.product(
    (1, 3, 5), (0, 1, 2, 4), (4, 9), (1, 2), (1, 3, 4)) if size + 2 * pad >= k]


@pytest.mark.parametrize("k,pad,size,S,b", DIMS)
def test_tap_bounds_as_text_are_the_bounds_of_the_description(k, pad, size, S, b):
    """The loop header a tile's taps are emitted as runs exactly the taps that
    ``TapRange.bounds`` gives the decisions (evaluated for every tile)."""
    out = (size + 2 * pad - k) // S + 1
    taps = microkernel.TapRange("kw", "owb", k, pad, size, out, b, S)
    for ob in range(taps.tiles):
        header = taps.loop("owb", "").replace("owb", str(ob))
        args = re.fullmatch(r"for kw in range\((.*)\):", header).group(1)
        text = list(eval(f"range({args})"))  # noqa: S307 (our own text)
        lo, hi = taps.bounds(ob)
        assert text == list(range(lo, hi)), (ob, header)


def test_the_decisions_do_not_read_the_text(monkeypatch):
    """Render the width cases' conditions differently: the program text changes, and
    which tiles get bodies of their own and whether the input is read in place do not."""
    L = layer_constants(PADDED, Layout.NDHWC)
    tile = (1, 1, 4)
    before = (microkernel.written_out_tiles(L, tile), microkernel.reads_in_place(L, tile, True))
    text = _blocked_text(PADDED, edge=True)
    monkeypatch.setattr(microkernel.WidthCase, "condition", lambda self, owb: (
        self.keyword if self.keyword in (None, "else") else f"{self.keyword} {self.tile} == {owb}"))
    assert _blocked_text(PADDED, edge=True) != text
    assert (microkernel.written_out_tiles(L, tile),
            microkernel.reads_in_place(L, tile, True)) == before
    assert before == ({0, 4}, True)


def test_the_description_decides_which_taps_run(monkeypatch):
    """Take tap kw=0 out of the first width tile's description: that body loses the
    statements of kw=0 (and only them), the other bodies keep theirs."""
    def statements_per_body(text):
        bodies = re.split(r"\n\s+(?:if|elif) owb == \d+:|\n\s+else:", text)
        return [len(re.findall(r"\+= x\[.*\* 1 \+ 0, c\]", body)) for body in bodies[1:]]
    full = statements_per_body(_blocked_text(PADDED, edge=True))
    real = blocking.width_cases

    def without_first_tap(L, tile):
        cases = real(L, tile)
        first = cases[0]
        taps = tuple(tap for tap in first.taps if tap.kw != 0)
        return [dataclasses.replace(first, taps=taps)] + cases[1:]
    monkeypatch.setattr(blocking, "width_cases", without_first_tap)
    fewer = statements_per_body(_blocked_text(PADDED, edge=True))
    assert full[0] > 0 and fewer[0] == 0 and fewer[1:] == full[1:], (full, fewer)


def test_a_load_is_emitted_where_a_statement_uses_it():
    """A vector loop loads what its statements declare they use, in the loads' order,
    and nothing else (no search of the statements' text)."""
    loads = [microkernel.Load("a", lambda at="p": f"A[{at}]"),
             microkernel.Load("b", lambda at="p": f"B[{at}]")]
    uses_b = microkernel.Update(lambda at="p": f"s += b * {at}", frozenset({"b"}))
    uses_both = microkernel.Update(lambda at="p": f"s += a * b", frozenset({"a", "b"}))
    lines = microkernel.vector_loops("        ", 8, loads, [[uses_b]], at="3")
    assert lines == ["    for j in range(8):", "        b = B[3]", "        s += b * 3"]
    lines = microkernel.vector_loops("        ", 8, loads, [[uses_b], [uses_both]], size=1)
    assert [line.strip() for line in lines] == [
        "for j in range(8):", "b = B[p]", "s += b * p",
        "for j in range(8):", "a = A[p]", "b = B[p]", "s += a * b"]
