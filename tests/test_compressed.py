"""CosmoFlow trained with LSQ quantization and pruned (convbench/network/compressed.py):
the quantizers put values on their grids and learn their steps, pruning holds its zeros,
and the command writes its curves, metadata and plot."""

import csv
import json

import pytest
import torch

from convbench.network import compressed
from convbench.network.cosmoflow import MODELS, build_model


def test_lsq_puts_values_on_its_grid_and_learns_its_step():
    LSQ = compressed._lsq_class()
    q = LSQ(-127, 127, channels=3)
    w = torch.randn(3, 2, 3, 3, 3, requires_grad=True)
    out = q(w)
    step = q.step.detach().view(3, 1, 1, 1, 1)
    levels = out.detach() / step
    assert torch.allclose(levels, levels.round(), atol=1e-4)  # on the int8 grid
    assert float(levels.abs().max()) <= 127 + 1e-4
    out.pow(2).sum().backward()
    assert q.step.grad is not None and float(q.step.grad.abs().sum()) > 0
    assert w.grad is not None  # straight through

    a = LSQ(0, 255, offset=True)
    x = torch.rand(4, 5) * 3 - 1
    y = a(x)
    grid = (y.detach() - a.offset.detach()) / a.step.detach()
    assert torch.allclose(grid, grid.round(), atol=1e-3)
    assert float(grid.min()) >= -1e-3 and float(grid.max()) <= 255 + 1e-3
    assert float((y - x).abs().max()) <= float(a.step.detach()) / 2 + 1e-6  # half a step


def test_quantize_and_prune_change_every_convolution():
    torch.manual_seed(0)
    model = build_model(MODELS["mlperf"], 32, 2)
    x = torch.randn(2, 4, 32, 32, 32)
    reference = model(x).detach()
    quantized = build_model(MODELS["mlperf"], 32, 2)
    quantized.load_state_dict(model.state_dict())
    compressed.quantize(quantized)
    out = quantized(x)
    assert out.shape == reference.shape and not torch.equal(out, reference)
    assert all(hasattr(conv, "input_quant") for conv in quantized.convs)
    masks = compressed.prune(model, 25)
    for weight, mask in masks:
        assert abs(float(mask.float().mean()) - 0.25) < 0.02
        with torch.no_grad():
            weight.add_(1.0)  # an optimizer step that fills the zeros
    compressed.hold(masks)
    assert all(bool((weight[~mask] == 0).all()) for weight, mask in masks)


def test_the_command_writes_curves_metadata_and_plot(tmp_path):
    out = tmp_path / "run"
    assert compressed.main(["--size", "32", "--batch", "2", "--steps", "4", "--every", "2",
                            "--samples", "4", "--val-samples", "2", "--outdir", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "curves.csv")))
    assert {r["run"] for r in rows} == {"shared", "fp32", "lsq", "pruned"}
    assert [int(r["step"]) for r in rows if r["run"] == "lsq"] == [4]
    meta = json.loads((out / "metadata.json").read_text())
    assert set(meta["final_val_loss"]) == {"fp32", "lsq", "pruned"}
    assert meta["ratio_vs_fp32"]["fp32"] == 1.0
    assert (out / "loss.png").stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["--density", "0"], "--density"),
    (["--model", "nope"], "--model"),
    (["--size", "16"], "pools need"),
    (["--samples", "2", "--batch", "4"], "--samples"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert compressed.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
