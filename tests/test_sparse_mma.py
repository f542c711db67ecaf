"""The 2:4 sparse tensor-core forward (convkernels/gpu/mma/sparse.py): its CPU emulation of
ldmatrix and mma.sp gives the exact sums of the pruned convolution, the packed filter
holds what the format says, and every planted layout error (the filter's rows, the
pixels' matrices, the metadata's lanes, unordered indices) fails."""

import csv
import shutil

import numpy as np
import pytest

from convbench.build import sass
from convbench.layersets.layer import Layer
from convbench.quant import sparse
from convkernels.gpu.mma import sparse as kernel

#: Small tiles: two warps along each side, so the warp offsets are exercised.
TILES = {"CTAtileM": 32, "CTAtileN": 64, "CTAtileK": 32, "warpTileM": 16, "warpTileN": 32,
         "stages": 3}
#: Taps packed into K tiles (C = 8), and a strided layer whose channels (40) leave a
#: partial K tile and whose K (48) a partial block.
LAYERS = [Layer("packed", batch=1, in_channels=8, out_channels=32, in_d=4, in_h=5, in_w=6,
                k_d=3, k_h=3, k_w=3, stride=1, pad=1),
          Layer("strided", batch=2, in_channels=40, out_channels=48, in_d=5, in_h=7, in_w=5,
                k_d=3, k_h=3, k_w=3, stride=2, pad=1)]


def _swapped_a_rows(s):  # the 8-row halves of the channel tile exchanged
    return kernel.layout.swizzle(s.CPR // 2, f"wn * {s.WN} + fc * 16 + (ln & 7) + "
                                 "(1 - ((ln >> 3) & 1)) * 8", "kk * 2 + (ln >> 4)") + " * 16"


def _swapped_b_matrices(s):  # chunks 1 and 2 of the pixels' step exchanged
    chunk = "kk * 4 + ((ln >> 3) == 1 ? 2 : (ln >> 3) == 2 ? 1 : (ln >> 3))"
    return kernel.layout.swizzle(s.CPR, f"wm * {s.WM} + fp * 8 + (ln & 7)", chunk) + " * 16"


PLANTS = {"a_rows": ("a_address", _swapped_a_rows),
          "b_matrices": ("b_address", _swapped_b_matrices),
          "metadata_lanes": ("meta_slot", lambda lane: f"({lane} >> 2) * 2 + 1 - ({lane} & 1)"),
          "unordered_indices": ("nibble", lambda i0, i1: i1 | (i0 << 2))}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_the_emulation_is_exact(layer, dtype, cachedir):
    row = sparse.verify_mma(layer, TILES, cachedir=cachedir, dtype=dtype)
    assert row["ok"] and row["mismatches"] == 0 and row["nan"] == 0, row


@pytest.mark.parametrize("plant", PLANTS)
def test_every_plant_fails(plant, cachedir, monkeypatch):
    name, planted = PLANTS[plant]
    monkeypatch.setattr(kernel, name, planted)
    row = sparse.verify_mma(LAYERS[1], TILES, cachedir=cachedir, planted=f"sparse_{plant}")
    assert not row["ok"], (plant, row)


