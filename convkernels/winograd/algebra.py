"""Winograd minimal filtering F(m, r) for 3D convolution: the transforms from their
interpolation points, and a float64/float32 reference of the 3D algorithm (numpy).

This is the specification the Winograd kernels are checked against (issue 44), not a
kernel.  For F(m, r) with ``n = m + r - 1``, a 1D correlation ``y[i] = sum_j d[i + j] g[j]``
(``i < m``) of an input tile ``d`` of ``n`` values is ``y = A^T [(G g) * (B^T d)]``; in 3D each
transform is applied along the three axes in turn, and the element-wise products are
summed over the input channels before the output transform.

The matrices come from the Cook-Toom construction over ``n - 1`` finite points and the
point at infinity, with exact rational arithmetic: ``A^T[i, j] = p_j^i`` (the last column
picks the top coefficient), ``G[j, :] = (p_j^0, .., p_j^(r-1)) / prod_{k != j} (p_j - p_k)``,
and row ``j`` of ``B^T`` the coefficients of ``prod_{k != j} (x - p_k)`` (the last row those of
``prod_k (x - p_k)``).  :func:`exactness` measures how far a set of matrices is from the
correlation it claims to compute, so a wrong entry is caught.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import List, Sequence, Tuple

import numpy as np

#: The points of the transforms this project considers, per output tile size m (r = 3):
#: 0, +-1 for F(2, 3); 0, +-1, +-1/2 for F(4, 3) (small points keep the transforms'
#: entries, and so their rounding, small).
POINTS = {2: (0, 1, -1), 4: (0, 1, -1, Fraction(1, 2), Fraction(-1, 2))}


def _poly_mul(a: List[Fraction], b: List[Fraction]) -> List[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def transforms(m: int, r: int = 3, points: Sequence = ()) -> Tuple[np.ndarray, ...]:
    """``(A^T, G, B^T)`` of F(m, r), shapes ``(m, n)``, ``(n, r)``, ``(n, n)``, from ``n - 1``
    distinct finite ``points`` (default :data:`POINTS`)."""
    n = m + r - 1
    pts = [Fraction(p) for p in (points or POINTS[m])]
    if len(pts) != n - 1 or len(set(pts)) != n - 1:
        raise ValueError(f"F({m}, {r}) needs {n - 1} distinct finite points, got {pts}")
    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for j, p in enumerate(pts):
        scale = Fraction(1)
        for k, q in enumerate(pts):
            if k != j:
                scale *= p - q
        g.append([p ** i / scale for i in range(r)])
    g.append([Fraction(int(i == r - 1)) for i in range(r)])
    bt = []
    for j in range(n):
        poly = [Fraction(1)]
        for k, q in enumerate(pts):
            if k != j:
                poly = _poly_mul(poly, [-q, Fraction(1)])
        bt.append(poly + [Fraction(0)] * (n - len(poly)))
    return tuple(np.array([[float(v) for v in row] for row in mat]) for mat in (at, g, bt))


def exactness(at: np.ndarray, g: np.ndarray, bt: np.ndarray, trials: int = 8,
              seed: int = 0) -> float:
    """The largest error, in float64 and relative to the result's scale, of ``A^T[(G g) *
    (B^T d)]`` against the direct 1D correlation on random tiles: about 1e-16 for correct
    matrices, order 1 for a wrong entry."""
    m, n = at.shape
    r = g.shape[1]
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d, w = rng.standard_normal(n), rng.standard_normal(r)
        y = at @ ((g @ w) * (bt @ d))
        ref = np.array([d[i:i + r] @ w for i in range(m)])
        worst = max(worst, float(np.max(np.abs(y - ref)) / np.max(np.abs(ref))))
    return worst


def _along_3_axes(mat: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``mat`` applied along the last three axes of ``x``."""
    for axis in (-3, -2, -1):
        x = np.moveaxis(np.tensordot(x, mat, axes=([axis], [1])), -1, axis)
    return x


