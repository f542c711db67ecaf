"""Split-K in the pipelined SIMT forward and data gradient (``splitK``,
:func:`convkernels.gpu.simt.tiles.split`): sliced builds verify on the CPU in both layouts,
the automatic rule splits only where the output tiles give few blocks, and a dropped
slice or a slice that starts at the wrong K tile fails the check."""

import csv
from pathlib import Path

import pytest

from cases import Case, case_params, cosmoflow, verify_case
from convbench import registry
from convbench.build import toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer
from convkernels.gpu.simt import filter_gradient, gather, tiles

#: 36 channels: five channel blocks of 8 per tap, 135 K tiles, so 4 slices of 34 leave a
#: last slice of 33 (its last step stages zeros); a row and a column tail of the tiles.
LAYER = Layer("split_c36_k70", 2, 36, 70, 5, 6, 7, 3, 3, 3, pad=1)
#: A small deep layer (the shape of CosmoFlow's last ones): 2 x 3^3 outputs, 64 -> 40
#: channels, one block of tiles, which the automatic rule splits.
SMALL_DEEP = Layer("split_small_deep", 2, 64, 40, 3, 3, 3, 3, 3, 3, pad=1)

CASES = [("implicitGemmPipelined", "fwd", LAYER, {"splitK": 4}),
         ("implicitGemmPipelinedNCDHW", "fwd", LAYER, {"splitK": 3}),
         ("implicitGemmPipelinedBwdData", "bwd_data", LAYER, {"splitK": 5}),
         ("implicitGemmPipelined", "fwd", SMALL_DEEP, {"splitK": 0})]
FULL = [("implicitGemmPipelinedNCDHWBwdData", "bwd_data", LAYER, {"splitK": 2}),
        ("implicitGemmPipelinedBwdData", "bwd_data", SMALL_DEEP, {"splitK": 0}),
        ("implicitGemmPipelinedNCDHW", "fwd", SMALL_DEEP, {"splitK": 7})]


def _ids(cases):
    return [f"{n}-{l.name}-{p['splitK'] or 'auto'}" for n, _, l, p in cases]


def _check(name, pass_, layer, params, builds, reference, planted=""):
    spec = toolchain.make_spec(registry.get(name), layer, params=params, planted=planted)
    return verify.verify_build(builds(spec), reference(layer, pass_=pass_))[0]


@pytest.mark.parametrize("name, pass_, layer, params",
                         [pytest.param(*c, id=i) for c, i in zip(CASES, _ids(CASES))]
                         + [pytest.param(*c, id=i, marks=pytest.mark.full)
                            for c, i in zip(FULL, _ids(FULL))])
def test_sliced_builds_verify(name, pass_, layer, params, builds, reference):
    impl = registry.get(name)
    s = tiles.shape(layer if pass_ == "fwd" else _transposed(layer), impl.layout,
                    impl.resolve_params(params), flip=pass_ != "fwd")
    assert s.split, "the case is not split"
    check = _check(name, pass_, layer, params, builds, reference)
    assert check.ok, check.summary()


def _transposed(layer):
    from convkernels.transposed import transposed_layer
    return transposed_layer(layer)


def test_the_automatic_rule_splits_only_small_grids():
    """``splitK=0``: no split where the tiles give 264 blocks or more; where they give
    fewer, slices of at least ``stages`` K tiles; ``splitK=1``, the default: never."""
    impl = registry.get("implicitGemmPipelined")
    assert impl.resolve_params({})["splitK"] == 1
    auto = impl.resolve_params({"splitK": 0})
    big = Layer("big", 16, 64, 128, 18, 18, 18, 3, 3, 3, pad=1)  # 2048 blocks
    assert not tiles.shape(big, impl.layout, auto).split
    s = tiles.shape(SMALL_DEEP, impl.layout, auto)
    assert s.split and s.TPS >= s.S and s.Z * s.TPS >= s.KT > (s.Z - 1) * s.TPS
    assert not tiles.shape(SMALL_DEEP, impl.layout, {**auto, "splitK": 1}).split


def _drop_first_slice(s, gpu):
    text = filter_gradient.wgrad_reduce(s, gpu)
    return text.replace("int z = 0;", "int z = 1;")


def _start_one_tile_early(s):
    text = real_first_tile(s)
    return text.replace(f"const int first = (int)blk_z * {s.TPS}",
                        f"const int first = (int)blk_z * {s.TPS} - ((int)blk_z > 0)")


real_first_tile = gather.first_tile


@pytest.mark.parametrize("plant", ["a_dropped_slice", "slices_one_tile_early"])
def test_planted_split_bugs_fail(plant, builds, reference, monkeypatch):
    """The sum that leaves out slice 0, and slices after the first that start one K tile
    early (the tile before each counted twice, the last tile never), each fail the
    check."""
    from convkernels.gpu.simt import forward
    if plant == "a_dropped_slice":
        real = forward.code
        monkeypatch.setattr(forward, "code",
                            lambda split=False: {**real(split), "reduce": _drop_first_slice}
                            if split else real(split))
    else:
        monkeypatch.setattr(gather, "first_tile", _start_one_tile_early)
    check = _check("implicitGemmPipelined", "fwd", LAYER, {"splitK": 4}, builds, reference,
                   planted=f"splitk_{plant}")
    assert not check.ok, check.summary()


# -- the machine code -------------------------------------------------------------------------

SPLIT_TABLES = Path(__file__).resolve().parent.parent / "results" / "gpu" / "sass" / "pipelined" / "split"


@pytest.mark.parametrize("impl", ["implicitGemmPipelined", "implicitGemmPipelinedBwdData"])
@pytest.mark.parametrize("layer_set, batch", [("cosmoflow", 16), ("cosmoflow_mlperf", 2)])
def test_the_split_main_loops_meet_the_bar(impl, layer_set, batch):
    """``results/gpu/sass/pipelined/split/``: with ``splitK=0`` on every CosmoFlow layer
    with at least 32 channels (v1 at batch 16, the training step's MLPerf layers at batch
    2), the main kernel is the sliced one where the tiles are few, and its loop meets the
    pipelined kernels' bar (80% FFMA, no IMAD.WIDE, no spills)."""
    from convbench.layersets.sets import load_layers
    from tests.test_pipelined import meets
    rows = {r["layer"]: r for r in csv.DictReader(open(SPLIT_TABLES / f"{impl}-{layer_set}-split.csv"))
            if r["main"] == "yes"}
    split = 0
    for layer in load_layers(layer_set):
        if layer.in_channels < 32:
            continue
        row = rows[layer.name]
        assert int(row["batch"]) == batch and "splitK=0" in row["config"]
        assert not meets(row), (layer.name, meets(row))
        split += "wgrad_pipelined" in row["kernel"]  # the sliced program's kernel
    assert split, "no layer of the table is split"


# -- the full tier: every CosmoFlow layer, split where the rule splits ------------------------

#: The four sliced kernels with the automatic split on both CosmoFlow sets at batch 1
#: (where a block row is the most often split: the tiles give fewest blocks).
SPLIT_SWEEP = [Case(name, layer, layer_set, params=(("splitK", 0),))
               for name in ("implicitGemmPipelined", "implicitGemmPipelinedNCDHW",
                            "implicitGemmPipelinedBwdData", "implicitGemmPipelinedNCDHWBwdData")
               for layer_set, layer in cosmoflow(batches=(1,))]


@pytest.mark.parametrize("case", case_params([], SPLIT_SWEEP))
def test_split_sweep(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)
