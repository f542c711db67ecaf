"""Synthetic CosmoFlow-like training data: 3D random fields driven by 4 parameters.

CosmoFlow regresses a handful of cosmological parameters from 3D dark-matter
density cubes.  The real cubes are gigabytes; this module makes small stand-ins
whose statistics depend on 4 targets in ``[-1, 1]`` strongly enough that a small
3D CNN learns them within a few epochs, which is all
``scripts/cosmoflow_end2end.py --train`` needs to show a falling loss.

The model, for one sample with targets ``theta = (t0, t1, t2, t3)``:

1. Gaussian field.  Real white noise on a ``size**3`` grid is taken to Fourier
   space with ``rfftn`` (which gives the Hermitian symmetry of a real field for
   free) and every mode is scaled by ``sqrt(P(k))`` with

       P(k) = A * k**(-n) * exp(-(k / k_c)**2),      P(0) = 0,

   where ``k = |k|`` is measured in units of the Nyquist frequency (``k = 1`` is
   the Nyquist frequency along one axis).  After ``irfftn`` the field ``g`` is
   rescaled to zero mean and unit variance, so the amplitude ``A`` drops out.
2. Channels.  Like CosmoFlow's redshift slices, the ``channels`` channels are the
   same Gaussian field at different growth factors ``D_c``, spread evenly over
   ``[0.4, 1.0]`` (a single channel uses ``D = 1``).
3. Nonlinearity.  Channel ``c`` is a lognormal-style transform of ``g`` with shape
   ``a = b * D_c``, shifted and scaled by the *analytic* mean and standard
   deviation of the lognormal so that it has zero mean and unit variance::

       N_a(g) = (exp(a g) - exp(a**2 / 2)) / sqrt((exp(a**2) - 1) * exp(a**2))

   ``N_a`` tends to ``g`` as ``a -> 0``.  Later (larger ``D``) channels are thus
   more skewed, as gravitational collapse makes the late universe.
4. Amplitude.  The channel is ``sigma * D_c * N_a(g)``.  The scaling constants
   come from the parameters only, never from the sample's own statistics, so
   the amplitude stays in the data: each channel has mean ~0 and standard
   deviation ``sigma * D_c`` in ``[0.2, 2]``, i.e. values are already O(1).

The targets map to the physical parameters as follows (see :func:`physical_params`):

========  ==========================  =======================  ==========================
target    parameter                   range                    statistic it moves
========  ==========================  =======================  ==========================
``t0``    amplitude ``sigma``         0.5 .. 2 (log-uniform)   variance
``t1``    spectral index ``n``        1 .. 3                   spectral slope (low/high k)
``t2``    cutoff ``k_c`` (x Nyquist)  0.15 .. 0.6              smoothness (gradient power)
``t3``    nonlinearity ``b``          0 .. 0.8                 skewness
========  ==========================  =======================  ==========================

torch is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Sequence, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import torch

NUM_TARGETS = 4

SIGMA_RANGE = (0.5, 2.0)
INDEX_RANGE = (1.0, 3.0)
CUTOFF_RANGE = (0.15, 0.6)
NONLINEARITY_RANGE = (0.0, 0.8)
GROWTH_RANGE = (0.4, 1.0)

GeneratorLike = Union["torch.Generator", int, None]


def _check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``, else a one-line ValueError."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    return number


def _lerp(bounds: Tuple[float, float], t: float) -> float:  # [-1, 1] -> bounds
    lo, hi = bounds
    return lo + (t + 1.0) * 0.5 * (hi - lo)


def _as_generator(generator: GeneratorLike) -> "torch.Generator":
    import torch

    if isinstance(generator, torch.Generator):
        return generator
    gen = torch.Generator()
    if generator is None:
        gen.seed()
    else:
        gen.manual_seed(_check_int("seed", generator, 0))
    return gen


def physical_params(theta: Sequence[float]) -> Tuple[float, float, float, float]:
    """The physical parameters ``(sigma, n, k_c, b)`` that the targets ``theta`` stand for
    (the module docstring's table)."""
    try:
        values = [float(v) for v in (theta.tolist() if hasattr(theta, "tolist") else theta)]
    except (TypeError, ValueError):
        raise ValueError(f"theta must be {NUM_TARGETS} numbers, got {theta!r}") from None
    if len(values) != NUM_TARGETS:
        raise ValueError(f"theta must have {NUM_TARGETS} entries, got {len(values)}")
    for i, v in enumerate(values):
        if not (-1.0 <= v <= 1.0):  # also rejects NaN
            raise ValueError(f"theta[{i}] must lie in [-1, 1], got {v}")
    t0, t1, t2, t3 = values
    lo, hi = SIGMA_RANGE
    sigma = math.exp(_lerp((math.log(lo), math.log(hi)), t0))
    return sigma, _lerp(INDEX_RANGE, t1), _lerp(CUTOFF_RANGE, t2), _lerp(NONLINEARITY_RANGE, t3)


def growth_factors(channels: int) -> list:
    """Growth factor of each channel: evenly spread over :data:`GROWTH_RANGE`, or 1 alone."""
    channels = _check_int("channels", channels, 1)
    if channels == 1:
        return [1.0]
    lo, hi = GROWTH_RANGE
    return [lo + (hi - lo) * c / (channels - 1) for c in range(channels)]


def _wavenumbers(size: int) -> "torch.Tensor":
    """|k| in units of the Nyquist frequency on the ``rfftn`` half grid of a ``size**3`` cube."""
    import torch

    full = torch.fft.fftfreq(size, dtype=torch.float64) * 2.0
    half = torch.fft.rfftfreq(size, dtype=torch.float64) * 2.0
    return torch.sqrt(full[:, None, None] ** 2 + full[None, :, None] ** 2 + half[None, None, :] ** 2)


def gaussian_field(size: int, spectral_index: float, cutoff: float | None,
                   generator: GeneratorLike = None) -> "torch.Tensor":
    """A ``[size, size, size]`` float32 Gaussian field with zero mean and unit variance.

    Its power spectrum is ``k**(-spectral_index) * exp(-(k / cutoff)**2)`` with ``k``
    in units of the Nyquist frequency; ``cutoff=None`` gives a pure power law.
    """
    import torch

    size = _check_int("size", size, 4)
    if cutoff is not None and not cutoff > 0:
        raise ValueError(f"cutoff must be positive or None, got {cutoff}")
    gen = _as_generator(generator)
    noise = torch.randn((size, size, size), generator=gen, dtype=torch.float32)
    k = _wavenumbers(size)
    k[0, 0, 0] = 1.0  # placeholder, the mode is zeroed below
    log_power = -float(spectral_index) * torch.log(k)
    if cutoff is not None:
        log_power = log_power - (k / float(cutoff)) ** 2
    amplitude = torch.exp(0.5 * log_power)
    amplitude[0, 0, 0] = 0.0
    field = torch.fft.irfftn(torch.fft.rfftn(noise) * amplitude.to(torch.float32), s=noise.shape)
    field = field - field.mean()
    std = field.std()
    if not float(std) > 0:  # only a degenerate spectrum could do this
        raise ValueError("the spectrum leaves no power on this grid")
    return (field / std).contiguous()


def field_from_params(theta: Sequence[float], size: int, channels: int,
                      generator: GeneratorLike = None) -> "torch.Tensor":
    """One synthetic sample, ``[channels, size, size, size]`` float32, for targets ``theta``.

    ``theta`` holds :data:`NUM_TARGETS` numbers in [-1, 1]; ``generator`` is a
    ``torch.Generator`` (advanced by the call), an int seed, or None for a fresh seed.
    The same noise (same generator state) with different ``theta`` gives the same
    underlying random phases, which is how the tests isolate each parameter.
    """
    import torch

    sigma, index, cutoff, nonlinearity = physical_params(theta)
    size = _check_int("size", size, 4)
    growth = growth_factors(channels)
    g = gaussian_field(size, index, cutoff, generator)
    out = torch.empty((len(growth), size, size, size), dtype=torch.float32)
    for c, d in enumerate(growth):
        a = nonlinearity * d
        if a < 1e-6:
            unit = g
        else:
            mean = math.exp(0.5 * a * a)
            std = math.sqrt(math.expm1(a * a) * math.exp(a * a))
            unit = (torch.exp(a * g) - mean) / std
        torch.mul(unit, sigma * d, out=out[c])
    return out


def make_dataset(samples: int, size: int, channels: int,
                 seed: int = 0) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """A synthetic data set ``(x, y)``, deterministic for a given ``seed``.

    ``x`` is float32 ``[samples, channels, size, size, size]`` (NCDHW, contiguous),
    ``y`` is float32 ``[samples, NUM_TARGETS]`` with targets drawn uniformly in [-1, 1].
    """
    import torch

    samples = _check_int("samples", samples, 1)
    size = _check_int("size", size, 4)
    channels = _check_int("channels", channels, 1)
    gen = _as_generator(_check_int("seed", seed, 0))
    y = torch.rand((samples, NUM_TARGETS), generator=gen, dtype=torch.float64) * 2.0 - 1.0
    x = torch.empty((samples, channels, size, size, size), dtype=torch.float32)
    for i in range(samples):
        x[i] = field_from_params(y[i].tolist(), size, channels, gen)
    return x, y.to(torch.float32)


def power_spectrum(field, bins: int | None = None) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Isotropically binned power spectrum ``(k_centers, P)`` of a cubic field.

    ``field`` is a ``[D, D, D]`` array or tensor, or has leading dimensions (channels,
    samples) over which the spectra are averaged.  Shells of width one fundamental
    mode (``2 / D`` in units of the Nyquist frequency) run out to the Nyquist
    frequency; ``k_centers`` is the mean ``|k|`` of the modes in each shell (Nyquist
    units) and ``P`` the mean ``|F(k)|**2 / D**3`` there.  The ``k = 0`` mode is left
    out, as are empty shells.  Both are float64 tensors.
    """
    import torch

    f = torch.as_tensor(field)
    if f.dim() < 3 or not (f.shape[-1] == f.shape[-2] == f.shape[-3]):
        raise ValueError(f"field must end in three equal dimensions, got shape {tuple(f.shape)}")
    size = _check_int("field size", f.shape[-1], 4)
    f = f.reshape(-1, size, size, size).to(torch.float64)
    power = (torch.fft.rfftn(f, dim=(-3, -2, -1)).abs() ** 2).mean(dim=0) / size ** 3
    k = _wavenumbers(size)
    fundamental = 2.0 / size
    nbins = size // 2 if bins is None else _check_int("bins", bins, 1)
    shell = torch.round(k / fundamental).to(torch.int64)
    keep = (shell >= 1) & (shell <= size // 2)
    shell = shell[keep]
    edges = torch.linspace(0.5, size // 2 + 0.5, nbins + 1, dtype=torch.float64)
    index = torch.bucketize(shell.to(torch.float64), edges[1:-1], right=True)
    counts = torch.bincount(index, minlength=nbins).to(torch.float64)
    k_sum = torch.bincount(index, weights=k[keep], minlength=nbins)
    p_sum = torch.bincount(index, weights=power[keep], minlength=nbins)
    full = counts > 0
    return k_sum[full] / counts[full], p_sum[full] / counts[full]
