"""The register-blocked CPU kernels (``directConvNDHWCblocked`` and its dot-product form):
their tiles and statements, the border taps each tile skips, the width-edge bodies, the
in-place reads, and planted bugs in each, caught."""

import dataclasses
import sys

import pytest

from cases import Case, case_params, params_of, verify_case
from convbench import registry
from convbench.build import toolchain
from convbench.check import verify
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers
from test_tuning import BLOCKED, DOT, LAYER


# -- the register-blocked implementation --------------------------------------------------------

def test_blocked_tiles_and_parallel_map():
    import dace
    from convkernels.cpu.direct.blocking import largest_divisor
    from convkernels.cpu.direct.forward import tile_sizes
    assert largest_divisor(12, 8) == 6 and largest_divisor(7, 16) == 7 and largest_divisor(17, 16) == 1
    params = registry.get(BLOCKED).resolve_params({"PIX": 8, "NB": 16, "NV": 2})
    layer = load_layers("cosmoflow_mlperf")[4].with_batch(2)  # 8^3 out, K = 512
    assert tile_sizes(layer, params) == (1, 1, 8, 16, 2)  # 8 pixels x 2 vectors
    assert tile_sizes(layer, dict(params, PIX=16, NV=1)) == (1, 2, 8, 16, 1)  # 16 x 1
    sdfg = toolchain.make_sdfg(toolchain.make_spec(registry.get(BLOCKED), LAYER))
    maps = [n.map for n, _ in sdfg.all_nodes_recursive() if isinstance(n, dace.nodes.MapEntry)]
    tile_map = [m for m in maps if "ohb" in m.params]  # (K = 32: one channel tile, no kb)
    assert tile_map and tile_map[0].collapse == len(tile_map[0].params)
    assert tile_map[0].schedule == dace.ScheduleType.CPU_Multicore


def test_blocked_statement_count_follows_the_tile():
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants
    from convkernels.cpu.direct.blocking import blocked_source as _source
    text = _source(layer_constants(LAYER, Layout.NDHWC), "float32", 1, 2, 8, 16, False)
    assert text.count("] * wv0") == 16 and text.count("acc[15, j] +=") == 1
    # two vectors of 16 channels: one input load feeds two FMAs, 2 x 8 accumulators
    text = _source(layer_constants(LAYER, Layout.NDHWC), "float32", 1, 1, 8, 16, False, nv=2)
    assert text.count("] * wv0") == 8 and text.count("] * wv1") == 8
    assert "acc[15, j] += x[" in text and "wv1 = wp[0, kd, kh, kw, c, 16 + j]" in text


# -- the dot-product form ----------------------------------------------------------------------



def test_dot_tile_and_statements():
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants
    from convkernels.cpu.direct.dot import dot_source as _source, tile_sizes
    impl = registry.get(DOT)
    layer = load_layers("cosmoflow_mlperf")[4].with_batch(2)  # 8^3 out, C = 256, K = 512
    assert tile_sizes(layer, impl.resolve_params({"KT": 4, "CV": 16})) == (1, 1, 4, 4, 16)
    assert tile_sizes(layer, impl.resolve_params({"PIX": 6, "KT": 3, "CV": 16})) == (1, 1, 4, 2, 16)
    text = _source(layer_constants(layer, Layout.NDHWC), "float32", 1, 2, 2, 4, 16, True)
    # 4 pixels x 4 channels: 4 input and 4 filter vector loads, 16 FMA statements
    assert text.count("] += x") == 16 and text.count("acc[15, j] += x3 * w3") == 1
    assert all(f"    x{p} = x[" in text and f"    w{p} = w[" in text for p in range(4))
    assert "wp" not in text  # the filter is read in place
    with pytest.raises(UsageError, match="accumulator vectors"):
        impl.resolve_params({"PIX": 8, "KT": 4})


