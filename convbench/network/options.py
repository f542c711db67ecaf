"""The flags of ``scripts/cosmoflow_end2end.py`` (:mod:`convbench.network.end2end`)."""

from __future__ import annotations

import argparse

from convbench.base.errors import ArgumentParser
from convbench.build.chatter import add_verbose_flag
from convbench.commands.flags import (add_cachedir_flag, add_device_flag, add_heap_flag,
                                      add_implementation_flag, add_outdir_flag,
                                      add_precision_flags, add_seed_flag, add_threads_flag)
from convbench.tuning.autotune import DEFAULT_BUDGET_MIN

PROG = "cosmoflow_end2end.py"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from convbench.network.cosmoflow import MODELS, TORCH
    p = ArgumentParser(prog=prog, description="CosmoFlow end to end with DaCe convolutions: forward "
                "pass and training step against torch, checked and timed per layer.")
    p.add_argument("--model", default="mlperf", metavar="|".join(MODELS),
                   help="mlperf (MLPerf HPC CosmoFlow, default) or v1 (the original work's "
                   "7-layer network)")
    p.add_argument("--size", type=int, default=128, metavar="S",
                   help="input edge S (S^3 voxels; default 128; use 32 or 64 on a CPU)")
    p.add_argument("--batch", type=int, default=2, metavar="N", help="batch size (default 2)")
    # Not flags.add_timing_flags: these count iterations of whole networks, never flushed.
    p.add_argument("--iters", type=int, default=5, metavar="N",
                   help="timed iterations per model and phase (default 5; 0: no timing)")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="untimed iterations first (default 1)")
    p.add_argument("--processes", type=int, default=3, metavar="N",
                   help="fresh processes the timing runs in, one after the other (default 3): "
                   "medians are the median of the process medians, with the spread between "
                   "processes beside the spread within one; 1: in this process")
    p.add_argument("--timing-worker", default=None, help=argparse.SUPPRESS)
    add_device_flag(p)
    add_implementation_flag(p, f"forward implementation of every convolution ('{TORCH}': "
                            "torch's; default: per layer and pass, the measured winner or the "
                            "'network-cpu' kernel on the CPU, else the 'network' default of "
                            "`convbench list`)")
    p.add_argument("--impl-map", action="append", default=[], metavar="FILE",
                   help="per-layer (and per-pass) choices: JSON, or CSV with layer and "
                   "implementation columns, e.g. --compareprof summary.csv files (the fastest "
                   "per layer wins); repeatable")
    p.add_argument("--param", action="append", default=[], metavar="IMPL:NAME=VALUE",
                   help="a tunable parameter of one implementation (repeatable)")
    p.add_argument("--train", action="store_true",
                   help="also time the training step (MSE loss, backward, Adam step)")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=None,
                   help="fuse each block's bias, LeakyReLU and max-pool after its DaCe "
                   "convolution, in float32 where the forward stores NDHWC (docs/end2end.md; "
                   "default: on the CPU; on the GPU, where it has not run yet, only when "
                   "asked); --no-fuse runs them in torch")
    p.add_argument("--torch-compile", action="store_true",
                   help="also time torch.compile (TorchInductor) of torch's model in the DaCe "
                   "model's memory format; its first calls (compilation) are reported apart")
    p.add_argument("--check", action="store_true",
                   help="compare the DaCe model's output, loss and parameter gradients with "
                   "torch's; exit 1 on a mismatch")
    p.add_argument("--epochs", type=int, default=0, metavar="E",
                   help="with --train: train both models E epochs on synthetic data first")
    p.add_argument("--samples", type=int, default=16, metavar="N",
                   help="size of the synthetic training set for --epochs (default 16)")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate (default 3e-4)")
    p.add_argument("--dropout", type=float, default=None, metavar="P",
                   help="dropout probability of the dense layers (default: the model's, 0.5)")
    p.add_argument("--memory-format", default="auto", metavar="auto|ncdhw|ndhwc",
                   help="activation memory format of the DaCe model (default auto: ndhwc when "
                   "every DaCe forward implementation is NDHWC, so no layout copies); torch "
                   "is timed in both formats and the faster one is the baseline")
    add_precision_flags(p)
    add_heap_flag(p)
    add_seed_flag(p)
    add_threads_flag(p)
    add_outdir_flag(p, "outputs/end2end_<model>_s<S>_b<N>_<device>[_<dtype>]/")
    add_cachedir_flag(p)
    p.add_argument("--require-precompiled", action="store_true",
                   help="fail if a build is not in the cache (default: build what is missing)")
    p.add_argument("--autotune", nargs="?", const=str(DEFAULT_BUDGET_MIN), default=None,
                   metavar="MIN",
                   help="CPU: first time the candidate implementations and a few parameter "
                   "configurations of every layer and pass on this machine, verified first, "
                   "and store the winners under its key in tuning/cpu.json (later runs use "
                   f"them without tuning); at most MIN minutes (default {DEFAULT_BUDGET_MIN:g})")
    add_verbose_flag(p)
    return p
