"""The backward passes on the pipelined main loop (:mod:`convkernels.gpu.simt.data_gradient`, :mod:`convkernels.gpu.simt.filter_gradient`): a wrong
flip in the data gradient and a dropped slice in the filter gradient fail the check on
the CPU; the filter gradient's split-K sum is bit-identical from run to run; the sm_90
main loops meet the forward's bar (issue "GPU backward at the forward's speed")."""

import pytest
import torch

from convbench import registry
from convbench.build import gpubuild, toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers
from convkernels.layouts import Pass
from convkernels.gpu.simt import filter_gradient, gather
from tests.test_pipelined import check_committed_table, meets, needs_tools, plant

DATA = ("implicitGemmPipelinedBwdData", "implicitGemmPipelinedNCDHWBwdData")
FILTER = ("implicitGemmPipelinedBwdFilter", "implicitGemmPipelinedNCDHWBwdFilter")
#: Tails in every tile dimension, padding on every side, two images; the filter
#: gradient's reduction (2 x 5 x 6 output rows of 7 pixels) splits into 30 slices.
LAYER = Layer("c36_k70", 2, 36, 70, 5, 6, 7, 3, 3, 3, pad=1)
PASS = {name: Pass.BWD_DATA for name in DATA} | {name: Pass.BWD_FILTER for name in FILTER}


#: (name, implementations, module, function, old, new): each a bug the check must catch.
BUGS = [
    # stages the filter unflipped: tap t where the data gradient needs taps - 1 - t
    ("unflipped_filter", DATA, gather, "stage_code", "(26 - ((kd", "(0 + ((kd"),
    # the reduction kernel drops the first slice's partial
    ("dropped_slice", FILTER, filter_gradient, "wgrad_reduce", "int z = 0;", "int z = 1;"),
    # the K tile steps over the last pixels of each output row
    ("short_rows", FILTER, filter_gradient, "_wstage_code", "ya += (7 - ow0)",
     "ya += (8 - ow0)"),
]


def _check(builds, reference, name, planted=None):
    spec = toolchain.make_spec(registry.get(name), LAYER, planted=planted)
    return verify.verify_build(builds(spec), reference(LAYER, pass_=PASS[name]))[0]


@pytest.mark.parametrize("name", DATA + FILTER)
def test_the_unplanted_kernel_passes(name, builds, reference):
    check = _check(builds, reference, name)
    assert check.ok, check.summary()


@pytest.mark.parametrize("bug", BUGS, ids=[b[0] for b in BUGS])
def test_planted_bugs_fail_the_check(monkeypatch, builds, reference, bug):
    bug_name, names, module, function, old, new = bug
    plant(monkeypatch, module, function, old, new)
    for name in names:
        check = _check(builds, reference, name, planted=bug_name)
        assert not check.ok, f"{name} with {bug_name} passed: {check.summary()}"


@pytest.mark.parametrize("name", FILTER)
def test_the_filter_gradient_is_bit_identical_from_run_to_run(name, builds, reference):
    build = builds(toolchain.make_spec(registry.get(name), LAYER))
    truth = reference(LAYER, pass_=Pass.BWD_FILTER)
    assert filter_gradient.wshape(LAYER, registry.get(name).layout,
                                 registry.get(name).resolve_params({})).Z > 1
    first, second = (verify.run_build(build, truth, "cpu") for _ in range(2))
    assert torch.equal(first, second)


#: v1 conv1's filter gradient in small: 16 output channels, 1 input channel (27 filter
#: values), the shape the space's N tiles of 32 are for.
FEW_FILTER_VALUES = Layer("k16_c1", 2, 1, 16, 9, 8, 10, 3, 3, 3, pad=1)


@pytest.mark.parametrize("name", FILTER)
def test_the_small_filter_tile_verifies(name, builds, reference):
    """A 32 x 32 block tile (32 threads of 4 x 8) on 16 x 27 filter values."""
    params = {"CTAtileM": 32, "CTAtileN": 32, "CTAtileK": 16, "threadTileM": 4,
              "threadTileN": 8, "stages": 2}
    spec = toolchain.make_spec(registry.get(name), FEW_FILTER_VALUES, params=params)
    check = verify.verify_build(builds(spec), reference(FEW_FILTER_VALUES,
                                                        pass_=Pass.BWD_FILTER))[0]
    assert check.ok, check.summary()


def test_the_split_covers_the_reduction_once():
    """Every K tile is in exactly one slice, and no slice is empty."""
    for layer in (LAYER, next(x for x in load_layers("cosmoflow") if x.name == "conv1")):
        for split in (0, 1, 3, 7, 10_000):
            params = dict(registry.get(FILTER[0]).resolve_params({"splitK": split}))
            s = filter_gradient.wshape(layer, registry.get(FILTER[0]).layout, params)
            assert (s.Z - 1) * s.TPS < s.KT <= s.Z * s.TPS
            assert split == 0 or s.Z <= split


# -- the machine code -------------------------------------------------------------------------

@needs_tools
def test_the_filter_gradients_main_loop_is_mostly_ffma():
    name, layer_set = FILTER[1], "cosmoflow_mlperf"
    layer = next(x for x in load_layers(layer_set) if x.name == "conv3").with_batch(8)
    probe = gpubuild.probe(name, layer_set, layer, dict(registry.get(name).resolve_params({})),
                           disassemble=True)
    assert not probe.error, probe.error
    main, = [r for r in gpubuild.kernel_rows(probe) if r["main"] == "yes"]
    assert not meets(main), meets(main)


@pytest.mark.parametrize("name", DATA + FILTER)
def test_the_committed_table_covers_every_deep_layer_at_the_defaults(name):
    """``results/gpu/sass/pipelined/``: both passes' default configurations on every
    CosmoFlow layer with at least 32 input channels meet the forward's bar."""
    check_committed_table(name)
