"""The command line of ``profile_conv3d.py``."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from convbench.build.chatter import add_verbose_flag, set_verbose
from convbench.commands import flags
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.experiment.pipeline import Observer

PROG = "profile_conv3d.py"


def build_parser(prog: str = PROG, mode: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of ``profile_conv3d.py``; ``mode`` ``verify`` or ``profile`` gives the
    subcommands of ``convbench`` (the same flags, with that action implied)."""
    p = ArgumentParser(prog=prog, description="Verify and profile DaCe 3D-convolution "
                       "implementations layer by layer against torch (float64 for "
                       "verification; torch/oneDNN or cuDNN for timing).")
    flags.add_implementation_flag(p, "default: the 'cli' default of --pass (fwd: "
                                  "implicitGemmNCDHW); see --list")
    p.add_argument("--pass", dest="pass_", default=None, metavar="fwd|bwd_data|bwd_filter",
                   help="the convolution to compute: forward, gradient for the input, or "
                   "gradient for the filter (default: fwd, or the implementation's pass)")
    p.add_argument("--list", action="store_true",
                   help="list the implementations (of --pass, if given) and exit")
    p.add_argument("--markdown", action="store_true",
                   help="with --list: one Markdown table (docs/implementations.md holds it)")
    flags.add_layer_flags(p, skip_invalid=True)
    flags.add_device_flag(p)
    flags.add_param_flag(p)
    flags.add_seed_flag(p)
    flags.add_threads_flag(p)
    flags.add_precision_flags(p, int8=True)

    g = p.add_argument_group("verification")
    g.add_argument("--verify", action="store_true", default=mode == "verify",
                   help="check each layer's output against torch float64"
                   + (" (implied)" if mode == "verify" else ""))
    g.add_argument("--strict", action="store_true",
                   help="count layers the implementation does not support as failures")

    g = p.add_argument_group("profiling")
    g.add_argument("--compareprof", action="store_true", default=mode == "profile",
                   help="time the implementation per layer next to the references (torch; "
                   "cuDNN on the GPU) and write result files into --outdir"
                   + (" (implied)" if mode == "profile" else ""))
    flags.add_timing_flags(g)
    g.add_argument("--allow-tf32", action="store_true",
                   help="let torch/cuDNN use TF32 tensor cores on the GPU (default: IEEE FP32)")
    g.add_argument("--cudnn-algo", default="find", metavar="NAME|find|heuristic",
                   help="cuDNN's algorithm on the GPU, for --verify and --compareprof: find "
                   "(benchmark all, default), heuristic, or a name such as "
                   "IMPLICIT_PRECOMP_GEMM")
    flags.add_outdir_flag(g, "outputs/<impl>_b<batch>_<device>/")
    g.add_argument("--enableplots", action="store_true",
                   help="draw violin, median and roofline plots from the result files")

    g = p.add_argument_group("builds")
    flags.add_build_flags(g)
    add_verbose_flag(p)
    return p


def main(argv: Optional[List[str]] = None, prog: str = PROG, mode: Optional[str] = None) -> int:
    return run_main(prog, lambda a: _main(a, prog, mode), argv)


def _check_args(args) -> None:
    flags.check_timing_flags(args)
    check_at_least(("--threads", args.threads, 1))
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch: must be a positive integer, got {args.batch}")
    if not (args.verify or args.compareprof):
        raise UsageError("nothing to do: give --verify and/or --compareprof (or --list)")
    if args.enableplots and not args.compareprof:
        raise UsageError("--enableplots: plots are drawn from --compareprof results; add "
                         "--compareprof (or run scripts/plot_results.py RUN_DIR)")
    if args.outdir is not None and not args.compareprof:
        raise UsageError("--outdir: only --compareprof writes result files")
    from convbench.build.precision import from_args
    from_args(args)  # a bad --dtype or --math stops here, before anything is imported
    from cudnn_bindings.conv import parse_algo
    try:
        parse_algo("fwd", args.cudnn_algo)
    except ValueError as err:
        raise UsageError(f"--cudnn-algo: {err}") from None


def resolve_pass(text, flag: str = "--pass"):
    from convkernels.layouts import Pass
    if text is None:
        return None
    try:
        return Pass(text)
    except ValueError:
        raise UsageError(f"{flag}: unknown pass '{text}' (choose from "
                         f"{', '.join(p.value for p in Pass)})") from None


def select_layers(args):
    """The layers that ``add_layer_flags``' flags select, with ``--batch`` applied."""
    from convbench.layersets.sets import load_layers, select_layers as select
    skipped = [] if getattr(args, "skip_invalid", False) else None
    layers = select(load_layers(args.paramscsv, skipped), args.currlayer, args.lastlayer)
    for err in skipped or ():
        print(f"skipped: {err}", file=sys.stderr)
    return [layer.with_batch(args.batch) for layer in layers] if args.batch else layers