def conv3d(x: np.ndarray, w: np.ndarray, m: int = 2, points: Sequence = (),
           dtype=np.float32, matrices=None) -> np.ndarray:
    """The valid 3D correlation of ``x`` (N, C, D, H, W; padded already) with ``w`` (K, C,
    3, 3, 3) by F(m^3, 3^3), every operation in ``dtype`` and the channel sum sequential
    (as a kernel's accumulator would add them).  Output sizes must be multiples of ``m``.
    ``matrices``: ``(A^T, G, B^T)`` to use instead of :func:`transforms`' (a planted
    error, or their absolute values for :func:`error_bound`)."""
    at, g, bt = (a.astype(dtype) for a in (matrices or transforms(m, 3, points)))
    n = m + 2
    N, C, D, H, W = x.shape
    out = (D - 2, H - 2, W - 2)
    if any(s % m for s in out):
        raise ValueError(f"output {out} is not a multiple of the tile {m}")
    tiles = [s // m for s in out]
    u = _along_3_axes(g, w.astype(dtype)).astype(dtype)  # K, C, n, n, n
    d = np.empty((N, C, *tiles, n, n, n), dtype)
    for a in range(n):
        for b in range(n):
            for c in range(n):
                d[..., a, b, c] = x[:, :, a:a + m * tiles[0]:m, b:b + m * tiles[1]:m,
                                    c:c + m * tiles[2]:m]
    v = _along_3_axes(bt, d).astype(dtype)  # N, C, tiles, n, n, n
    acc = np.zeros((N, w.shape[0], *tiles, n, n, n), dtype)
    for c in range(C):
        acc += (v[:, c][:, None] * u[:, c][None, :, None, None, None]).astype(dtype)
    y = _along_3_axes(at, acc).astype(dtype)  # N, K, tiles, m, m, m
    return y.transpose(0, 1, 2, 5, 3, 6, 4, 7).reshape(N, w.shape[0], *out)


def roundings_per_axis(mat: np.ndarray) -> int:
    """Roundings on the way through one axis of a transform, at most: the additions of a
    row's nonzero terms, plus two (the constant's own rounding and the product's) where a
    coefficient is not a power of two (multiplying by one is exact)."""
    nonzero = np.abs(mat[mat != 0])
    exact = np.all(np.log2(nonzero) == np.round(np.log2(nonzero)))
    return int(np.max(np.count_nonzero(mat, axis=1))) - 1 + (0 if exact else 2)


def path_roundings(m: int, channels: int, points: Sequence = ()) -> int:
    """The most roundings any term of an output element of F(m^3, 3^3) goes through in
    :func:`conv3d`'s order: the filter and input transforms along three axes each, the
    product, the channel sum (``channels - 1`` additions in sequence), and the output
    transform along three axes."""
    at, g, bt = transforms(m, 3, points)
    return (3 * (roundings_per_axis(g) + roundings_per_axis(bt) + roundings_per_axis(at))
            + 1 + (channels - 1))


def gamma(n: int, unit_roundoff: float = 2.0 ** -24) -> float:
    """``gamma_n = n u / (1 - n u)``: the most ``n`` roundings move a product of values."""
    return n * unit_roundoff / (1 - n * unit_roundoff)


def _composed(left, right, u):
    """``kern[k, c, o1, o2, o3, q1, q2, q3] = sum_abc u[k, c, a, b, c] prod_axis left[a, o]
    right[a, q]``: a filter-domain array ``u`` [K, C, n, n, n] between two transforms along
    each axis (``left`` [n, O], ``right`` [n, Q]), as three contractions of two operands
    each (one einsum of seven takes seconds on a deep layer)."""
    import torch
    m3 = left[:, :, None] * right[:, None, :]  # [n, O, Q]
    y = torch.einsum("aip,kxabc->kxbcip", m3, u)
    y = torch.einsum("bjq,kxbcip->kxcipjq", m3, y)
    y = torch.einsum("clr,kxcipjq->kxijlpqr", m3, y)
    return y


def error_bound(x, w, m: int = 2, points: Sequence = (),
                unit_roundoff: float = 2.0 ** -24, tol_factor: float = 0.0,
                random_inputs: bool = False) -> np.ndarray:
    """A bound on each output element's error of F(m^3, 3^3) in a precision of unit
    roundoff ``u``.  With ``random_inputs`` (the harness's: independent, symmetric about
    zero) and a ``tol_factor``, the smaller of the statistical one
    (:func:`statistical_bound`) and the rigorous one; otherwise the rigorous one, ``gamma_n
    Y_abs``, with ``n`` = :func:`path_roundings` and ``Y_abs`` the same algorithm in float64
    on ``|x|``, ``|w|`` and the transforms' absolute values.

    Each term of the result is a product of input, filter and transform values carried
    through at most ``n`` roundings, each a factor ``(1 + delta)`` with ``|delta| <= u``;
    the product of ``n`` such factors lies within ``gamma_n`` of 1 (Higham, Lemma 3.1), so the
    error is at most ``gamma_n`` times the sum of the terms' magnitudes, which is ``Y_abs``.
    The order of the sums does not matter, only their depth.  A fused multiply-add
    rounds once where this counts two.

    ``Y_abs`` is computed as one convolution (torch, float64): the three transforms
    compose into a kernel of ``m + 2`` taps per axis at stride ``m`` with ``m^3 K`` output
    channels, one per output position of a tile, so the bound costs about as much as the
    float64 ground truth.  ``x`` (N, C, D, H, W; padded) and ``w`` (K, C, 3, 3, 3): numpy
    or torch."""
    import torch
    if random_inputs and tol_factor:  # both hold: the smaller, element by element
        return np.minimum(statistical_bound(x, w, m, points, unit_roundoff, tol_factor).numpy(),
                          error_bound(x, w, m, points, unit_roundoff))
    n = path_roundings(m, x.shape[1], points)
    at, g, bt = (torch.from_numpy(np.abs(a)) for a in transforms(m, 3, points))
    xa = torch.as_tensor(x).to(torch.float64).abs()
    wa = torch.as_tensor(w).to(torch.float64).abs()
    K, C = wa.shape[:2]
    t = m + 2
    # |U| = |G| (x) 3 |w|: [K, C, t, t, t]
    u = torch.einsum("ad,be,cf,kxdef->kxabc", g, g, g, wa)
    # kernel[o1, o2, o3, k, c, q1, q2, q3] = sum_p |A|[o, p] |U|[k, c, p] |B^T|[p, q]
    kern = _composed(at.T, bt, u).permute(2, 3, 4, 0, 1, 5, 6, 7)  # o1 o2 o3 K C q1 q2 q3
    kern = kern.reshape(m ** 3 * K, C, t, t, t)
    y = torch.nn.functional.conv3d(xa, kern, stride=m)  # [N, m^3 K, TD, TH, TW]
    N, _, TD, TH, TW = y.shape
    y = y.reshape(N, m, m, m, K, TD, TH, TW).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return (gamma(n, unit_roundoff) * y.reshape(N, K, TD * m, TH * m, TW * m)).numpy()


#: Elements of one float64 work array of the statistical bounds (a slab of tile planes).
SLAB_ELEMENTS = 1 << 22


def _along(mat, t, spec: str):
    """``t`` with ``mat`` applied along three of its axes, by ``spec`` (an einsum whose three
    leading operands are ``mat``)."""
    import torch
    return torch.einsum(spec, mat, mat, mat, t)


def _domain_sums(u, v, ua, va, terms: int, n0: int, unit_roundoff: float,
                 tol_factor: float):
    """Per transform point, the error bound of a sum of ``terms`` products ``u v`` over
    their shared index (the channels): ``gamma_n0 S + tol_factor sqrt(terms) u E``, with
    ``S = |U| |V|`` (every term's magnitude through the transforms' absolute values) and
    ``E = min(sqrt(U^2 V^2) + |U V|, S)`` (:mod:`convbench.check.verify`'s model of a long sum).
    ``u``: [P, I, J], ``v``: [P, J, X] (``ua``, ``va`` their bounds in magnitude); the
    result [P, I, X]."""
    import torch
    s = torch.bmm(ua, va)
    e = torch.bmm(u * u, v * v).sqrt_().add_(torch.bmm(u, v).abs_())
    e = torch.minimum(e, s)
    return s.mul_(gamma(n0, unit_roundoff)).add_(
        e, alpha=tol_factor * math.sqrt(terms) * unit_roundoff)


def statistical_bound(x, w, m: int = 2, points: Sequence = (),
                      unit_roundoff: float = 2.0 ** -24, tol_factor: float = 8.0):
    """The forward F(m^3, 3^3)'s bound on random inputs, as a float64 torch tensor shaped
    like the output.

    A result element is ``A^T [M]`` along three axes, ``M_p = sum_c P_cp`` the channel sum
    at transform point ``p`` of the products ``P_cp = U_cp V_cp``.  Everything outside that
    sum (both operands' transforms, the product, the output transform: ``n0`` =
    :func:`path_roundings` at one channel) keeps its rigorous bound, ``gamma_n0 S_p`` with
    ``S_p = sum_c |U_cp| |V_cp|`` through the transforms' absolute values.  The ``C``-term
    sum itself gets :mod:`convbench.check.verify`'s model of a long sum of independent terms
    with mean zero (the channels' inputs are), with its safety factor ``tol_factor``:
    ``tol_factor sqrt(C) u min(||P_p||_2 + |M_p|, S_p)``.  The bound is the sum of both
    terms carried through ``|A^T|``.  Where the rigorous bound grows as ``C u`` times the
    magnitudes, this one grows as ``sqrt(C) u`` times the result's scale, as the direct
    sums' tolerance does: a result 1% off, or without 1% of its terms, fails it at every
    channel count.  ``x`` (N, C, D, H, W; padded), ``w`` (K, C, 3, 3, 3): numpy or torch."""
    import torch
    at, g, bt = (torch.from_numpy(a) for a in transforms(m, 3, points))
    n = m + 2
    P = n ** 3
    xs, ws = (torch.as_tensor(a).to(torch.float64) for a in (x, w))
    N, C = xs.shape[:2]
    K = ws.shape[0]
    TD, TH, TW = ((s - 2) // m for s in xs.shape[2:])
    if any((s - 2) % m for s in xs.shape[2:]):
        raise ValueError(f"output {tuple(s - 2 for s in xs.shape[2:])} is not a multiple of "
                         f"the tile {m}")
    spec = "ad,be,cf,kxdef->abckx"
    u = _along(g, ws, spec).reshape(P, K, C)
    ua = _along(g.abs(), ws.abs(), spec).reshape(P, K, C)
    tiles = xs.unfold(2, n, m).unfold(3, n, m).unfold(4, n, m)  # N, C, TD, TH, TW, n, n, n
    n0 = path_roundings(m, 1, points)
    out = torch.empty(N, K, TD, TH, TW, m, m, m, dtype=torch.float64)
    slab = max(1, SLAB_ELEMENTS // (P * N * max(K, C) * TH * TW))
    spec = "pa,qb,rc,nxsuvabc->pqrxnsuv"
    for d0 in range(0, TD, slab):
        d1 = min(TD, d0 + slab)
        t = tiles[:, :, d0:d1]
        v = _along(bt, t, spec).reshape(P, C, -1)
        va = _along(bt.abs(), t.abs(), spec).reshape(P, C, -1)
        inner = _domain_sums(u, v, ua, va, C, n0, unit_roundoff, tol_factor)  # P, K, N t
        y = _along(at.abs(), inner.reshape(n, n, n, K, N, -1),
                   "ia,jb,lc,abcknt->nktijl")
        out[:, :, d0:d1] = y.reshape(N, K, d1 - d0, TH, TW, m, m, m)
    return out.permute(0, 1, 2, 5, 3, 6, 4, 7).reshape(N, K, TD * m, TH * m, TW * m)


def filter_gradient_bound(x, dy, tol_factor: float, random_inputs: bool = False,
                          unit_roundoff: float = 2.0 ** -24, chunk: int = 4):
    """A bound on each element's error of the filter gradient by F(3^3, 2^3) (the kernel
    ``winogradF2BwdFilter``): ``dw = G^T [sum_t (A dy_t) * (B^T x_t)]``, the sum over the
    tiles ``t`` before ``G^T``.  ``x`` (N, C, D, H, W; padded, sizes two more than ``dy``'s)
    and ``dy`` (N, K, OD, OH, OW; even sizes), torch or numpy; result (K, C, 3, 3, 3),
    float64.

    Per transform point, ``P_t = (A dy_t) (B^T x_t)`` are the sum's terms and ``M`` their
    sum; ``S = sum_t (|A| |dy_t|) (|B^T| |x_t|)`` bounds ``sum_t |P_t|``.  The bound is
    ``|G^T| [gamma_n S + tol_factor sqrt(T) u E]`` along three axes, where ``n`` counts the
    roundings of a term outside the sum, worst case (dy's and x's transforms, the product,
    ``G^T``), and the ``T``-term sum over the tiles gets :mod:`convbench.check.verify`'s model of
    a long sum, with its safety factor ``tol_factor`` (``convbench.check.verify.TOL_FACTOR``):
    ``E = min(||P||_2 + |M|, S)`` for ``random_inputs`` (the harness's: the
    terms of different tiles are then independent with mean zero, since the tiles' dy
    values are disjoint), else ``E = S``.  The worst case, ``(T - 1) u S``, would over
    65,536 tiles let a gradient that misses 1% of them pass."""
    import torch
    at, g, bt = transforms(2, 3)
    a, gt = at.T, g.T
    n = 3 * (roundings_per_axis(a) + roundings_per_axis(bt) + roundings_per_axis(gt)) + 1
    u = unit_roundoff
    xs = torch.as_tensor(x).to(torch.float64)
    ds = torch.as_tensor(dy).to(torch.float64)
    N, K, OD, OH, OW = ds.shape
    if any(s % 2 for s in (OD, OH, OW)) or tuple(xs.shape[2:]) != (OD + 2, OH + 2, OW + 2):
        raise ValueError(f"x {tuple(xs.shape)} and dy {tuple(ds.shape)}: dy needs even sizes "
                         "and x two more along each")
    C = xs.shape[1]
    A, BT, GT = (torch.from_numpy(mat) for mat in (a, bt, gt))
    sums = {k: torch.zeros(64, K, C, dtype=torch.float64) for k in ("abs", "sq", "signed")}

    def transformed(mat, t, channels):
        return torch.einsum("pa,qb,rc,nxtuvabc->pqrnxtuv", mat, mat, mat, t).reshape(
            64, N, channels, -1)

    for d0 in range(0, OD // 2, chunk):  # slabs of tile planes: bounded memory
        d1 = min(OD // 2, d0 + chunk)
        xt = xs[:, :, 2 * d0:2 * d1 + 2].unfold(2, 4, 2).unfold(3, 4, 2).unfold(4, 4, 2)
        dt = ds[:, :, 2 * d0:2 * d1].unfold(2, 2, 2).unfold(3, 2, 2).unfold(4, 2, 2)
        sums["abs"] += torch.einsum("pnkt,pnxt->pkx", transformed(A.abs(), dt.abs(), K),
                                    transformed(BT.abs(), xt.abs(), C))
        if random_inputs:
            dv, xv = transformed(A, dt, K), transformed(BT, xt, C)
            sums["sq"] += torch.einsum("pnkt,pnxt->pkx", dv * dv, xv * xv)
            sums["signed"] += torch.einsum("pnkt,pnxt->pkx", dv, xv)
    tiles = N * (OD // 2) * (OH // 2) * (OW // 2)
    s = sums["abs"]
    e = torch.minimum(sums["sq"].sqrt() + sums["signed"].abs(), s) if random_inputs else s
    inner = (gamma(n, u) * s + tol_factor * math.sqrt(tiles) * u * e).reshape(4, 4, 4, K, C)
    return torch.einsum("ap,bq,er,pqrkx->kxabe", GT.abs(), GT.abs(), GT.abs(), inner).numpy()


def _adjoint_roundings(channels: int) -> int:
    """The adjoint's roundings per term (see :func:`adjoint_error_bound`)."""
    at, g, bt = transforms(2, 3)
    return (3 * (roundings_per_axis(g) + roundings_per_axis(at.T) + roundings_per_axis(bt.T))
            + 1 + (channels - 1) + 7)


def adjoint_error_bound(dy, w, out_shape, pads, unit_roundoff: float = 2.0 ** -24,
                        tol_factor: float = 0.0, random_inputs: bool = False):
    """A bound on each element's error of dL/dx by the forward F(2^3, 3^3)'s adjoint (the
    kernel ``winogradF2BwdDataAdjoint``): per forward tile, ``B [sum_k U_k (A dy_k)]`` added
    into dL/dx where the 4^3 patches overlap.  ``dy`` (N, K, OD, OH, OW), ``w`` (K, C, 3, 3,
    3), ``out_shape`` dL/dx's (D, H, W), ``pads`` the forward layer's; float64 (N, C, D, H,
    W).

    ``gamma_n Y_abs`` as for the forward (:func:`error_bound`): ``n`` counts the filter's,
    dy's and the patch's transforms, the product, the ``K - 1`` additions over the output
    channels and the 7 that add up to eight overlapping patches; ``Y_abs`` is the same
    algorithm in float64 on absolute values, computed as one transposed convolution of
    dy's tiles (8 K channels) with the composed kernel at stride 2.  With
    ``random_inputs`` and a ``tol_factor``, the smaller of that and the statistical bound
    (:func:`adjoint_statistical_bound`: :func:`statistical_bound`'s argument for the sum
    over the ``K`` output channels)."""
    import torch
    if random_inputs and tol_factor:  # both hold: the smaller, element by element
        return np.minimum(adjoint_statistical_bound(dy, w, out_shape, pads, unit_roundoff,
                                                    tol_factor).numpy(),
                          adjoint_error_bound(dy, w, out_shape, pads, unit_roundoff))
    at, g, bt = transforms(2, 3)
    a, b = at.T, bt.T
    wa = torch.as_tensor(w).to(torch.float64).abs()
    da = torch.as_tensor(dy).to(torch.float64).abs()
    K, C = wa.shape[:2]
    G, A, B = (torch.from_numpy(np.abs(mat)) for mat in (g, a, b))
    u = torch.einsum("ad,be,cf,kxdef->kxabc", G, G, G, wa)
    # kern[k, o, c, q] = sum_p |B|[q, p] |U|[k, c, p] |A|[p, o] (o: a tile's pixel)
    kern = _composed(A, B.T, u).permute(0, 2, 3, 4, 1, 5, 6, 7)  # K o1 o2 o3 C q1 q2 q3
    kern = kern.reshape(K * 8, C, 4, 4, 4)
    N, _, OD, OH, OW = da.shape
    da = torch.nn.functional.pad(da, (0, OW % 2, 0, OH % 2, 0, OD % 2))
    TD, TH, TW = (-(-s // 2) for s in (OD, OH, OW))
    tiles = da.reshape(N, K, TD, 2, TH, 2, TW, 2).permute(0, 1, 3, 5, 7, 2, 4, 6)
    y = torch.nn.functional.conv_transpose3d(tiles.reshape(N, K * 8, TD, TH, TW), kern, stride=2)
    (D, H, W), (pd, ph, pw) = out_shape, pads
    return gamma(_adjoint_roundings(K), unit_roundoff) * y[:, :, pd:pd + D, ph:ph + H,
                                                            pw:pw + W].numpy()


def adjoint_statistical_bound(dy, w, out_shape, pads, unit_roundoff: float = 2.0 ** -24,
                              tol_factor: float = 8.0):
    """:func:`adjoint_error_bound` on random inputs, a float64 torch tensor: per forward
    tile and transform point, ``gamma_n0 S + tol_factor sqrt(K) u E`` for the sum over the
    ``K`` output channels (``n0``: every rounding but that sum's), carried through ``|B|``
    and added where the patches overlap."""
    import torch
    at, g, bt = (torch.from_numpy(mat) for mat in transforms(2, 3))
    a, b = at.T, bt.T
    ws = torch.as_tensor(w).to(torch.float64)
    ds = torch.as_tensor(dy).to(torch.float64)
    K, C = ws.shape[:2]
    N, _, OD, OH, OW = ds.shape
    spec = "ad,be,cf,kxdef->abcxk"  # U^T per point: [P, C, K]
    u = _along(g, ws, spec).reshape(64, C, K)
    ua = _along(g.abs(), ws.abs(), spec).reshape(64, C, K)
    ds = torch.nn.functional.pad(ds, (0, OW % 2, 0, OH % 2, 0, OD % 2))
    TD, TH, TW = (-(-s // 2) for s in (OD, OH, OW))
    tiles = ds.reshape(N, K, TD, 2, TH, 2, TW, 2)
    patch = torch.einsum("ia,jb,lc->abcijl", b.abs(), b.abs(), b.abs()).reshape(64, 1, 4, 4, 4)
    patch = patch.repeat(C, 1, 1, 1, 1)  # [C * 64, 1, 4, 4, 4]: |B| along 3 axes per point
    n0 = _adjoint_roundings(1)
    out = torch.zeros(N, C, 2 * TD + 2, 2 * TH + 2, 2 * TW + 2, dtype=torch.float64)
    slab = max(1, SLAB_ELEMENTS // (64 * N * max(K, C) * TH * TW))
    spec = "pa,qb,rc,nksaubvc->pqrknsuv"
    for d0 in range(0, TD, slab):
        d1 = min(TD, d0 + slab)
        t = tiles[:, :, d0:d1]
        v = _along(a, t, spec).reshape(64, K, -1)
        va = _along(a.abs(), t.abs(), spec).reshape(64, K, -1)
        inner = _domain_sums(u, v, ua, va, K, n0, unit_roundoff, tol_factor)  # 64, C, N t
        inner = inner.reshape(64, C, N, d1 - d0, TH, TW).permute(2, 1, 0, 3, 4, 5)
        y = torch.nn.functional.conv_transpose3d(
            inner.reshape(N, C * 64, d1 - d0, TH, TW), patch, stride=2, groups=C)
        out[:, :, 2 * d0:2 * d1 + 2] += y
    (D, H, W), (pd, ph, pw) = out_shape, pads
    return out[:, :, pd:pd + D, ph:ph + H, pw:pw + W].contiguous()