def _unpack(layer, params, packed):
    """The logical 2:4 filter (K x taps x C) read back from the packed array by the
    module docstring's format, independently of pack's code."""
    s = kernel.sparse_shape(layer, "cb_half", params)
    values = packed[:s.K * s.taps * s.C // 2].reshape(s.K, s.taps * s.C // 4, 2)
    words = packed[s.WOFF:].view(np.uint32).reshape(s.KT, s.NQ, s.KS, 8, 2)
    w = np.zeros((s.K, s.taps * s.C), packed.dtype)
    for n in range(s.K):
        q, r = divmod(n, 16)
        for kt in range(s.KT):
            for j in range(s.TK // 4):  # the K tile's groups
                if s.packed:
                    group = kt * s.TK // 4 + j
                else:
                    tap, cb = divmod(kt, s.CB)
                    if cb * s.TK // 4 + j >= s.C // 4:
                        continue
                    group = tap * s.C // 4 + cb * s.TK // 4 + j
                if group >= s.taps * s.C // 4:
                    continue
                ks, h, u = j // 8, (j // 4) % 2, j % 4
                word = int(words[kt, q, ks, r % 8, h]) >> (16 * (r // 8) + 4 * u)
                i0, i1 = word & 3, (word >> 2) & 3
                assert i0 < i1, (n, kt, j)
                w[n, 4 * group + i0], w[n, 4 * group + i1] = values[n, group]
    return w


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_the_packed_filter_reads_back(layer):
    x, w = sparse.integer_operands(layer)
    params = sparse.MMA_KERNEL.resolve_params(TILES)
    logical = w.permute(0, 2, 3, 4, 1).reshape(layer.out_channels, -1).numpy()
    packed = sparse.packed_filter(layer, params, w).numpy()
    assert (_unpack(layer, params, packed) == logical.astype(np.float16)).all()
    groups = logical.reshape(-1, 4)
    assert ((groups != 0).sum(axis=1) <= 2).all() and (groups != 0).any()


def test_pruning_keeps_the_two_largest_of_each_group():
    w = np.array([[1.0, -5.0, 3.0, 2.0, 0.0, 0.0, 0.0, 7.0]])
    assert kernel.prune_2to4(w).tolist() == [[0.0, -5.0, 3.0, 0.0, 0.0, 0.0, 0.0, 7.0]]
    with pytest.raises(ValueError, match="not 2:4"):
        kernel.pack(LAYERS[0], sparse.MMA_KERNEL.resolve_params(TILES),
                    np.ones((32, 3, 3, 3, 8), np.float16))


def test_refusals_say_why():
    c6 = Layer("c6", batch=1, in_channels=6, out_channels=32, in_d=4, in_h=4, in_w=4,
               k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    params = sparse.MMA_KERNEL.resolve_params({})
    assert "multiple of 4" in sparse.MMA_KERNEL.unsupported_reason(c6, params)
    assert "multiple of 32" in kernel.sparse_check_params(dict(params, CTAtileK=16))
    narrow = dict(TILES, CTAtileN=32, warpTileN=16)  # 64 compressed chunks, 128 threads
    assert "split evenly" in kernel.sparse_check_params(narrow)


@pytest.mark.skipif(shutil.which("nvcc") is None or sass.tool_dir() is None,
                    reason="nvcc or cuobjdump/nvdisasm is not installed")
def test_the_main_loop_runs_on_sparse_tensor_cores(tmp_path, write_csv):
    """sm_90 machine code: the main loop's tensor-core instructions are HMMA.SP.16832
    (2:4 sparse A, float32 sums), no spills."""
    from convbench.commands import sparse as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "deep,2,128,256,8,8,8,3,3,3,1,1\n")
    assert command.main(["sass", "--paramscsv", str(sets), "--outdir", str(tmp_path)]) == 0
    main, = [r for r in csv.DictReader(open(tmp_path / "sass.csv")) if r["main"] == "yes"]
    assert main["tensor_ops"].endswith("HMMA.SP.16832.F32") and main["spill_stores"] == "0", main


def test_verify_gpu_command(tmp_path, write_csv, cachedir):
    from convbench.commands import sparse as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "packed,1,4,32,4,4,8,3,3,3,1,1\nc1,1,1,16,4,4,4,3,3,3,1,0\n")
    argv = ["verify-gpu", "--paramscsv", str(sets), "--cachedir", str(cachedir),
            "--outdir", str(tmp_path), "--dtype", "bfloat16"] + [
                f"--param={k}={v}" for k, v in TILES.items()]
    assert command.main(argv) == 0
    rows = {r["layer"]: r for r in csv.DictReader(open(tmp_path / "verify_gpu.csv"))}
    assert rows["packed"]["status"] == "passed" and rows["c1"]["status"] == "unsupported"


@pytest.mark.full
def test_the_emulation_verifies_the_cosmoflow_layers(cachedir):
    from convbench.layersets.sets import load_layers
    for layer in load_layers("cosmoflow_mlperf_s64"):
        row = sparse.verify_mma(layer.with_batch(1), cachedir=cachedir)
        assert row["ok"], (layer.name, row)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_the_sparse_kernel_on_the_gpu(layer, tmp_path):
    """The sparse tensor cores themselves (a GPU campaign's test phase runs this): the
    float32 sums bit for bit, at the small tiles and at the defaults, in both types."""
    for params in (TILES, {}):
        for dtype in ("float16", "bfloat16"):
            row = sparse.verify_mma(layer, params, target="gpu", cachedir=tmp_path, dtype=dtype)
            assert row["ok"], (params, dtype, row)