def _main(argv, prog: str = PROG, mode: Optional[str] = None) -> int:
    args = build_parser(prog, mode).parse_args(argv)
    set_verbose(args.verbose)
    from convbench import registry

    pass_ = resolve_pass(args.pass_)
    if args.markdown and not args.list:
        raise UsageError("--markdown: it formats --list; add --list (or run convbench list)")
    if args.list:
        impls = registry.all_implementations()
        if pass_ is not None:
            impls = {n: i for n, i in impls.items() if i.pass_ == pass_}
        print((registry.format_markdown if args.markdown else registry.format_listing)(impls),
              end="\n" if not args.markdown else "")
        return 0

    if args.dtype == "int8":
        return _int8(args)
    exp = prepare_experiment(args, Printer(args.paramscsv, args.strict))
    exp.run()
    n = exp.counts()
    print(f"{exp.impls[0].name}: {n['passed']} passed, {n['failed']} failed, "
          f"{n['unsupported']} unsupported (of {len(exp.layers)} layers)")
    return 1 if n["failed"] or (args.strict and n["unsupported"]) else 0


def _int8(args) -> int:
    """``--dtype int8``: the int8 forward kernel (``convbench int8``), verified and/or timed
    against our float32 forward and torch's quantized ``Conv3d`` (``--iters`` rounds)."""
    from convbench.commands import int8
    from convbench.quant.int8 import KERNELS
    names = {k.name: key for key, k in KERNELS.items()}
    if args.implementation not in (None, *names):
        raise UsageError(f"--dtype int8: the int8 implementations are {', '.join(names)}, "
                         f"not {args.implementation}")
    if args.device == "gpu" or resolve_pass(args.pass_) not in (None, "fwd"):
        raise UsageError("--dtype int8: the int8 kernel is a forward pass on the CPU")
    if args.math != "ieee":
        raise UsageError(f"--math {args.math}: int8 sums are exact integers (no math mode)")
    if not (args.verify or args.compareprof):
        raise UsageError("nothing to do: give --verify and/or --compareprof")
    layers = [(args.paramscsv, layer) for layer in select_layers(args)]
    status = 0
    for mode, on in (("verify", args.verify), ("bench", args.compareprof)):
        if on:
            run = argparse.Namespace(
                mode=mode, batch=None, param=args.param, plant="", seed=args.seed,
                kernel=names.get(args.implementation, "all"),
                rounds=args.totaliter, warmup=args.warmupiter, fp32="", no_check=False,
                threads=args.threads, cachedir=args.cachedir,
                loadprecompiled=args.loadprecompiled,
                require_precompiled=args.require_precompiled,
                outdir=(f"{args.outdir}/{mode}" if args.outdir else None))
            status = max(status, int8.run(run, layers))
    return status


def check_selection(args):
    """``(implementation, parameter overrides, layers)`` that parsed ``verify``/``profile``
    flags select, every flag but ``--device`` checked (:class:`UsageError`, one line),
    without touching a device: what ``convbench sweep`` checks before it submits."""
    from convbench import registry
    from convbench.experiment.pipeline import resolve_implementations
    pass_ = resolve_pass(args.pass_)
    impl, = resolve_implementations(
        [args.implementation or registry.default("cli", pass_ or "fwd")], pass_,
        flag=f"--pass {pass_}" if pass_ is not None else "--implementation")
    overrides = registry.parse_param_overrides(args.param)
    impl.resolve_params(overrides)  # validates --param before anything runs
    _check_args(args)
    return impl, overrides, select_layers(args)


def prepare_experiment(args, observer: Optional[Observer] = None):
    """The :class:`~convbench.experiment.pipeline.Experiment` that parsed ``verify``/``profile``
    flags ask for, every flag checked (:class:`UsageError`, one line) and nothing built
    yet.  ``convbench sweep`` runs each of its parts through this too."""
    from convbench.build import precision
    from convbench.timing import devices
    from convbench.timing.devices import resolve_device, set_threads
    from convbench.experiment.pipeline import (Experiment, TimingOptions,
                                               resolve_implementations)
    from convbench.check.references import ReferenceOptions

    impl, overrides, layers = check_selection(args)
    device = resolve_device(args.device)
    resolve_implementations([impl.name], device=device, flag=f"--device {device}")
    args.threads = set_threads(args.threads)
    timing = (TimingOptions(args.warmupiter, args.totaliter, args.time_limit, not args.no_flush,
                            heap=args.heap) if args.compareprof else None)
    dtype = precision.check_device(precision.from_args(args), device)
    reason = impl.unsupported_dtype(dtype, device)
    if reason:
        raise UsageError(f"--dtype {dtype.name}: {impl.name} {reason}")
    reason = devices.arch_problem(impl.cuda_arch, device)
    if reason:
        raise UsageError(f"--implementation {impl.name} {reason}")
    exp = Experiment(impl, layers, device, overrides=overrides, policy=flags.build_policy(args),
                     cachedir=args.cachedir, seed=args.seed, verify=args.verify, timing=timing,
                     references=ReferenceOptions(args.allow_tf32, args.cudnn_algo),
                     outdir=args.outdir, plots=args.enableplots, threads=args.threads,
                     metadata={"layer_set": args.paramscsv, "batch": args.batch},
                     observer=observer, dtype=dtype)
    refusals = [impl.unsupported_reason(layer, exp.params(impl, layer)) for layer in layers]
    if all(refusals):
        doing = " and ".join(w for w, on in (("verified", args.verify),
                                             ("timed", args.compareprof)) if on)
        raise UsageError(f"nothing to be {doing}: {impl.name} supports none of the "
                         f"{len(layers)} selected layer(s) ({layers[0].name}: {refusals[0]})")
    return exp


