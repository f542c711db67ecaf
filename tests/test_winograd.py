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
