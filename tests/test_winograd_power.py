"""The Winograd checks' power at many channels (issue 62): on random inputs the bound is
statistical in the channel sum (convkernels.winograd.algebra.statistical_bound), so a result that
drops one channel of 256 (or of 512 in the data gradient), or has one transform
coefficient 1% off, fails it, where the rigorous bound (gamma_n Y_abs, n = C + 15) let a
result 1% off pass at K = 512.  The bound tests run without a build; the kernels' own
plants (the generated code with a channel dropped from its GEMM, or a coefficient 1% off)
build at C = 256 and K = 512 and run in the full tier."""

import re

import numpy as np
import pytest
import torch

from convbench import registry
from convbench.build import toolchain
from convbench.check import verify
from convkernels.winograd import algebra
from convbench.layersets.layer import Layer
from convbench.check.verify import TOL_FACTOR


def _rand(shape, gen):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).float()


def _ratio(out, exact, bound):
    return float(((torch.as_tensor(out).double() - exact).abs() / torch.as_tensor(bound)).max())


def test_forward_bound_has_power_at_256_channels():
    """F(2^3, 3^3) in float32 at C = 256 passes the statistical bound with a wide margin;
    one channel left out, a filter-transform coefficient 1% off, or the exact result
    times 1.01 fail it.  The rigorous bound alone is 15x looser here."""
    gen = torch.Generator().manual_seed(11)
    x, w = _rand((1, 256, 6, 6, 6), gen), _rand((4, 256, 3, 3, 3), gen)
    exact = torch.nn.functional.conv3d(x.double(), w.double())
    bound = algebra.error_bound(x, w, 2, tol_factor=TOL_FACTOR, random_inputs=True)
    rigorous = algebra.error_bound(x, w, 2)
    assert np.all(bound <= rigorous) and np.median(rigorous / bound) > 10
    assert _ratio(algebra.conv3d(x.numpy(), w.numpy(), 2), exact, bound) < 0.1
    dropped = algebra.conv3d(x[:, 1:].numpy(), w[:, 1:].numpy(), 2)
    assert _ratio(dropped, exact, bound) > 20
    at, g, bt = (a.copy() for a in algebra.transforms(2))
    g[1, 1] *= 1.01
    assert _ratio(algebra.conv3d(x.numpy(), w.numpy(), 2, matrices=(at, g, bt)), exact, bound) > 2
    assert _ratio(exact * 1.01, exact, bound) > 10
    assert _ratio(exact * 1.01, exact, rigorous) < 10  # what the rigorous bound alone gave


def test_statistical_bounds_do_not_depend_on_the_slab(monkeypatch):
    """The bounds are computed a slab of tile planes at a time; one plane per slab gives
    the same numbers as all at once (forward and adjoint, odd sizes)."""
    gen = torch.Generator().manual_seed(12)
    x, w = _rand((2, 3, 8, 6, 10), gen), _rand((5, 3, 3, 3, 3), gen)
    dy = _rand((2, 5, 5, 6, 7), gen)
    whole = algebra.statistical_bound(x, w, 2)
    adj = algebra.adjoint_statistical_bound(dy, w, (5, 6, 7), (1, 1, 1))
    monkeypatch.setattr(algebra, "SLAB_ELEMENTS", 1)
    assert torch.allclose(algebra.statistical_bound(x, w, 2), whole, rtol=1e-13, atol=0)
    assert torch.allclose(algebra.adjoint_statistical_bound(dy, w, (5, 6, 7), (1, 1, 1)), adj,
                          rtol=1e-13, atol=0)


