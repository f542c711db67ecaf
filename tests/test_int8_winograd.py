"""The exact int8 Winograd forward (convkernels/cpu/winograd/int8.py): its int32 sums equal
the direct convolution's bit for bit and its uint8 output passes the requantization check,
on both loop orders, on the AVX2 path, with cut-short tiles and few channels; every plant
of the int8 check fails; and its transformed filter is F(2^3, 3^3)'s, scaled by 8."""

import numpy as np
import pytest

from convbench.layersets.layer import Layer
from convbench.quant import int8
from convkernels.cpu.direct import int8_dot
from convkernels.cpu.winograd import int8 as wq

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation")

KERNEL = int8.WINOGRAD_KERNEL
#: Few channels (C = 6: the channel loop's element-by-element tail), odd output sizes
#: (cut-short tiles); a vector of channels (C = 64) with K = 48 (three blocks of 16); no
#: padding.
LAYERS = [Layer("few", batch=2, in_channels=6, out_channels=32, in_d=5, in_h=6, in_w=7,
                k_d=3, k_h=3, k_w=3, stride=1, pad=1),
          Layer("vector", batch=1, in_channels=64, out_channels=48, in_d=7, in_h=6, in_w=5,
                k_d=3, k_h=3, k_w=3, stride=1, pad=1),
          Layer("nopad", batch=1, in_channels=32, out_channels=32, in_d=6, in_h=7, in_w=6,
                k_d=3, k_h=3, k_w=3, stride=1, pad=0)]


def _verify(layer, cachedir, **kw):
    return int8.verify(layer, cachedir=cachedir, kernel=KERNEL, **kw)


@pytest.mark.parametrize("group", [1, 0])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_the_kernel_is_exact(layer, group, cachedir):
    row = _verify(layer, cachedir, params={"GROUP": group, "T": 0})
    assert row["int32_mismatches"] == 0 and row["uint8_violations"] == 0, row
    assert row["torch_max_diff"] <= 1 and row["ok"], row


@pytest.mark.parametrize("plant", int8.PLANTS)
def test_every_plant_fails(plant, cachedir):
    row = _verify(LAYERS[1], cachedir, plant=plant)
    assert not row["ok"], (plant, row)


def test_the_avx2_path_is_exact(cachedir):
    if not int8_dot.has_feature("avx2"):
        pytest.skip("no AVX2")
    row = _verify(LAYERS[1], cachedir, params={"ISA": 3})
    assert row["ok"], row


def test_the_transformed_filter_is_winograds():
    """For one tile, A^T [U (B^T d B)] A / 8 with pack's U is the direct convolution's
    2 x 2 x 2 output, for random integers (numpy, apart from the kernel)."""
    rng = np.random.default_rng(0)
    layer = Layer("one", batch=1, in_channels=2, out_channels=16, in_d=4, in_h=4, in_w=4,
                  k_d=3, k_h=3, k_w=3, stride=1, pad=0)
    w = rng.integers(-128, 128, size=(16, 2, 3, 3, 3))
    d = rng.integers(-255, 256, size=(2, 4, 4, 4))
    params = KERNEL.resolve_params({})
    u = wq.pack(layer, params, w).astype(np.int64)           # [kb][p][c2][KBW][2]
    blocks, _, _, kbw, _ = u.shape
    U = u.transpose(0, 3, 1, 2, 4).reshape(16, 64, 2)        # [k][p][c]
    V = np.einsum("ia,jb,lc,zabc->zijl", wq.BT, wq.BT, wq.BT, d).reshape(2, 64)
    M = np.einsum("kpc,cp->kp", U, V).reshape(16, 4, 4, 4)
    y8 = np.einsum("ia,jb,lc,kabc->kijl", wq.AT, wq.AT, wq.AT, M)
    direct = np.zeros((16, 2, 2, 2), np.int64)
    for a in range(2):
        for b in range(2):
            for c in range(2):
                direct[:, a, b, c] = np.einsum("kzxyv,zxyv->k", w, d[:, a:a + 3, b:b + 3, c:c + 3])
    assert (y8 % 8 == 0).all() and (y8 // 8 == direct).all()
    assert np.abs(u).max() <= 27 * 128


def test_refusals_say_why(monkeypatch):
    params = KERNEL.resolve_params({})
    strided = Layer("s", batch=1, in_channels=8, out_channels=32, in_d=8, in_h=8, in_w=8,
                    k_d=3, k_h=3, k_w=3, stride=2, pad=1)
    odd = Layer("o", batch=1, in_channels=3, out_channels=32, in_d=8, in_h=8, in_w=8,
                k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    wide = Layer("w", batch=1, in_channels=320, out_channels=32, in_d=8, in_h=8, in_w=8,
                 k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    assert "stride 1" in KERNEL.unsupported_reason(strided, params)
    assert "pairs" in KERNEL.unsupported_reason(odd, params)
    assert "int32" in KERNEL.unsupported_reason(wide, params)
    monkeypatch.setattr(int8_dot, "has_feature", lambda flag: flag == "avx2")
    reason = KERNEL.unsupported_reason(LAYERS[1], KERNEL.resolve_params({"ISA": 1}))
    assert "this CPU has no avx512_vnni" in reason


def test_the_blocking_follows_its_rules():
    p = KERNEL.resolve_params({"ISA": 1})
    deep = Layer("deep", batch=2, in_channels=256, out_channels=512, in_d=8, in_h=8, in_w=8,
                 k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    t, rt, nv, vl, kq = wq.blocking(deep, p)
    assert (rt, nv, vl) == (8, 2, 16) and not wq.group_of(deep, p)  # per block: C > 128
    v_bytes, m_bytes = wq.budgets()
    assert t % rt == 0 and 128 * t * 256 <= v_bytes and 256 * t * nv * vl <= m_bytes
    t, rt, nv, vl, kq = wq.blocking(LAYERS[1], p)
    assert (rt, nv) == (10, 1) and wq.group_of(LAYERS[1], p) and t % rt == 0