def _tap_ranges(layer, tile):
    """{(dim, tile index): the taps the generated loops run}, by evaluating their bounds."""
    import re

    from convkernels.layouts import Layout
    from convkernels.cpu.direct.blocking import tap_loops
    from convkernels.layer import layer_constants
    L = layer_constants(layer, Layout.NDHWC)
    lines, _ = tap_loops(L, tile, {"odb": "odb", "ohb": "ohb", "owb": "owb"}, "")
    out = {}
    for line, name, size in zip(lines, ("odb", "ohb", "owb"), (L.OD, L.OH, L.OW)):
        bounds = re.match(r"\s*for k[dhw] in range\((.*)\):$", line).group(1)
        b = tile[("odb", "ohb", "owb").index(name)]
        for ob in range(size // b):
            lo_hi = eval(f"({bounds})".replace(name, str(ob)))  # noqa: S307 (our own text)
            out[name, ob] = range(*lo_hi) if isinstance(lo_hi, tuple) else range(lo_hi)
    return out


@pytest.mark.parametrize("layer,tile", [
    (Layer("p1", 1, 2, 2, 8, 8, 8, 3, 3, 3, pad=1), (1, 2, 4)),
    (Layer("p2s2", 1, 2, 2, 7, 6, 9, 3, 3, 3, stride=2, pad=2), (5, 2, 3)),
    (Layer("p0", 1, 2, 2, 6, 6, 6, 3, 3, 3), (2, 2, 2)),
    (Layer("k5", 1, 2, 2, 5, 9, 4, 5, 5, 5, pad=2), (1, 3, 2)),
    (Layer("aniso", 1, 2, 2, 5, 6, 7, 3, 3, 3, stride=2, pad=1, pad_d=2, pad_w=0), (2, 1, 3))],
    ids=lambda v: v.name if isinstance(v, Layer) else "x".join(map(str, v)))
def test_tap_bounds_skip_exactly_the_border_taps(layer, tile):
    """Per tile, the loops run exactly the taps that read the input (not the zero border)
    for at least one of the tile's pixels: checked against counting them out."""
    sizes = {"odb": (layer.in_d, layer.k_d, layer.pads[0], layer.out_d),
             "ohb": (layer.in_h, layer.k_h, layer.pads[1], layer.out_h),
             "owb": (layer.in_w, layer.k_w, layer.pads[2], layer.out_w)}
    ranges = _tap_ranges(layer, tile)
    for (name, ob), taps in ranges.items():
        size, k, pad, _ = sizes[name]
        b = tile[("odb", "ohb", "owb").index(name)]
        needed = [t for t in range(k) if any(0 <= (ob * b + i) * layer.stride + t - pad < size
                                             for i in range(b))]
        assert list(taps) == needed, (name, ob)


BORDER = [Case(name, layer, "border", params=params_of(params))
          for layer in (Layer("edge_s2", 1, 16, 8, 7, 6, 9, 3, 3, 3, stride=2, pad=2),
                        Layer("edge_p1", 2, 32, 16, 5, 4, 6, 3, 3, 3, pad=1))
          for name, params in ((BLOCKED, {"PIX": 8, "WB": 2}), (BLOCKED, {"PIX": 3}),
                               (DOT, {"PIX": 6, "WB": 2, "KT": 4}),
                               (DOT, {"PIX": 2, "KT": 8, "KOUTER": 1}))]


#: Fast tier: the strided layer; full tier: the stride-1 one (batch 2) as well.
@pytest.mark.parametrize("case", case_params(BORDER[:4], BORDER))
def test_blocked_kernels_at_padded_borders(case, builds, reference, coverage):
    """Tiles that straddle the zero border in several dimensions at once, strided."""
    verify_case(case, builds, reference, coverage)


@pytest.mark.parametrize("name", [BLOCKED, DOT])
def test_a_skipped_border_tap_is_caught(name, monkeypatch, builds, reference):
    """Plant a bound one tap too tight (the first tap of each padded dimension's range
    skipped): the verification must fail."""
    from convkernels.cpu.direct import blocking
    real = blocking.tap_loops

    def too_tight(L, tile, index, indent):
        lines, depth = real(L, tile, index, indent)
        return [line.replace("range(max(0, ", "range(1 + max(0, ") for line in lines], depth
    monkeypatch.setattr(blocking, "tap_loops", too_tight)
    layer = Layer("bug", 1, 16, 16, 4, 4, 8, 3, 3, 3, pad=1)
    impl = registry.get(name)
    build = builds(toolchain.make_spec(impl, layer, planted="tap_bound_too_tight"))
    check = verify.verify_build(build, reference(layer))[0]
    assert not check.ok, "a dropped border tap went unnoticed"


BLOCKED_BWD_DATA = "directConvNDHWCblockedBwdData"

#: Width tiles with bodies of their own (EDGE): the first and last tiles' taps written
#: out per pixel, ragged last tiles (EDGE 2; with three tiles and stride 2, the ``elif``
#: body), a single tile that is both, channel blocks adding into the output (CBLK 4 of
#: 8), and the old path (EDGE 0); forward (strided, padded, unpadded) and data gradient
#: (whose transposed convolution pads by k - 1).
EDGE = [Case(name, layer, "edge", params=params_of(params)) for name, layer, params in (
    (BLOCKED, Layer("edge_s2", 1, 16, 8, 7, 6, 9, 3, 3, 3, stride=2, pad=2),
     {"PIX": 4, "EDGE": 2}),
    (BLOCKED, Layer("edge_s2", 1, 16, 8, 7, 6, 9, 3, 3, 3, stride=2, pad=2),
     {"PIX": 8, "WB": 2, "EDGE": 0}),
    (BLOCKED, Layer("edge_p0", 1, 8, 16, 4, 5, 11, 3, 3, 3), {"PIX": 4, "NB": 8, "EDGE": 2}),
    (BLOCKED, Layer("edge_s2r", 1, 16, 8, 5, 4, 15, 3, 3, 3, stride=2, pad=2),
     {"PIX": 4, "NB": 8, "EDGE": 2}),
    (BLOCKED, Layer("edge_aniso", 1, 8, 16, 4, 5, 10, 3, 3, 3, pad=1, pad_w=2),
     {"PIX": 3, "NB": 8, "GROUP": 2, "EDGE": 2}),
    (BLOCKED_BWD_DATA, Layer("edge_bd", 2, 16, 8, 5, 6, 7, 3, 3, 3),
     {"PIX": 4, "NB": 4, "NV": 2, "EDGE": 2, "PACK": 0}),
    (BLOCKED_BWD_DATA, Layer("edge_bd", 2, 16, 8, 5, 6, 7, 3, 3, 3),
     {"PIX": 12, "NB": 8, "NV": 1, "EDGE": 1, "PACK": 1, "CBLK": 4}),
    (BLOCKED_BWD_DATA, Layer("edge_bd1", 2, 16, 8, 5, 6, 10, 3, 3, 3, pad=1),
     {"PIX": 3, "NB": 8, "NV": 1, "EDGE": 1, "GROUP": 1}),
    # The padding as wide as the kernel: the first and last width tiles read no input
    (BLOCKED, Layer("edge_k1", 1, 3, 8, 3, 3, 3, 1, 1, 1, pad=1), {"PIX": 1, "NB": 8}))]


@pytest.mark.parametrize("case", case_params(EDGE))
def test_blocked_kernels_with_width_edge_bodies(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


@pytest.mark.parametrize("layer,wb", [
    (Layer("p1", 1, 2, 2, 8, 8, 8, 3, 3, 3, pad=1), 4),
    (Layer("p2s2", 1, 2, 2, 7, 6, 9, 3, 3, 3, stride=2, pad=2), 4),
    (Layer("p0", 1, 2, 2, 6, 6, 11, 3, 3, 3), 4),
    (Layer("k5", 1, 2, 2, 5, 9, 12, 5, 5, 5, pad=4), 5),
    (Layer("one", 1, 2, 2, 5, 9, 6, 3, 3, 3, pad=2), 8),
    (Layer("two", 1, 2, 2, 5, 9, 6, 3, 3, 3, pad=1), 3)],
    ids=lambda v: v.name if isinstance(v, Layer) else str(v))
def test_width_cases_run_exactly_the_taps_that_read_the_input(layer, wb):
    """Each width tile goes to one body; a body with written-out taps runs, per pixel of
    the tile, exactly the taps that read the input (checked against counting them out),
    and only the tiles in the middle go to the loop bounded per tile."""
    from convkernels.layouts import Layout
    from convkernels.cpu.direct.microkernel import width_cases
    from convkernels.layer import layer_constants
    L = layer_constants(layer, Layout.NDHWC)
    cases = width_cases(L, (1, 1, wb))
    tiles = -(-L.OW // wb)
    for ob in range(tiles):
        taken = None
        for case in cases:  # the emitted condition, and the tile the description names
            condition = case.condition("owb")
            test = condition.split(" ", 1)[1] if condition not in (None, "else") else "True"
            if eval(test.replace("owb", str(ob))):  # noqa: S307 (our own text)
                assert case.tile in (ob, None), (ob, case)
                taken = (case.taps, case.width)
                break
        taps, width = taken
        pixels = min(wb, L.OW - ob * wb)
        assert (width or wb) == pixels, ob
        needed = {(kw, wi) for kw in range(L.KW) for wi in range(pixels)
                  if 0 <= (ob * wb + wi) * L.S + kw - L.PW < L.W}
        if taps is None:  # the loop: a tile with every pixel and no border waste but its own
            assert 0 < ob < tiles - 1 or (not L.PW and pixels == wb), ob
        else:
            assert {(tap.kw, wi) for tap in taps for wi in tap.columns} == needed, ob


def test_a_dropped_edge_tap_is_caught(monkeypatch, builds, reference):
    """Plant a written-out width tap that skips its last pixel: the verification of the
    data gradient (whose tiles are all edge tiles here) must fail."""
    from convkernels.cpu.direct import blocking
    real = blocking.width_cases

    def dropping(L, tile):
        cases = real(L, tile)
        first = cases[0]
        taps = tuple(dataclasses.replace(tap, columns=tap.columns[:-1]) for tap in first.taps)
        return [dataclasses.replace(first, taps=taps)] + cases[1:]
    monkeypatch.setattr(blocking, "width_cases", dropping)
    layer = Layer("bug_edge", 1, 16, 8, 4, 4, 6, 3, 3, 3)
    impl = registry.get(BLOCKED_BWD_DATA)
    spec = toolchain.make_spec(impl, layer, params={"PIX": 4, "NB": 8, "NV": 1, "EDGE": 2},
                               planted="edge_tap_dropped")
    check = verify.verify_build(builds(spec), reference(layer, pass_="bwd_data"))[0]
    assert not check.ok, "a dropped edge tap went unnoticed"


@pytest.mark.parametrize("layer,tile,edge,expected", [
    (Layer("p2", 1, 2, 2, 6, 6, 34, 3, 3, 3, pad=2), (1, 1, 8), True, True),
    (Layer("p2", 1, 2, 2, 6, 6, 34, 3, 3, 3, pad=2), (1, 1, 8), False, False),
    (Layer("p2", 1, 2, 2, 6, 6, 34, 3, 3, 3, pad=2), (2, 1, 8), True, False),
    (Layer("p2", 1, 2, 2, 6, 6, 34, 3, 3, 3, pad=2), (1, 2, 8), True, False),
    (Layer("p2", 1, 2, 2, 6, 6, 34, 3, 3, 3, pad=2), (1, 1, 1), False, True),
    (Layer("p1h", 1, 2, 2, 6, 6, 8, 3, 3, 3, pad=1, pad_d=0, pad_h=0), (2, 3, 4), True, True),
    (Layer("p0", 1, 2, 2, 6, 6, 8, 3, 3, 3), (2, 2, 2), False, True),
    (Layer("s2", 1, 2, 2, 7, 6, 15, 3, 3, 3, stride=2, pad=2), (1, 1, 4), True, True),
    (Layer("k5", 1, 2, 2, 5, 9, 12, 5, 5, 5, pad=4), (1, 1, 2), True, False)],
    ids=lambda v: v.name if isinstance(v, Layer) else str(v))
def test_reads_in_place_only_where_every_tap_reads_the_input(layer, tile, edge, expected):
    """Padded dimensions need tiles one pixel thick (their tap bounds are then exact:
    also along the width, without edge bodies), or, along the width, edge bodies and a
    border that ends inside the first and the last tile."""
    from convkernels.layouts import Layout
    from convkernels.cpu.direct.microkernel import reads_in_place
    from convkernels.layer import layer_constants
    assert reads_in_place(layer_constants(layer, Layout.NDHWC), tile, edge) is expected


#: Blocked kernels reading their (unpadded) input in place, verified with it between NaN
#: guards: forward padded, strided and anisotropic; data gradient (padded by k - 1).
IN_PLACE = [Case(name, layer, "inplace", params=params_of(params)) for name, layer, params in (
    (BLOCKED, Layer("ip_s2", 1, 16, 8, 7, 6, 15, 3, 3, 3, stride=2, pad=2), {"PIX": 4, "EDGE": 2}),
    (BLOCKED, Layer("ip_p1", 2, 8, 16, 4, 5, 10, 3, 3, 3, pad=1, pad_w=2),
     {"PIX": 4, "NB": 8, "EDGE": 1}),
    (BLOCKED_BWD_DATA, Layer("ip_bd", 2, 16, 8, 5, 6, 7, 3, 3, 3),
     {"PIX": 4, "NB": 8, "NV": 1, "EDGE": 2}))]


def _reads_in_place(case) -> bool:
    from convkernels.layouts import Layout
    from convkernels.cpu.direct.blocking import input_modes
    from convkernels.layer import layer_constants
    from convkernels.transposed import transposed_layer
    impl = case.implementation
    params = case.resolved_params()
    layer = transposed_layer(case.layer) if impl.name == BLOCKED_BWD_DATA else case.layer
    tile = sys.modules[impl.algorithm.__module__].tile_sizes(case.layer, params)[:3]
    return input_modes(layer_constants(layer, Layout.NDHWC), tile, params)[1]


#: Fast tier: the edge-body cases that read in place (the same shapes: forward strided,
#: padded and anisotropic, data gradient; verified by the edge-body test); full tier:
#: IN_PLACE too, verified here.
IN_PLACE_FAST = [c for c in EDGE if _reads_in_place(c)]


@pytest.mark.parametrize("case", case_params(IN_PLACE_FAST, IN_PLACE))
def test_blocked_kernels_reading_in_place(case, builds, reference, coverage):
    assert _reads_in_place(case)
    assert "xp" not in builds(case.spec()).sdfg.arrays, "the input was copied"
    if case in IN_PLACE:
        verify_case(case, builds, reference, coverage)


def test_a_border_read_in_place_is_caught(monkeypatch, builds, reference):
    """Plant in-place reads for tiles four pixels high at a zero border (some of their
    pixels' taps then read outside the input: a neighbouring row's values, or NaN past
    the ends of the guarded input): the verification must fail."""
    from convkernels.cpu.direct import blocking
    monkeypatch.setattr(blocking, "reads_in_place", lambda *args: True)
    layer = Layer("bug_inplace", 1, 8, 16, 4, 4, 4, 3, 3, 3, pad=1)
    impl = registry.get(BLOCKED)
    spec = toolchain.make_spec(impl, layer, params={"PIX": 16, "NB": 8, "NV": 1, "EDGE": 1},
                               planted="border_read_in_place")
    build = builds(spec)
    assert "xp" not in build.sdfg.arrays
    check = verify.verify_build(build, reference(layer))[0]
    assert not check.ok, "reads of the zero border in place went unnoticed"
