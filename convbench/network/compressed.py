"""``convbench compress-train``: CosmoFlow trained on synthetic data in float32, with
quantization-aware training (LSQ) and with block pruning, compared by validation loss.

All three runs share their first ``--steps / 2`` steps (float32, one model, one data
order); each then trains ``--steps / 2`` more steps from that state with a fresh Adam:

* ``fp32``: as it was;
* ``lsq``: every convolution's input fake-quantized to uint8 with a learned step size and
  offset (LSQ+: the zero point learned too), its filter to int8 with a learned step size
  per output channel (LSQ), both with straight-through rounding and LSQ's gradient scale
  ``1 / sqrt(elements x Qmax)``: the convention of the int8 kernel (docs/int8.md);
* ``pruned``: every convolution's filter pruned to ``--density`` percent of its blocks
  (:func:`convbench.quant.sparse.prune`, the block-sparse kernel's pruning: blocks of one
  vector of this CPU's output channels, recorded in the metadata), then fine-tuned with
  the pruned blocks held at zero.

Each run after the shared steps starts from the same torch seed, so they draw the same
dropout masks.

The validation loss (mean squared error on a held-out synthetic set, the model in eval
mode) is taken every ``--every`` steps.  Writes ``curves.csv`` (run, step, training loss,
validation loss), ``metadata.json`` (the final losses and their ratios to fp32) and
``loss.png`` (drawn from ``curves.csv``).  The convolutions are torch's: this measures what
the compression costs the model, not the kernels' speed.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import time
from pathlib import Path
from typing import Dict, List

from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main

PROG = "convbench compress-train"
RUNS = ("fp32", "lsq", "pruned")


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlperf", help="CosmoFlow model (default mlperf)")
    p.add_argument("--size", type=int, default=32, help="cube edge (default 32)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--steps", type=int, default=800, help="training steps per run, the "
                   "first half shared (default 800)")
    p.add_argument("--samples", type=int, default=512, help="training samples (default 512)")
    p.add_argument("--val-samples", type=int, default=128, help="validation samples (default 128)")
    p.add_argument("--every", type=int, default=40, help="validation every N steps (default 40)")
    p.add_argument("--density", type=int, default=25,
                   help="percent of each filter's blocks the pruned run keeps (default 25)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--outdir", default=None, help="result folder (default outputs/compress-train/)")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


# -- the quantizers ---------------------------------------------------------------------------

def _lsq_class():
    import torch
    from torch import nn

    def grad_scale(x, scale):  # x forward, its gradient times scale backward
        return (x - x * scale).detach() + x * scale

    def round_pass(x):  # round forward, identity backward (straight through)
        return (x.round() - x).detach() + x

    class LSQ(nn.Module):
        """Fake quantization to the integers ``[qmin, qmax]`` with a learned step (one, or
        one per output channel) and, where ``offset``, a learned offset (LSQ+), initialised
        from the first tensor it sees."""

        def __init__(self, qmin: int, qmax: int, channels: int = 0, offset: bool = False):
            super().__init__()
            self.qmin, self.qmax, self.channels = qmin, qmax, channels
            shape = (channels, 1, 1, 1, 1) if channels else ()
            self.step = nn.Parameter(torch.ones(shape))
            self.offset = nn.Parameter(torch.zeros(shape)) if offset else None
            self.register_buffer("ready", torch.tensor(False))

        @torch.no_grad()
        def _initialise(self, v):
            if self.channels:  # symmetric, per channel: the largest magnitude at qmax
                top = v.abs().flatten(1).amax(dim=1).clamp_min(1e-8)
                self.step.copy_((top / self.qmax).view_as(self.step))
            else:  # the tensor's range over the integers
                lo, hi = float(v.min()), float(v.max())
                self.step.fill_(max(hi - lo, 1e-8) / (self.qmax - self.qmin))
                if self.offset is not None:
                    self.offset.fill_(lo - self.qmin * float(self.step))
            self.ready.fill_(True)

        def forward(self, v):
            if not bool(self.ready):
                self._initialise(v)
            per = v[0].numel() if self.channels else v.numel()
            step = grad_scale(self.step, 1.0 / math.sqrt(per * self.qmax))
            shift = 0.0 if self.offset is None else grad_scale(self.offset, 1.0 / math.sqrt(
                per * self.qmax))
            q = round_pass(torch.clamp((v - shift) / step, self.qmin, self.qmax))
            return q * step + shift

    return LSQ


def quantize(model) -> None:
    """Make every convolution of ``model`` quantization-aware (module docstring)."""
    from torch.nn.utils import parametrize
    LSQ = _lsq_class()
    for conv in model.convs:
        parametrize.register_parametrization(
            conv, "weight", LSQ(-127, 127, channels=conv.layer.out_channels))
        conv.input_quant = LSQ(0, 255, offset=True)
        conv.register_forward_pre_hook(lambda m, args: (m.input_quant(args[0]),) + args[1:])


def prune(model, density: int):
    """Prune every convolution's filter to ``density`` percent of its blocks; returns the
    masks that keep the pruned blocks at zero (:func:`hold`)."""
    import torch
    from convbench.quant.sparse import prune as prune_filter
    masks = []
    with torch.no_grad():
        for conv in model.convs:
            pruned, _ = prune_filter(conv.weight.detach(), conv.layer, density)
            mask = pruned != 0
            conv.weight.mul_(mask)
            masks.append((conv.weight, mask))
    return masks


def hold(masks) -> None:
    import torch
    with torch.no_grad():
        for weight, mask in masks:
            weight.mul_(mask)


# -- the runs ---------------------------------------------------------------------------------

def _loss(model, x, y):
    import torch
    return torch.nn.functional.mse_loss(model(x), y)


def _validate(model, data) -> float:
    import torch
    model.eval()
    with torch.no_grad():
        losses = [float(_loss(model, x, y)) for x, y in data]
    model.train()
    return sum(losses) / len(losses)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--size", args.size, 4), ("--batch", args.batch, 1),
                   ("--steps", args.steps, 2), ("--samples", args.samples, 1),
                   ("--val-samples", args.val_samples, 1), ("--every", args.every, 1))
    if not 1 <= args.density <= 100:
        raise UsageError(f"--density: a percentage from 1 to 100, got {args.density}")
    if args.samples < args.batch or args.val_samples < args.batch:
        raise UsageError("--samples and --val-samples must hold at least one --batch")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr: must be a positive number, got {args.lr}")
    from convbench.network.cosmoflow import MODELS, build_model
    if args.model not in MODELS:
        raise UsageError(f"--model: unknown model {args.model!r} (known: {', '.join(MODELS)})")
    spec = MODELS[args.model]
    if args.size >> spec.pools < 1:
        raise UsageError(f"--size {args.size}: {spec.pools} pools need at least {1 << spec.pools}")
    import torch
    from convbench.network.synthetic import make_dataset
    from convbench.timing.devices import set_threads
    args.threads = set_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.outdir or "outputs/compress-train")
    out.mkdir(parents=True, exist_ok=True)
    x_all, y_all = make_dataset(args.samples, args.size, spec.in_channels, seed=args.seed + 7)
    xv, yv = make_dataset(args.val_samples, args.size, spec.in_channels, seed=args.seed + 1007)
    val = [(xv[i:i + args.batch], yv[i:i + args.batch])
           for i in range(0, args.val_samples - args.batch + 1, args.batch)]
    batches = args.samples // args.batch

    def batch(step):  # one data order for every run: batch i of epoch e, fixed by the seed
        epoch, b = divmod(step, batches)
        perm = torch.randperm(args.samples, generator=torch.Generator().manual_seed(
            args.seed * 1000 + epoch))
        idx = perm[b * args.batch:(b + 1) * args.batch]
        return x_all[idx], y_all[idx]

    model = build_model(spec, args.size, args.batch)
    curves: List[Dict[str, object]] = []
    t0 = time.perf_counter()

    def train(name, model, opt, first, last, after=None):
        for step in range(first, last):
            x, y = batch(step)
            loss = _loss(model, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if after is not None:
                after()
            if (step + 1) % args.every == 0 or step + 1 == last:
                row = {"run": name, "step": step + 1, "train_loss": float(loss.detach()),
                       "val_loss": _validate(model, val)}
                curves.append(row)
                print(f"  {name:6s} step {step + 1:4d}  loss {row['train_loss']:.4f}  val "
                      f"{row['val_loss']:.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)

    half = args.steps // 2
    print(f"{args.model} {args.size}^3 batch {args.batch}: {half} shared float32 steps, then "
          f"{args.steps - half} per run ({', '.join(RUNS)}; pruned to {args.density}%)",
          flush=True)
    train("shared", model, torch.optim.Adam(model.parameters(), lr=args.lr), 0, half)
    finals = {}
    for name in RUNS:
        run = copy.deepcopy(model)
        torch.manual_seed(args.seed + 1)  # every run draws the same dropout masks
        after = None
        if name == "lsq":
            quantize(run)
            with torch.no_grad():  # the quantizers take their ranges from one batch
                run.eval()
                run(batch(half)[0])
                run.train()
        elif name == "pruned":
            masks = prune(run, args.density)
            after = lambda masks=masks: hold(masks)  # noqa: E731
        opt = torch.optim.Adam(run.parameters(), lr=args.lr)
        train(name, run, opt, half, args.steps, after)
        finals[name] = curves[-1]["val_loss"]
    _write(out, curves, args, finals)
    ratios = {k: v / finals["fp32"] for k, v in finals.items()}
    print("final validation loss: " + ", ".join(
        f"{k} {v:.4f} ({ratios[k]:.3f}x fp32)" for k, v in finals.items()))
    print(f"results: {out}")
    return 0


def _write(out: Path, curves, args, finals) -> None:
    from convbench.base.files import write_atomic
    from convbench.build.toolchain import PROJECT_ROOT
    from convbench.build.tuned import machine_id
    from convbench.results.writer import run_metadata
    from convbench.results.writer import csv_text
    write_atomic(out / "curves.csv", csv_text(["run", "step", "train_loss", "val_loss"], curves))
    from convkernels.cpu.direct.sparse import lanes
    meta = dict(run_metadata(PROJECT_ROOT, "cpu", args.threads), machine=machine_id("cpu"),
                settings={k: v for k, v in vars(args).items() if k != "outdir"},
                pruning_block_channels=lanes(),  # the pruned run's blocks: this CPU's vector
                final_val_loss=finals,
                ratio_vs_fp32={k: v / finals["fp32"] for k, v in finals.items()})
    write_atomic(out / "metadata.json", json.dumps(meta, indent=2, default=str))
    plot(out)


def plot(folder: Path) -> Path:
    """``loss.png``: the validation loss of each run against the step, from ``curves.csv``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(csv.DictReader(open(folder / "curves.csv")))
    meta = json.loads((folder / "metadata.json").read_text())
    s = meta["settings"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("shared",) + RUNS:
        mine = [r for r in rows if r["run"] == name]
        label = name if name != "pruned" else f"pruned ({s['density']}%)"
        ax.plot([int(r["step"]) for r in mine], [float(r["val_loss"]) for r in mine],
                marker=".", label=label, color="grey" if name == "shared" else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation loss (MSE)")
    ax.set_title(f"CosmoFlow {s['model']} {s['size']}^3 b{s['batch']}, synthetic data, "
                 f"torch convolutions\n{meta['machine']}", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "loss.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
