"""The block-sparse forward kernel (convbench/quant/sparse.py,
convkernels/cpu/direct/sparse.py): it verifies at every density against torch float64 with
the pruned filter, a skipped block fails, and pruning keeps the blocks it says."""

import csv
import json

import pytest
import torch

from convbench.layersets.layer import Layer
from convbench.quant import sparse
from convkernels.cpu.direct import sparse as kernel

#: Padded, strided along nothing, a run of KW x C = 15 positions.
SMALL = Layer("small", batch=2, in_channels=5, out_channels=32, in_d=5, in_h=6, in_w=8,
              k_d=3, k_h=3, k_w=3, stride=1, pad=1)
STRIDED = Layer("strided", batch=1, in_channels=3, out_channels=16, in_d=9, in_h=7, in_w=9,
                k_d=3, k_h=3, k_w=3, stride=2, pad=0)
CSV = ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
       "small,2,5,32,5,6,8,3,3,3,1,1\n")


@pytest.mark.parametrize("layer, density", [(SMALL, 100), (SMALL, 25), (STRIDED, 10)],
                         ids=["small-100", "small-25", "strided-10"])
def test_the_kernel_verifies(layer, density, cachedir):
    check = sparse.verify(layer, density, cachedir=cachedir)
    assert check.ok, check.summary()


def test_a_skipped_block_fails(cachedir):
    check = sparse.verify(SMALL, 50, plant=True, cachedir=cachedir)
    assert not check.ok and check.worst_ratio > 10, check.summary()


def test_pruning_keeps_the_largest_blocks_of_each_vector():
    w = torch.rand(SMALL.filter_shape, generator=torch.Generator().manual_seed(3)) * 2 - 1
    pruned, keep = sparse.prune(w, SMALL, 25)
    V = kernel.lanes()
    total = 27 * SMALL.in_channels
    assert keep.shape == (32 // V, kernel.kept(SMALL, 25)) == (32 // V, round(total / 4))
    blocks = sparse._blocks(pruned, SMALL)  # [K/V, V, R]
    nonzero = blocks.abs().sum(dim=1) > 0
    assert torch.equal(nonzero.sum(dim=1), torch.full((32 // V,), keep.shape[1]))
    norms = sparse._blocks(w, SMALL).pow(2).sum(dim=1)
    for b in range(32 // V):  # every kept block at least as large as every dropped one
        assert norms[b][nonzero[b]].min() >= norms[b][~nonzero[b]].max()
    assert torch.equal(blocks, sparse._blocks(w, SMALL) * nonzero.unsqueeze(1))  # kept as they were


def test_the_command_verifies_and_benches(tmp_path, write_csv, cachedir, capsys):
    from convbench.commands import sparse as command
    sets = write_csv(CSV)
    base = ["--paramscsv", str(sets), "--cachedir", str(cachedir), "--densities", "100,50"]
    assert command.main(["verify"] + base + ["--outdir", str(tmp_path / "v")]) == 0
    assert command.main(["verify", "--plant"] + base + ["--outdir", str(tmp_path / "p")]) == 1
    assert "FAILED" in capsys.readouterr().out
    out = tmp_path / "b"
    assert command.main(["bench"] + base + ["--rounds", "2", "--warmup", "0", "--fp32",
                                            "directConvNDHWCblocked", "--outdir", str(out)]) == 0
    rows = {r["contestant"]: r for r in csv.DictReader(open(out / "summary.csv"))}
    assert set(rows) == {"sparse-100", "sparse-50", "dense-directConvNDHWCblocked"}
    assert float(rows["sparse-100"]["ratio_vs_sparse-100"]) == 1.0
    assert rows["sparse-50"]["fastest_dense"] == "directConvNDHWCblocked"
    assert (out / "density.png").stat().st_size > 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["densities"] == [100, 50]
    # without 100, bench times it anyway: the baseline of its ratios and its plot
    again = tmp_path / "b50"
    assert command.main(["bench", "--paramscsv", str(sets), "--cachedir", str(cachedir),
                         "--densities", "50", "--rounds", "1", "--warmup", "0", "--fp32",
                         "directConvNDHWCblocked", "--outdir", str(again)]) == 0
    assert {r["contestant"] for r in csv.DictReader(open(again / "summary.csv"))} >= {
        "sparse-100", "sparse-50"} and (again / "density.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["verify", "--densities", "0,50"], "--densities"),
    (["verify", "--densities", "x"], "--densities"),
    (["bench", "--param", "DENSITY=5"], "--densities"),
    (["verify", "--param", "PIX=0"], "PIX"),
    (["verify", "--pattern", "2:4", "--densities", "25"], "keeps 50%"),
    (["bench", "--paramscsv", "cosmoflow", "--layer", "conv1", "--pattern", "2:4",
      "--densities", "50"], "groups of 4"),
    (["bench", "--layer", "conv5", "--fp32", "implicitGemmBwdFilter"], "not a forward"),
    (["bench", "--device", "gpu"], "only verify-gpu"),
    (["sass", "--device", "gpu"], "only verify-gpu"),
    (["verify-gpu", "--plant"], "--plant"),
    (["verify-gpu", "--param", "CTAtileK=16"], "multiple of 32"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    from convbench.commands import sparse as command
    assert command.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_two_of_four_keeps_the_two_largest_of_every_group(cachedir):
    w = torch.rand(SMALL.filter_shape, generator=torch.Generator().manual_seed(5)) * 2 - 1
    layer = Layer("s4", batch=1, in_channels=4, out_channels=32, in_d=4, in_h=4, in_w=4,
                  k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    w = w[:, :4].contiguous()
    pruned, keep = sparse.prune(w, layer, 50, "2:4")
    kept = sparse._blocks(pruned, layer).abs().sum(dim=1) > 0  # [K/V, R]
    groups = kept.view(kept.shape[0], -1, 4)
    assert torch.equal(groups.sum(dim=2), torch.full(groups.shape[:2], 2))
    norms = sparse._blocks(w, layer).pow(2).sum(dim=1).view(kept.shape[0], -1, 4)
    kept_least = norms.masked_fill(~groups, float("inf")).amin(dim=2)
    dropped_most = norms.masked_fill(groups, -1.0).amax(dim=2)
    assert bool((kept_least >= dropped_most).all())
    assert sparse.verify(layer, 50, pattern="2:4", cachedir=cachedir).ok
    assert "groups of 4" in sparse.pattern_refusal(SMALL, "2:4")  # 27 x 5 = 135 positions