def test_adjoint_bound_has_power_at_512_output_channels():
    """The data gradient by the forward's adjoint sums 512 output channels: torch's float32
    result passes, one output channel left out or the result 1% off fails; the rigorous
    bound let the 1% pass at about this size."""
    gen = torch.Generator().manual_seed(13)
    dy, w = _rand((1, 512, 4, 4, 4), gen), _rand((512, 4, 3, 3, 3), gen)
    shape, pads = (4, 4, 4), (1, 1, 1)

    def dx(dy_, w_):
        return torch.nn.grad.conv3d_input((1, 4) + shape, w_, dy_, padding=1)

    exact = dx(dy.double(), w.double())
    bound = algebra.adjoint_error_bound(dy, w, shape, pads, tol_factor=TOL_FACTOR,
                                         random_inputs=True)
    rigorous = algebra.adjoint_error_bound(dy, w, shape, pads)
    assert np.all(bound <= rigorous)
    assert _ratio(dx(dy, w), exact, bound) < 0.1
    assert _ratio(dx(dy[:, 1:].double(), w[1:].double()), exact, bound) > 20
    assert _ratio(exact * 1.01, exact, bound) > 10
    assert _ratio(exact * 1.01, exact, rigorous) < 5


# -- the kernels' own plants at C = 256 and K = 512 (full tier: 15 builds) ------------------

#: The forward sums 256 input channels; the data gradient 512 output channels.
DEEP = Layer("wg_c256", 1, 256, 8, 6, 6, 6, 3, 3, 3, pad=1)
WIDE = Layer("wg_k512", 1, 8, 512, 6, 6, 6, 3, 3, 3, pad=1)

#: Per kernel: its layer, and the code generator and the substitution that drops one
#: channel from its GEMM (the first chunk sums one channel fewer; the adjoint sums K - 1
#: output channels).
PLANTS = {
    "winogradF2": (DEEP, "convkernels.cpu.winograd.forward", "global_code",
                   r", WG_CB, add\);", r", WG_CB - (cb == 0), add);"),
    "winogradF2Tiled": (DEEP, "convkernels.gpu.winograd", "gemm_code",
                        r"const int n = (.*?);", r"const int n = -(c0 == 0) + (\1);"),
    "winogradF2BwdData": (WIDE, "convkernels.cpu.winograd.forward", "global_code",
                          r", WG_CB, add\);", r", WG_CB - (cb == 0), add);"),
    "winogradF2TiledBwdData": (WIDE, "convkernels.gpu.winograd", "gemm_code",
                               r"const int n = (.*?);", r"const int n = -(c0 == 0) + (\1);"),
    "winogradF2BwdDataAdjoint": (WIDE, "convkernels.cpu.winograd.adjoint", "global_code",
                                 r", (\d+), false\);", r", \1 - 1, false);"),
}


def _plant_dropped_channel(monkeypatch, name):
    import importlib
    _, module, function, pattern, repl = PLANTS[name]
    mod = importlib.import_module(module)
    original = getattr(mod, function)

    def planted(*args, **kwargs):
        code, count = re.subn(pattern, repl, original(*args, **kwargs))
        assert count, f"{module}.{function}: the GEMM call to plant in was not found"
        return code

    monkeypatch.setattr(mod, function, planted)


def _plant_wrong_coefficient(monkeypatch, name):
    original = algebra.transforms

    def wrong(m, r=3, points=()):
        at, g, bt = (a.copy() for a in original(m, r, points))
        g[1, 1] *= 1.01
        return at, g, bt

    monkeypatch.setattr(algebra, "transforms", wrong)


def _check(builds, reference, name, plant=None, monkeypatch=None):
    impl = registry.get(name)
    layer = PLANTS[name][0]
    spec = toolchain.make_spec(impl, layer, planted=plant.__name__ if plant else "")
    if plant:
        with monkeypatch.context() as m:
            plant(m, name)
            build = builds(spec)
    else:
        build = builds(spec)
    return verify.verify_build(build, reference(layer, pass_=impl.pass_))[0]


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(PLANTS))
def test_winograd_kernels_pass_and_their_plants_fail_at_many_channels(name, builds, reference,
                                                                      monkeypatch):
    """Every Winograd kernel of the forward and the data gradient, at C = 256 (forward)
    or K = 512 (data gradient): the kernel passes its bound; the same kernel with one
    channel dropped from its GEMM, or with a filter-transform coefficient 1% off, fails."""
    check = _check(builds, reference, name)
    assert check.ok and check.rule == "bound", check.summary()
    for plant in (_plant_dropped_channel, _plant_wrong_coefficient):
        check = _check(builds, reference, name, plant, monkeypatch)
        assert not check.ok and check.worst_ratio > 2, (plant.__name__, check.summary())
