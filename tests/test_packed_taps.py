"""Taps packed into K tiles in the pipelined SIMT forward (NDHWC, at most half a K tile
of channels: ``convkernels.gpu.simt.tiles.Shape.packed``): packed builds verify on the
CPU, with and without split-K, and a dropped tap fails the check."""

import pytest

from convbench import registry
from convbench.build import toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer
from convkernels.gpu.simt import gather, tiles

IMPL = "implicitGemmPipelined"
#: 4 channels (CosmoFlow MLPerf's first layer): a run of 4 values is one tap, one
#: 16-byte copy; 27 taps are 108 values, 14 K tiles of 8 (the last half past the end).
C4 = Layer("packed_c4", 2, 4, 20, 7, 6, 9, 3, 3, 3, pad=1)
#: 1 channel (v1's first layer): each value its own tap, 4-byte copies; stride 2.
C1 = Layer("packed_c1", 2, 1, 16, 9, 8, 7, 3, 3, 3, stride=2, pad=1)
#: 2 channels, no padding, a 16-value K tile (runs of two taps).
C2 = Layer("packed_c2", 1, 2, 24, 6, 7, 5, 3, 3, 3)

CASES = [(C4, {}), (C1, {}), (C2, {"CTAtileK": 16, "stages": 2}), (C4, {"splitK": 3}),
         (C1, {"splitK": 2})]


@pytest.mark.parametrize("layer, params", CASES,
                         ids=[f"{l.name}-{'-'.join(f'{k}{v}' for k, v in p.items()) or 'defaults'}"
                              for l, p in CASES])
def test_packed_builds_verify(layer, params, builds, reference):
    impl = registry.get(IMPL)
    s = tiles.shape(layer, impl.layout, impl.resolve_params(params))
    assert s.packed and s.KT == -(-s.RF // s.TK) < s.taps * s.CB
    spec = toolchain.make_spec(impl, layer, params=params)
    check = verify.verify_build(builds(spec), reference(layer))[0]
    assert check.ok, check.summary()


def test_a_split_tap_table_wraps_its_counter():
    """With split-K a slice stages past the reduction's end: the tap counter wraps there,
    so that the table (32 entries) and the mask's shift stay in range; unsplit, no tile
    is staged past the end and nothing wraps."""
    impl = registry.get(IMPL)
    split = tiles.shape(C1, impl.layout, impl.resolve_params({"splitK": 2}))
    whole = tiles.shape(C1, impl.layout, impl.resolve_params({}))
    assert split.tap_table and split.table_taps <= 32
    wrap = f"if (kd >= {split.table_taps}) kd = 0;"
    assert wrap in gather.packed_stage_code(split, "live")
    assert "kd = 0;" not in gather.packed_stage_code(whole)


def test_only_few_channels_pack():
    impl = registry.get(IMPL)
    deep = Layer("deep", 1, 16, 16, 4, 4, 4, 3, 3, 3, pad=1)
    assert not tiles.shape(deep, impl.layout, impl.resolve_params({})).packed
    ncdhw = registry.get("implicitGemmPipelinedNCDHW")
    assert not tiles.shape(C4, ncdhw.layout, ncdhw.resolve_params({})).packed


real_packed, real_mask = gather.packed_stage_code, gather.tap_mask


def _drop_last_tap(monkeypatch, s):
    """The last tap staged as zeros: past the filter row's end one tap early (B), or with
    the tap table (1 channel) left out of every pixel's mask (A)."""
    if s.tap_table:
        monkeypatch.setattr(gather, "tap_mask", lambda s: real_mask(s).replace(
            f"t < {s.taps};", f"t < {s.taps - 1};"))
    else:
        monkeypatch.setattr(gather, "packed_stage_code", lambda s, live="": real_packed(
            s, live).replace(f"c0 + bkv + e < {s.RF}", f"c0 + bkv + e < {s.RF - s.C}"))


@pytest.mark.parametrize("layer", [C4, C1], ids=["counters", "tap_table"])
def test_a_dropped_tap_fails(layer, builds, reference, monkeypatch):
    impl = registry.get(IMPL)
    s = tiles.shape(layer, impl.layout, impl.resolve_params({}))
    assert s.tap_table == (layer is C1)
    _drop_last_tap(monkeypatch, s)
    spec = toolchain.make_spec(impl, layer, planted=f"packed_dropped_tap_{layer.name}")
    planted = (f"t < {s.taps - 1};" if s.tap_table else f"c0 + bkv + e < {s.RF - s.C}")
    assert planted in gather.prologue_code(s, False) + gather.packed_stage_code(s)
    check = verify.verify_build(builds(spec), reference(layer))[0]
    assert not check.ok, check.summary()


def test_the_packed_main_loops_in_the_committed_tables():
    """``results/gpu/sass/pipelined/``: both first layers packed meet the pipelined
    kernels' bar: MLPerf conv1 (4 channels, a tap per run) and v1 conv1 (1 channel: four
    4-byte copies of A, each its own tap from the tap table, and four of B per thread and
    K tile)."""
    import csv
    from pathlib import Path
    from tests.test_pipelined import meets
    table = Path(__file__).resolve().parent.parent / "results" / "gpu" / "sass" / "pipelined"
    rows = {(f, r["layer"]): r for f in ("cosmoflow", "cosmoflow_mlperf")
            for r in csv.DictReader(open(table / f"{IMPL}-{f}.csv")) if r["main"] == "yes"}
    assert not meets(rows[("cosmoflow_mlperf", "conv1")])
    assert not meets(rows[("cosmoflow", "conv1")])
