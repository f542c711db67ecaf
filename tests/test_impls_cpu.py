"""Every registered implementation, verified on the CPU: every layer of both CosmoFlow sets
at batch 1, and odd shapes."""

import pytest

from convbench import registry, toolchain, verify
from convbench.layers import Layer, load_layers

IMPLS = sorted(registry.all_implementations())

ODD_SHAPES = [
    Layer("noncubic", 2, 3, 5, 5, 7, 9, 3, 3, 3),
    Layer("stride2", 1, 4, 6, 9, 8, 7, 3, 3, 3, stride=2),
    Layer("pad2_stride2", 1, 5, 3, 6, 7, 5, 3, 3, 3, stride=2, pad=2),
    Layer("channels_7_13", 1, 7, 13, 6, 6, 6, 3, 3, 3, pad=1),
    Layer("k1x1x1", 2, 6, 10, 4, 5, 6, 1, 1, 1),
    Layer("k1x1x1_pad", 1, 3, 4, 3, 3, 3, 1, 1, 1, pad=1),
    Layer("k5x5x5", 1, 3, 4, 7, 8, 9, 5, 5, 5, pad=2),
    Layer("k_mixed", 1, 2, 3, 6, 5, 9, 3, 1, 5, stride=2, pad=1),
    Layer("single_out", 1, 1, 1, 3, 3, 3, 3, 3, 3),
]

COSMOFLOW = [(s, i) for s in ("cosmoflow", "cosmoflow_mlperf")
             for i in range(len(load_layers(s)))]


def _check(name, layer, cachedir, reference):
    impl = registry.get(name)
    params = impl.resolve_params()
    reason = impl.unsupported_reason(layer, params)
    if reason:
        pytest.skip(f"{name} does not support {layer.name}: {reason}")
    build = toolchain.build(toolchain.make_spec(impl, layer, params=params), cachedir)
    check = verify.verify_build(build, reference(layer))[0]
    assert check.ok, f"{name} on {layer.name} ({layer.describe()}): {check.summary()}"


# The parameter closest to the function varies slowest: one layer's reference serves
# every implementation before the next layer's is made.
@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("layer", ODD_SHAPES, ids=lambda l: l.name)
def test_odd_shapes(name, layer, cachedir, reference):
    _check(name, layer, cachedir, reference)


@pytest.mark.parametrize("name", IMPLS)
def test_fresh_output_on_every_call(name, cachedir):
    """Two calls of one build on different inputs: the second result is checked, so state
    left over from the first call (a partial-sum buffer, say) cannot hide."""
    layer = ODD_SHAPES[2]
    impl = registry.get(name)
    build = toolchain.build(toolchain.make_spec(impl, layer), cachedir)
    first, second = verify.make_reference(layer, seed=11), verify.make_reference(layer, seed=12)
    assert verify.verify_build(build, first)[0].ok
    check = verify.verify_build(build, second)[0]
    assert check.ok, check.summary()


@pytest.mark.slow
@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("layerset, index", COSMOFLOW, ids=[f"{s}-{i}" for s, i in COSMOFLOW])
def test_cosmoflow_batch1(name, layerset, index, cachedir, reference):
    _check(name, load_layers(layerset)[index].with_batch(1), cachedir, reference)
