"""The Winograd transforms and the 3D reference (convbench.winograd): exact where they must
be, and a wrong transform entry caught."""

import numpy as np
import pytest
import torch

from convbench import winograd
from convbench.main import main as convbench_main


@pytest.mark.parametrize("m", sorted(winograd.POINTS))
def test_transforms_compute_the_correlation(m):
    at, g, bt = winograd.transforms(m)
    assert at.shape == (m, m + 2) and g.shape == (m + 2, 3) and bt.shape == (m + 2, m + 2)
    assert winograd.exactness(at, g, bt) < 1e-14


def test_f2_is_the_classic_transform_up_to_signs():
    """With points 0, 1, -1 the construction gives the well-known F(2, 3) matrices but for
    signs that cancel (rows of B^T with rows of G, and the point at infinity's row of B^T
    with its column of A^T)."""
    at, g, bt = winograd.transforms(2)
    classic = ([[1, 1, 1, 0], [0, 1, -1, -1]], [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
               [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    for ours, theirs in zip((at, g, bt), classic):
        assert np.array_equal(np.abs(ours), np.abs(theirs))
    assert winograd.exactness(*(np.array(c, dtype=float) for c in classic)) < 1e-15


@pytest.mark.parametrize("matrix, entry", [(0, (1, 2)), (1, (1, 1)), (2, (2, 1))])
def test_a_wrong_transform_entry_is_caught(matrix, entry):
    mats = [a.copy() for a in winograd.transforms(2)]
    mats[matrix][entry] += 0.5
    assert winograd.exactness(*mats) > 1e-3


@pytest.mark.parametrize("m", sorted(winograd.POINTS))
def test_3d_reference_is_the_convolution(m):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 2 * m + 2, m + 2, 3 * m + 2))
    w = rng.standard_normal((4, 3, 3, 3, 3))
    want = torch.nn.functional.conv3d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    got = winograd.conv3d(x, w, m, dtype=np.float64)
    assert np.max(np.abs(got - want)) < 1e-10 * np.max(np.abs(want))


def test_bad_points_and_sizes_are_refused(capsys):
    with pytest.raises(ValueError, match="distinct"):
        winograd.transforms(2, 3, (0, 1, 1))
    with pytest.raises(ValueError, match="multiple of the tile"):
        winograd.conv3d(np.zeros((1, 1, 5, 6, 6)), np.zeros((1, 1, 3, 3, 3)), 2)
    assert convbench_main(["winograd-error", "--m", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--m: no points chosen for [3]" in err[0], err


def _layer(C, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, C, 6, 6, 6)).astype(np.float32),
            rng.standard_normal((8, C, 3, 3, 3)).astype(np.float32))


def _exact(x, w):
    return torch.nn.functional.conv3d(torch.from_numpy(x).double(),
                                      torch.from_numpy(w).double()).numpy()


@pytest.mark.parametrize("m", sorted(winograd.POINTS))
def test_bound_as_one_convolution_is_the_algorithm_on_absolute_values(m):
    """error_bound computes Y_abs as one strided convolution; it equals the algorithm run
    on |x|, |w| and the transforms' absolute values."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 5, 2 * m + 2, m + 2, 3 * m + 2)), rng.standard_normal((3, 5, 3, 3, 3))
    n, u = winograd.path_roundings(m, 5), 2.0 ** -24
    absolute = tuple(np.abs(a) for a in winograd.transforms(m))
    want = n * u / (1 - n * u) * winograd.conv3d(np.abs(x), np.abs(w), m, dtype=np.float64,
                                                 matrices=absolute)
    assert np.max(np.abs(winograd.error_bound(x, w, m) - want) / want) < 1e-12


def test_path_roundings_of_f2():
    """F(2, 3): G's entries are powers of two (two additions per row), B^T one addition,
    A^T two: 3 (2 + 1 + 2) + the product + C - 1 channel additions."""
    assert winograd.path_roundings(2, 16) == 15 + 16


@pytest.mark.parametrize("m", sorted(winograd.POINTS))
def test_float32_winograd_within_its_bound_and_a_dropped_channel_outside(m):
    x, w = _layer(16)
    bound = winograd.error_bound(x, w, m)
    exact = _exact(x, w)
    assert np.max(np.abs(winograd.conv3d(x, w, m) - exact) / bound) <= 1
    dropped = winograd.conv3d(x[:, 1:], w[:, 1:], m)  # one channel of 16 left out
    assert np.max(np.abs(dropped - exact) / bound) > 1


def test_a_wrong_transform_entry_fails_the_bound():
    x, w = _layer(16)
    at, g, bt = (a.copy() for a in winograd.transforms(2))
    g[1, 1] *= 1.01  # one filter-transform coefficient 1% off
    wrong = winograd.conv3d(x, w, 2, matrices=(at, g, bt))
    assert np.max(np.abs(wrong - _exact(x, w)) / winograd.error_bound(x, w, 2)) > 1


# -- the kernel (winogradF2) ------------------------------------------------------------------

from convbench import registry, toolchain, verify  # noqa: E402
from convbench.errors import UsageError  # noqa: E402
from convbench.layers import Layer  # noqa: E402
from impls import _winograd  # noqa: E402

#: Padded and not, odd channel counts, a tile block that does not fill 4 tiles.
WINO_LAYERS = [Layer("wg_pad", 2, 5, 12, 6, 4, 10, 3, 3, 3, pad=1),
               Layer("wg_valid", 1, 16, 64, 6, 8, 8, 3, 3, 3),
               Layer("wg_odd", 2, 3, 8, 5, 6, 7, 3, 3, 3, pad=1)]   # output 5x6x7


WINO_IMPLS = ("winogradF2", "winogradF2BwdData", "winogradF2Tiled", "winogradF2TiledBwdData")


@pytest.mark.parametrize("name", WINO_IMPLS)
@pytest.mark.parametrize("layer", WINO_LAYERS, ids=lambda la: la.name)
def test_winograd_kernel_verifies_against_its_bound(name, layer, builds, reference):
    impl = registry.get(name)
    result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                 reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


@pytest.mark.parametrize("name", WINO_IMPLS)
def test_winograd_kernel_with_a_wrong_transform_fails(name, builds, reference, monkeypatch):
    """A filter-transform coefficient 1% off in the generated code fails the check."""
    original = winograd.transforms

    def wrong(m, r=3, points=()):
        at, g, bt = (a.copy() for a in original(m, r, points))
        g[1, 1] *= 1.01
        return at, g, bt

    impl = registry.get(name)
    layer = WINO_LAYERS[0]
    spec = toolchain.make_spec(impl, layer, planted="wrong_transform")
    monkeypatch.setattr(winograd, "transforms", wrong)
    build = builds(spec)
    monkeypatch.setattr(winograd, "transforms", original)
    result = verify.verify_build(build, reference(layer, pass_=impl.pass_))[0]
    assert not result.ok, result.summary()


@pytest.mark.parametrize("layer, words", [
    (Layer("s2", 1, 4, 8, 8, 8, 8, 3, 3, 3, stride=2, pad=1), "stride"),
    (Layer("k5", 1, 4, 8, 8, 8, 8, 5, 5, 5), "kernel 5x5x5"),
])
def test_winograd_refuses_what_it_cannot_tile(layer, words):
    reason = registry.get("winogradF2").unsupported_reason(layer, {})
    assert reason and words in reason, reason


def test_winograd_blocking_follows_the_layer():
    """Few tiles and many channels: one block of every tile, the filter transformed in the
    work items and the input once for all of them; many tiles: blocks that fit a
    thread's cache and the filter transformed once before them."""
    from convbench.registry import Layout
    from impls._common import layer_constants
    params = registry.get("winogradF2").resolve_params()
    deep = layer_constants(Layer("deep", 2, 256, 512, 8, 8, 8, 3, 3, 3, pad=1), Layout.NDHWC)
    b = _winograd.blocking(deep, params, threads=2)
    assert (b.T, b.fuse, b.share) == (_winograd.tile_count(deep), True, True), b
    assert b.KG == b.KB and 64 * 4 * b.CB * b.KB <= _winograd.FUSED_CHUNK_BYTES, b
    wide = layer_constants(Layer("wide", 2, 32, 64, 64, 64, 64, 3, 3, 3, pad=1), Layout.NDHWC)
    b = _winograd.blocking(wide, params, threads=2)
    assert not b.fuse and not b.share and b.T >= _winograd.TARGET_TILES, b
    assert 4 * 64 * b.T * (b.CB + b.KG) <= 2 * _winograd.SCRATCH_BYTES, b
    # what is set is kept
    b = _winograd.blocking(wide, dict(params, T=12, FUSE=1, NV=2), threads=2)
    assert (b.T, b.fuse, b.NV) == (12, True, 2), b


_LANES = __import__("convbench.isa", fromlist=["vector_floats"]).vector_floats()


@pytest.mark.parametrize("name", ("winogradF2", "winogradF2BwdData"))
@pytest.mark.parametrize("params", [
    # several blocks, the last one part full; two input-channel chunks summed into M; two
    # register blocks per item; U from the filter pass
    {"T": 7, "CB": 16, "NV": 1, "KG": 2 * _LANES, "FUSE": 0, "SHARE": 0},
    # the input transformed once for several blocks, split in parts of tiles
    {"T": 5, "NV": 1, "FUSE": 0, "SHARE": 1},
    # filter chunks transformed in the items, several of them
    {"T": 9, "CB": 16, "NV": 1, "FUSE": 1, "SHARE": 0},
], ids=("blocks-chunks", "shared", "fused-chunks"))
def test_winograd_blocking_paths_verify(name, params, builds, reference):
    """The paths that the default blocking takes only on large layers, on a small one."""
    impl = registry.get(name)
    layer = Layer("wg_paths", 2, 32, 4 * _LANES, 6, 6, 8, 3, 3, 3, pad=1)
    spec = toolchain.make_spec(impl, layer, params=impl.resolve_params(params))
    result = verify.verify_build(builds(spec), reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


def test_winograd_tiled_refuses_blocks_a_gpu_cannot_launch():
    impl = registry.get("winogradF2Tiled")
    with pytest.raises(UsageError, match="threads per block"):
        impl.resolve_params({"TT": 64, "TK": 32})
    with pytest.raises(UsageError, match="shared input chunk"):
        impl.resolve_params({"TT": 16, "CC": 16})
