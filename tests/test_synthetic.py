"""Synthetic CosmoFlow-like data: shapes, determinism, and that each target moves its statistic."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch

from convbench.network import synthetic
from convbench.network.synthetic import (NUM_TARGETS, field_from_params, gaussian_field,
                                         make_dataset, physical_params, power_spectrum)


def _one(theta, size=48, seed=7, channels=1):
    """Channel 0 (or all channels) of one sample with fixed noise, as float64."""
    field = field_from_params(theta, size, channels, torch.Generator().manual_seed(seed))
    return field.double()


def _theta(index: int, value: float) -> list:
    theta = [0.0] * NUM_TARGETS
    theta[index] = value
    return theta


def _skewness(f: torch.Tensor) -> float:
    d = f - f.mean()
    return float((d ** 3).mean() / (d ** 2).mean() ** 1.5)


def _roughness(f: torch.Tensor) -> float:
    """Mean squared finite difference over the variance: larger for rougher fields."""
    d = f - f.mean()
    grad = sum(((d.roll(1, dim) - d) ** 2).mean() for dim in range(d.dim()))
    return float(grad / (d ** 2).mean())


def _high_low_ratio(f: torch.Tensor) -> float:
    k, p = power_spectrum(f)
    return float(p[k > 0.5].mean() / p[k < 0.2].mean())


def _fit_slope(k: torch.Tensor, p: torch.Tensor, lo: float, hi: float) -> float:
    keep = (k > lo) & (k < hi)
    assert int(keep.sum()) >= 8, "too few bins to fit"
    return float(np.polyfit(np.log(k[keep].numpy()), np.log(p[keep].numpy()), 1)[0])


def test_dataset_shapes_dtype_range():
    x, y = make_dataset(5, 16, 4, seed=1)
    assert x.shape == (5, 4, 16, 16, 16) and y.shape == (5, NUM_TARGETS)
    assert x.dtype == torch.float32 and y.dtype == torch.float32
    assert x.is_contiguous()
    assert torch.isfinite(x).all()
    assert (y >= -1).all() and (y <= 1).all()
    assert float(y.std()) > 0.2  # targets are spread out, not constant
    # every sample is a genuine field with O(1) values
    stds = x.std(dim=(2, 3, 4))
    assert (stds > 0.1).all() and (stds < 3).all()
    x1, y1 = make_dataset(2, 8, 1)
    assert x1.shape == (2, 1, 8, 8, 8) and y1.shape == (2, NUM_TARGETS)


def test_dataset_deterministic_per_seed():
    xa, ya = make_dataset(3, 16, 2, seed=11)
    xb, yb = make_dataset(3, 16, 2, seed=11)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    xc, yc = make_dataset(3, 16, 2, seed=12)
    assert not torch.equal(ya, yc)
    assert float((xa - xc).abs().mean()) > 0.05
    # samples within one data set differ too
    assert float((xa[0] - xa[1]).abs().mean()) > 0.05


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_dataset(2, 8, 1, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_field_from_params_seed_forms():
    theta = [0.3, -0.2, 0.5, 0.1]
    a = field_from_params(theta, 16, 3, 4)
    b = field_from_params(theta, 16, 3, torch.Generator().manual_seed(4))
    assert a.shape == (3, 16, 16, 16) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.equal(a, field_from_params(theta, 16, 3, 5))


def test_physical_params_ranges():
    assert physical_params([-1, -1, -1, -1]) == pytest.approx((0.5, 1.0, 0.15, 0.0))
    assert physical_params([1, 1, 1, 1]) == pytest.approx((2.0, 3.0, 0.6, 0.8))
    assert physical_params([0, 0, 0, 0])[0] == pytest.approx(1.0)  # log-uniform midpoint


def test_extreme_parameters_stay_finite_and_order_one():
    for corner in itertools.product((-1.0, 1.0), repeat=NUM_TARGETS):
        x = field_from_params(list(corner), 24, 4, torch.Generator().manual_seed(2))
        assert torch.isfinite(x).all(), corner
        mean = x.mean(dim=(1, 2, 3))
        std = x.std(dim=(1, 2, 3))
        assert (mean.abs() < 0.5 * std + 0.05).all(), (corner, mean, std)
        assert (std > 0.1).all() and (std < 3.0).all(), (corner, std)
        assert float(x.abs().max()) < 200, corner


def test_channels_grow_in_amplitude_and_skewness():
    x = field_from_params([0.0, 0.0, 0.0, 1.0], 32, 4, torch.Generator().manual_seed(9)).double()
    stds = [float(c.std()) for c in x]
    skews = [_skewness(c) for c in x]
    assert stds == sorted(stds) and stds[0] < 0.5 * stds[-1]
    assert skews == sorted(skews) and skews[-1] > skews[0] + 0.5
    # one underlying field: the channels are strongly correlated
    corr = torch.corrcoef(x.reshape(4, -1))
    assert float(corr.min()) > 0.8


def test_theta0_sets_variance():
    var = [float(_one(_theta(0, t)).var()) for t in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    assert all(a < b for a, b in zip(var, var[1:]))
    # sigma goes 0.5 -> 2, so the variance grows 16-fold
    assert var[-1] / var[0] == pytest.approx(16.0, rel=0.05)
    # and nothing else changes: the shape of the field is the same
    lo, hi = _one(_theta(0, -1.0)), _one(_theta(0, 1.0))
    assert _skewness(lo) == pytest.approx(_skewness(hi), abs=1e-3)


def test_theta1_steepens_spectrum():
    ratios = [_high_low_ratio(_one(_theta(1, t))) for t in (-1.0, 0.0, 1.0)]
    assert ratios[0] > 3 * ratios[1] > 9 * ratios[2]
    var = [float(_one(_theta(1, t)).var()) for t in (-1.0, 1.0)]
    assert var[0] == pytest.approx(var[1], rel=0.1)  # slope, not amplitude


def test_theta2_sets_smoothness():
    rough = [_roughness(_one(_theta(2, t))) for t in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    assert all(a < b for a, b in zip(rough, rough[1:]))
    assert rough[-1] > 4 * rough[0]


def test_theta3_sets_skewness():
    skew = [_skewness(_one(_theta(3, t))) for t in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    assert abs(skew[0]) < 0.2  # b = 0: a Gaussian field
    assert all(a < b for a, b in zip(skew, skew[1:]))
    assert skew[-1] > 2.0
    var = [float(_one(_theta(3, t)).var()) for t in (-1.0, 1.0)]
    assert var[0] == pytest.approx(var[1], rel=0.15)  # shape, not amplitude


@pytest.mark.parametrize("index", [1.0, 2.0, 3.0])
def test_power_spectrum_recovers_power_law(index):
    field = gaussian_field(64, index, None, torch.Generator().manual_seed(21))
    k, p = power_spectrum(field)
    assert _fit_slope(k, p, 0.1, 0.8) == pytest.approx(-index, abs=0.1)


def test_field_from_params_follows_its_spectrum():
    theta = [0.0, 0.5, 0.5, -1.0]  # b = 0: the Gaussian field itself
    _, n, k_c, _ = physical_params(theta)
    field = field_from_params(theta, 64, 1, torch.Generator().manual_seed(8))[0]
    k, p = power_spectrum(field)
    # divide out the cutoff: what remains is the power law k**-n
    p_law = p * torch.exp((k / k_c) ** 2)
    assert _fit_slope(k, p_law, 0.1, 0.7) == pytest.approx(-n, abs=0.15)


def test_power_spectrum_white_noise_is_flat_and_normalised():
    noise = torch.randn((32, 32, 32), generator=torch.Generator().manual_seed(3)) * 2.0
    k, p = power_spectrum(noise.numpy())  # numpy input works too
    assert k.shape == p.shape and len(k) == 16
    assert bool((k[1:] > k[:-1]).all())
    assert 1.0 <= float(k[0]) / (2 / 32) < 1.5  # first shell: |k| of 1 to sqrt(2) fundamentals
    assert float(p.mean()) == pytest.approx(4.0, rel=0.05)  # variance 4, spread over all k
    assert abs(_fit_slope(k, p, 0.1, 1.0)) < 0.15
    # leading dimensions are averaged over
    k2, p2 = power_spectrum(torch.stack([noise, noise]))
    assert torch.allclose(k2, k) and torch.allclose(p2, p)


@pytest.mark.parametrize("args, message", [
    ((0, 16, 4), "samples"),
    ((2, 3, 4), "size"),
    ((2, 16, 0), "channels"),
    ((2, 16.5, 4), "size"),
    ((2, 16, 4, -1), "seed"),
])
def test_make_dataset_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        make_dataset(*args)


@pytest.mark.parametrize("theta", [[0, 0, 0], [0, 0, 0, 0, 0], [0, 1.5, 0, 0], [0, 0, float("nan"), 0],
                                   "abcd"])
def test_field_from_params_bad_theta(theta):
    with pytest.raises(ValueError, match="theta"):
        field_from_params(theta, 8, 1, 0)


def test_field_from_params_bad_shape_and_power_spectrum_input():
    with pytest.raises(ValueError, match="size"):
        field_from_params([0] * 4, 2, 1, 0)
    with pytest.raises(ValueError, match="channels"):
        field_from_params([0] * 4, 8, 0, 0)
    with pytest.raises(ValueError, match="three equal"):
        power_spectrum(torch.zeros(8, 8, 4))
    with pytest.raises(ValueError, match="three equal"):
        power_spectrum(torch.zeros(8, 8))


def test_import_is_cheap():
    code = f"import sys; import {synthetic.__name__}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.strip() == "False"