class Printer(Observer):
    """The command line's report: one line per layer, then the timing rows."""

    def __init__(self, layer_set: str = "", strict: bool = False):
        self.layer_set, self.strict = layer_set, strict

    def started(self, exp) -> None:
        from convbench.timing import devices
        impl = exp.impls[0]
        print(f"{impl.name} ({impl.pass_}, {impl.layout}) on {exp.device}: "
              f"{devices.describe(exp.device)}")
        threads = exp.threads if exp.threads is not None else "default"
        params = impl.resolve_params(exp.overrides)
        print(f"layer set {self.layer_set}, {len(exp.layers)} layer(s), seed {exp.seed}, params "
              f"{params or 'none'}, threads {threads}, builds: {exp.policy}", flush=True)
        if exp.timing is not None:
            print(f"measuring the {exp.device} ceilings (SGEMM, copy) ...", end=" ", flush=True)

    def profiling(self, exp, outdir, ceil) -> None:
        print(f"{ceil['peak_gflops']:.0f} GFLOP/s, {ceil['bandwidth_gbs']:.0f} GB/s", flush=True)
        print(f"results: {outdir}/ (samples.csv, summary.csv, metadata.json)", flush=True)

    def layer(self, exp, record) -> None:
        layer = record.layer
        print(f"[{record.index + 1}/{len(exp.layers)}] {layer.name:<8} {layer.describe():<34}",
              end=" ", flush=True)

    def built(self, exp, record) -> None:
        if record.params != exp.impls[0].resolve_params(exp.overrides):
            print(f"params {','.join(f'{k}={v}' for k, v in record.params.items())}", end=" ")
        print(f"{record.build_origin} {record.build_seconds:.1f}s", end=" ", flush=True)

    def checked(self, exp, record) -> None:
        checks = record.checks
        detail = "  ".join(f"[{c.reference}] {c.summary()}" if len(checks) > 1 else c.summary()
                           for c in checks)
        print(f" check {record.check_seconds:.1f}s  {detail}  "
              f"{'PASS' if record.verified else 'FAIL'}", end="", flush=True)

    def timing(self, exp, record, total_calls):
        from convbench.base.progress import Progress
        print(flush=True)
        return Progress(total_calls, label=f"  timing {record.layer.name}", heartbeat=60)

    def timed(self, exp, record) -> None:
        refs = exp.reference_backends
        print("    " + "   ".join(_describe_row(r, refs) for r in record.rows), flush=True)
        for name, info in record.infos.items():
            print(f"    {name}: {info.get('algo')} ({info.get('method')}, {info.get('math')}, "
                  f"chosen in {info.get('find_ms')} ms)", flush=True)

    def finished(self, exp, record) -> None:
        if record.status == "unsupported":
            print(f"unsupported: {record.reason}" + ("  FAIL (--strict)" if self.strict else ""),
                  flush=True)
        elif record.status == "error":
            print(f"ERROR {record.reason}", flush=True)
        elif exp.timing is None:
            print(flush=True)

    def plotted(self, exp, paths) -> None:
        print("plots: " + ", ".join(str(p) for p in paths), flush=True)


def _describe_row(row, refs) -> str:
    name = row["implementation"] if row["backend"] == "dace" else row["backend"]
    text = (f"{name} {row['median_ms']:.3f} ms (IQR {100 * row['iqr_over_median']:.1f}%"
            f"{', NOISY' if row['noisy'] else ''}) {row['gflops']:.1f} GFLOP/s")
    if row["backend"] == "dace":
        ratios = [f"{row[f'ratio_vs_{r.name}']:.2f}x {r.name}" for r in refs
                  if row.get(f"ratio_vs_{r.name}") not in ("", None)]
        if ratios:
            text += " = " + ", ".join(ratios)
    return text
