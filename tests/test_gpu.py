"""Tests that need a CUDA device (marked ``gpu``; skipped without one)."""

import pytest

from convbench import registry, toolchain, verify
from convbench.layers import Layer, load_layers

pytestmark = pytest.mark.gpu

IMPLS = sorted(n for n, i in registry.all_implementations().items() if "gpu" in i.targets)
SHAPES = [Layer("gpu_small", 2, 3, 5, 6, 7, 8, 3, 3, 3, pad=1),
          Layer("gpu_stride2", 1, 4, 6, 9, 8, 7, 3, 1, 5, stride=2, pad=1)]


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("layer", SHAPES, ids=lambda l: l.name)
def test_gpu_verify_small(name, layer, cachedir, reference):
    impl = registry.get(name)
    build = toolchain.build(toolchain.make_spec(impl, layer, target="gpu"), cachedir)
    checks = verify.verify_build(build, reference(layer, pass_=impl.pass_), device="gpu")
    assert [c.reference for c in checks] == ["torch-fp64", "torch-gpu-fp32", "cudnn-fp32"]
    for check in checks:
        assert check.ok, f"{name} on {layer.name}: {check.reference}: {check.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", IMPLS)
def test_gpu_verify_cosmoflow_first_layer(name, cachedir, reference):
    layer = load_layers("cosmoflow")[1].with_batch(1)
    impl = registry.get(name)
    build = toolchain.build(toolchain.make_spec(impl, layer, target="gpu"), cachedir)
    for check in verify.verify_build(build, reference(layer, pass_=impl.pass_), device="gpu"):
        assert check.ok, f"{name}: {check.reference}: {check.summary()}"
