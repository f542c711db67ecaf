"""The Winograd transforms and the 3D reference (convkernels.winograd.algebra): exact where they must
be, and a wrong transform entry caught."""

import numpy as np
import pytest
import torch

from convkernels.winograd import algebra
from convbench.main import main as convbench_main


@pytest.mark.parametrize("m", sorted(algebra.POINTS))
def test_transforms_compute_the_correlation(m):
    at, g, bt = algebra.transforms(m)
    assert at.shape == (m, m + 2) and g.shape == (m + 2, 3) and bt.shape == (m + 2, m + 2)
    assert algebra.exactness(at, g, bt) < 1e-14


def test_f2_is_the_classic_transform_up_to_signs():
    """With points 0, 1, -1 the construction gives the well-known F(2, 3) matrices but for
    signs that cancel (rows of B^T with rows of G, and the point at infinity's row of B^T
    with its column of A^T)."""
    at, g, bt = algebra.transforms(2)
    classic = ([[1, 1, 1, 0], [0, 1, -1, -1]], [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
               [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    for ours, theirs in zip((at, g, bt), classic):
        assert np.array_equal(np.abs(ours), np.abs(theirs))
    assert algebra.exactness(*(np.array(c, dtype=float) for c in classic)) < 1e-15


@pytest.mark.parametrize("matrix, entry", [(0, (1, 2)), (1, (1, 1)), (2, (2, 1))])
def test_a_wrong_transform_entry_is_caught(matrix, entry):
    mats = [a.copy() for a in algebra.transforms(2)]
    mats[matrix][entry] += 0.5
    assert algebra.exactness(*mats) > 1e-3


@pytest.mark.parametrize("m", sorted(algebra.POINTS))
def test_3d_reference_is_the_convolution(m):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 2 * m + 2, m + 2, 3 * m + 2))
    w = rng.standard_normal((4, 3, 3, 3, 3))
    want = torch.nn.functional.conv3d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    got = algebra.conv3d(x, w, m, dtype=np.float64)
    assert np.max(np.abs(got - want)) < 1e-10 * np.max(np.abs(want))


def test_bad_points_and_sizes_are_refused(capsys):
    with pytest.raises(ValueError, match="distinct"):
        algebra.transforms(2, 3, (0, 1, 1))
    with pytest.raises(ValueError, match="multiple of the tile"):
        algebra.conv3d(np.zeros((1, 1, 5, 6, 6)), np.zeros((1, 1, 3, 3, 3)), 2)
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


@pytest.mark.parametrize("m", sorted(algebra.POINTS))
def test_bound_as_one_convolution_is_the_algorithm_on_absolute_values(m):
    """error_bound computes Y_abs as one strided convolution; it equals the algorithm run
    on |x|, |w| and the transforms' absolute values."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 5, 2 * m + 2, m + 2, 3 * m + 2)), rng.standard_normal((3, 5, 3, 3, 3))
    n, u = algebra.path_roundings(m, 5), 2.0 ** -24
    absolute = tuple(np.abs(a) for a in algebra.transforms(m))
    want = n * u / (1 - n * u) * algebra.conv3d(np.abs(x), np.abs(w), m, dtype=np.float64,
                                                 matrices=absolute)
    assert np.max(np.abs(algebra.error_bound(x, w, m) - want) / want) < 1e-12


def test_path_roundings_of_f2():
    """F(2, 3): G's entries are powers of two (two additions per row), B^T one addition,
    A^T two: 3 (2 + 1 + 2) + the product + C - 1 channel additions."""
    assert algebra.path_roundings(2, 16) == 15 + 16


@pytest.mark.parametrize("m", sorted(algebra.POINTS))
def test_float32_winograd_within_its_bound_and_a_dropped_channel_outside(m):
    x, w = _layer(16)
    bound = algebra.error_bound(x, w, m)
    exact = _exact(x, w)
    assert np.max(np.abs(algebra.conv3d(x, w, m) - exact) / bound) <= 1
    dropped = algebra.conv3d(x[:, 1:], w[:, 1:], m)  # one channel of 16 left out
    assert np.max(np.abs(dropped - exact) / bound) > 1


def test_a_wrong_transform_entry_fails_the_bound():
    x, w = _layer(16)
    at, g, bt = (a.copy() for a in algebra.transforms(2))
    g[1, 1] *= 1.01  # one filter-transform coefficient 1% off
    wrong = algebra.conv3d(x, w, 2, matrices=(at, g, bt))
    assert np.max(np.abs(wrong - _exact(x, w)) / algebra.error_bound(x, w, 2)) > 1


# -- the kernel (winogradF2) ------------------------------------------------------------------

from convbench import registry
from convbench.build import toolchain
from convbench.check import verify  # noqa: E402
from convbench.base.errors import UsageError  # noqa: E402
from convbench.layersets.layer import Layer  # noqa: E402
from convkernels.cpu.winograd import forward as _winograd  # noqa: E402

#: Padded and not, odd channel counts, a tile block that does not fill 4 tiles.
WINO_LAYERS = [Layer("wg_pad", 2, 5, 12, 6, 4, 10, 3, 3, 3, pad=1),
               Layer("wg_valid", 1, 16, 64, 6, 8, 8, 3, 3, 3),
               Layer("wg_odd", 2, 3, 8, 5, 6, 7, 3, 3, 3, pad=1)]   # output 5x6x7


WINO_IMPLS = ("winogradF2", "winogradF2BwdData", "winogradF2Tiled", "winogradF2TiledBwdData",
              "winogradF2BwdFilter", "winogradF2BwdDataAdjoint")


#: Fast tier: the padded layer (the control of the planted transform below); the fast
#: tier's per-implementation layers (tests/cases.py) add an unpadded one with ragged tiles
#: in every dimension.  Full tier: all three.
@pytest.mark.parametrize("name", WINO_IMPLS)
@pytest.mark.parametrize("layer", [WINO_LAYERS[0]] + [pytest.param(la, marks=pytest.mark.full)
                                                      for la in WINO_LAYERS[1:]],
                         ids=lambda la: la.name)
def test_winograd_kernel_verifies_against_its_bound(name, layer, builds, reference):
    impl = registry.get(name)
    result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                 reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


@pytest.mark.parametrize("name", WINO_IMPLS)
def test_winograd_kernel_with_a_wrong_transform_fails(name, builds, reference, monkeypatch):
    """A filter-transform coefficient 1% off in the generated code fails the check."""
    original = algebra.transforms

    def wrong(m, r=3, points=()):
        at, g, bt = (a.copy() for a in original(m, r, points))
        g[1, 1] *= 1.01
        return at, g, bt

    impl = registry.get(name)
    layer = WINO_LAYERS[0]
    spec = toolchain.make_spec(impl, layer, planted="wrong_transform")
    monkeypatch.setattr(algebra, "transforms", wrong)
    build = builds(spec)
    monkeypatch.setattr(algebra, "transforms", original)
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
    from convkernels.layer import layer_constants
    params = registry.get("winogradF2").resolve_params()
    deep = layer_constants(Layer("deep", 2, 256, 512, 8, 8, 8, 3, 3, 3, pad=1), Layout.NDHWC)
    b = _winograd.blocking(deep, params, threads=2)
    assert (b.T, b.fuse, b.share) == (_winograd.tile_count(deep), True, True), b
    assert b.KG == b.KB and 64 * 4 * b.CB * b.KB <= _winograd.fused_chunk_bytes(), b
    wide = layer_constants(Layer("wide", 2, 32, 64, 64, 64, 64, 3, 3, 3, pad=1), Layout.NDHWC)
    b = _winograd.blocking(wide, params, threads=2)
    assert not b.fuse and not b.share and b.T >= _winograd.TARGET_TILES, b
    assert 4 * 64 * b.T * (b.CB + b.KG) <= 2 * _winograd.scratch_bytes(), b
    # what is set is kept
    b = _winograd.blocking(wide, dict(params, T=12, FUSE=1, NV=2), threads=2)
    assert (b.T, b.fuse, b.NV) == (12, True, 2), b


_LANES = __import__("convkernels.cpu.isa", fromlist=["vector_floats"]).vector_floats()


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


@pytest.mark.parametrize("params", [{"TB": 5, "CB": 16, "RK": 5}, {"TB": 7, "NV": 1, "RK": 3}],
                         ids=("blocks-items-rows", "narrow"))
def test_winograd_filter_gradient_blocking_paths_verify(params, builds, reference):
    """Several tile blocks (the last part full), two input-channel items per plane, and a
    register block that does not divide the output channels."""
    impl = registry.get("winogradF2BwdFilter")
    layer = Layer("wgf_paths", 2, 32, 24, 6, 7, 8, 3, 3, 3, pad=1)
    spec = toolchain.make_spec(impl, layer, params=impl.resolve_params(params))
    result = verify.verify_build(builds(spec), reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


@pytest.mark.parametrize("params, pad", [({"T": 5, "CG": 16, "RT": 3}, 1), ({"T": 7, "NV": 1}, 0)],
                         ids=("blocks-items-rows", "unpadded"))
def test_winograd_adjoint_blocking_paths_verify(params, pad, builds, reference):
    """The adjoint data gradient: several tile blocks (the last one part full), two
    channel items, tiles left over by the register block; and an unpadded layer, whose
    patches reach dL/dx's border."""
    impl = registry.get("winogradF2BwdDataAdjoint")
    layer = Layer("wga_paths", 2, 32, 24, 6, 7, 8, 3, 3, 3, pad=pad)
    spec = toolchain.make_spec(impl, layer, params=impl.resolve_params(params))
    result = verify.verify_build(builds(spec), reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


@pytest.mark.parametrize("name", ("winogradF2BwdFilter", "winogradF2BwdDataAdjoint"))
def test_new_winograd_kernels_take_padding_per_dimension(name, builds, reference):
    """Different padding per dimension, 3 along one (the transposed form refuses more
    than 2), and a depth of odd output."""
    impl = registry.get(name)
    layer = Layer("wg_aniso", 1, 16, 24, 7, 7, 5, 3, 3, 3, pad_d=0, pad_h=1, pad_w=3)
    result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                 reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()


def test_adjoint_bound_is_the_algorithm_on_absolute_values():
    """``adjoint_error_bound``'s Y_abs, one transposed convolution, equals the adjoint run
    tile by tile on absolute values (odd output, padding per dimension)."""
    import torch
    rng = np.random.default_rng(5)
    N, K, C, (D, H, W), pads = 1, 3, 2, (5, 6, 4), (1, 0, 2)
    out = [s + 2 * p - 2 for s, p in zip((D, H, W), pads)]
    dy, w = rng.standard_normal((N, K, *out)), rng.standard_normal((K, C, 3, 3, 3))
    at, g, bt = (np.abs(a) for a in algebra.transforms(2))
    u = np.einsum("ad,be,cf,kxdef->kxabc", g, g, g, np.abs(w))
    want = np.zeros((N, C, D + 16, H + 16, W + 16))
    for td in range(-(-out[0] // 2)):
        for th in range(-(-out[1] // 2)):
            for tw in range(-(-out[2] // 2)):
                tile = np.zeros((N, K, 2, 2, 2))
                piece = np.abs(dy[:, :, 2 * td:2 * td + 2, 2 * th:2 * th + 2, 2 * tw:2 * tw + 2])
                tile[:, :, :piece.shape[2], :piece.shape[3], :piece.shape[4]] = piece
                v = np.einsum("ai,bj,cl,nkijl->nkabc", at.T, at.T, at.T, tile)
                m = np.einsum("kxabc,nkabc->nxabc", u, v)
                patch = np.einsum("qa,rb,sc,nxabc->nxqrs", bt.T, bt.T, bt.T, m)
                want[:, :, 2 * td + 4:2 * td + 8, 2 * th + 4:2 * th + 8, 2 * tw + 4:2 * tw + 8] += patch
    want = want[:, :, 4 + pads[0]:4 + pads[0] + D, 4 + pads[1]:4 + pads[1] + H,
                4 + pads[2]:4 + pads[2] + W]
    got = algebra.adjoint_error_bound(torch.from_numpy(dy), torch.from_numpy(w), (D, H, W), pads)
    n = 3 * (2 + 1 + 2) + 1 + (K - 1) + 7
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    assert np.max(np.abs(got / gamma - want) / want) < 1e-12


def test_filter_gradient_bound_has_power_on_long_sums():
    """The filter gradient's bound over 4,096 tiles of random inputs: a result that misses
    1% of them (one tile in a hundred, whole) fails it by far, where the worst case of the
    sum, (T - 1) u sum|terms|, would let it pass; without the random inputs' model it is
    looser, and still catches it here."""
    import torch
    g = torch.Generator().manual_seed(3)
    x = torch.rand((1, 4, 34, 34, 34), generator=g, dtype=torch.float64) * 2 - 1
    dy = torch.rand((1, 8, 32, 32, 32), generator=g, dtype=torch.float64) * 2 - 1
    exact = torch.nn.grad.conv3d_weight(x, (8, 4, 3, 3, 3), dy)
    from convbench.check.verify import TOL_FACTOR
    bound = torch.from_numpy(algebra.filter_gradient_bound(x, dy, TOL_FACTOR, random_inputs=True))
    assert torch.all((exact - exact.float().double()).abs() < bound)  # one rounding passes
    keep = torch.ones(16, 16, 16, dtype=torch.float64)
    keep.view(-1)[torch.randperm(4096, generator=g)[:41]] = 0  # 1% of the tiles dropped
    mask = keep.repeat_interleave(2, 0).repeat_interleave(2, 1).repeat_interleave(2, 2)
    missing = torch.nn.grad.conv3d_weight(x, (8, 4, 3, 3, 3), dy * mask)
    assert ((missing - exact).abs() / bound).max() > 50
    loose = torch.from_numpy(algebra.filter_gradient_bound(x, dy, TOL_FACTOR))
    assert torch.all(loose >= bound) and ((missing - exact).abs() / loose).max() > 2


def test_winograd_tiled_refuses_blocks_a_gpu_cannot_launch():
    impl = registry.get("winogradF2Tiled")
    with pytest.raises(UsageError, match="threads per block"):
        impl.resolve_params({"TT": 64, "TK": 32})
    with pytest.raises(UsageError, match="shared input chunk"):
        impl.resolve_params({"TT": 16, "CC": 16})


@pytest.mark.parametrize("name", ("winogradF2", "winogradF2Tiled", "winogradF2BwdFilter",
                                  "winogradF2BwdDataAdjoint"))
def test_winograd_kernels_take_padding_that_differs_at_the_ends(name, builds, reference):
    """The kernels read zeros outside the input and tile the output they are given, so a
    padding that differs at the two ends of a dimension only sets the output size; the
    transposed form refuses it with the reason."""
    impl = registry.get(name)
    layer = Layer("wg_ends", 2, 8, 12, 7, 6, 5, 3, 3, 3, pad=0, pad_d=1, pad_d_end=0,
                  pad_h_end=2, pad_w_end=3)
    result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                 reference(layer, pass_=impl.pass_))[0]
    assert result.ok, result.summary()
    reason = registry.get("winogradF2BwdData").unsupported_reason(layer, {})
    assert reason and "asymmetric padding" in reason
