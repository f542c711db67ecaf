"""The command line of ``profile_conv3d.py``."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import List, Optional

from .errors import (ArgumentParser, UsageError, add_cachedir_flag, add_outdir_flag,
                     add_threads_flag, check_at_least, run_main)

#: The implementation run when ``--implementation`` is not given (forward pass).
DEFAULT_IMPLEMENTATION = "implicitGemmNCDHW"
#: ... and per pass, with ``--pass``.
DEFAULT_FOR_PASS = {"fwd": DEFAULT_IMPLEMENTATION, "bwd_data": "implicitGemmBwdData",
                    "bwd_filter": "implicitGemmBwdFilter"}
PROG = "profile_conv3d.py"


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=PROG, description="Verify and profile DaCe 3D-convolution implementations "
                "layer by layer against torch (float64 for verification; torch/oneDNN or "
                "cuDNN for timing).")
    p.add_argument("--implementation", default=None, metavar="NAME",
                   help=f"registered implementation (default: {DEFAULT_IMPLEMENTATION}, or "
                   "the default of --pass; see --list)")
    p.add_argument("--pass", dest="pass_", default=None, metavar="fwd|bwd_data|bwd_filter",
                   help="the convolution to compute: forward, gradient for the input, or "
                   "gradient for the filter (default: fwd, or the implementation's pass)")
    p.add_argument("--list", action="store_true",
                   help="list the implementations (of --pass, if given) and exit")
    p.add_argument("--paramscsv", default="cosmoflow", metavar="SET",
                   help="layer set: a name in convparams/ or a CSV path (default: cosmoflow)")
    p.add_argument("--currlayer", type=int, default=None, metavar="I",
                   help="first layer to run (0-based, default 0)")
    p.add_argument("--lastlayer", type=int, default=None, metavar="J",
                   help="run layers I..J-1 (default: to the end of the set)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="batch size, overriding the CSV")
    p.add_argument("--device", default="auto", metavar="cpu|gpu|auto",
                   help="where to run (default auto: the GPU if a CUDA device is usable)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a tunable parameter of the implementation (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    add_threads_flag(p)

    g = p.add_argument_group("verification")
    g.add_argument("--verify", action="store_true",
                   help="check each layer's output against torch float64")
    g.add_argument("--strict", action="store_true",
                   help="count layers the implementation does not support as failures")

    g = p.add_argument_group("profiling")
    g.add_argument("--compareprof", action="store_true",
                   help="time the implementation per layer next to the references (torch; "
                   "cuDNN on the GPU) and write result files into --outdir")
    g.add_argument("--warmupiter", type=int, default=10, metavar="N",
                   help="untimed calls before the samples (default 10)")
    g.add_argument("--totaliter", type=int, default=100, metavar="N",
                   help="timed calls per layer and backend (default 100)")
    g.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop sampling a backend on a layer after S seconds, warm-up "
                   f"included (at least {timing_min_samples()} samples are kept)")
    g.add_argument("--no-flush", action="store_true",
                   help="do not flush the caches before each timed call")
    g.add_argument("--allow-tf32", action="store_true",
                   help="let torch/cuDNN use TF32 tensor cores on the GPU (default: IEEE FP32)")
    g.add_argument("--cudnn-algo", default="find", metavar="NAME|find|heuristic",
                   help="cuDNN's algorithm on the GPU, for --verify and --compareprof: find "
                   "(benchmark all, default), heuristic, or a name such as "
                   "IMPLICIT_PRECOMP_GEMM")
    add_outdir_flag(g, "outputs/<impl>_b<batch>_<device>/")
    g.add_argument("--enableplots", action="store_true",
                   help="draw violin, median and roofline plots from the result files")

    g = p.add_argument_group("builds")
    add_cachedir_flag(g)
    g.add_argument("--loadprecompiled", action="store_true",
                   help="load stored builds without parsing, transforming or compiling; "
                   "build (and store) only what is missing or stale")
    g.add_argument("--require-precompiled", action="store_true",
                   help="like --loadprecompiled, but a missing or stale build fails the layer")
    return p


def timing_min_samples() -> int:
    from .timing import MIN_SAMPLES
    return MIN_SAMPLES


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(PROG, _main, argv)


def _check_args(args) -> None:
    check_at_least(("--warmupiter", args.warmupiter, 0), ("--totaliter", args.totaliter, 1),
                   ("--threads", args.threads, 1))
    if args.time_limit is not None and not args.time_limit > 0:
        raise UsageError(f"--time-limit: must be a positive number of seconds, got {args.time_limit}")
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch: must be a positive integer, got {args.batch}")
    if not (args.verify or args.compareprof):
        raise UsageError("nothing to do: give --verify and/or --compareprof (or --list)")
    if args.enableplots and not args.compareprof:
        raise UsageError("--enableplots: plots are drawn from --compareprof results; add "
                         "--compareprof (or run scripts/plot_results.py RUN_DIR)")
    if args.outdir is not None and not args.compareprof:
        raise UsageError("--outdir: only --compareprof writes result files")
    from cudnn_bindings.conv import parse_algo
    try:
        parse_algo("fwd", args.cudnn_algo)
    except ValueError as err:
        raise UsageError(f"--cudnn-algo: {err}") from None


def _resolve_pass(text):
    from .layouts import Pass
    if text is None:
        return None
    try:
        return Pass(text)
    except ValueError:
        raise UsageError(f"--pass: unknown pass '{text}' (choose from "
                         f"{', '.join(p.value for p in Pass)})") from None


def set_threads(threads: Optional[int]) -> Optional[int]:
    """One thread count for torch and for DaCe's OpenMP code (before either starts)."""
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else None
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch
        torch.set_num_threads(threads)  # also DaCe's: both use the libgomp torch loads
    return threads


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from . import registry

    pass_ = _resolve_pass(args.pass_)
    if args.list:
        impls = registry.all_implementations()
        if pass_ is not None:
            impls = {n: i for n, i in impls.items() if i.pass_ == pass_}
        print(registry.format_listing(impls))
        return 0

    from .devices import resolve_device
    from .layers import load_layers, select_layers

    impl = registry.get(args.implementation or DEFAULT_FOR_PASS[str(pass_ or "fwd")])
    if pass_ is not None and impl.pass_ != pass_:
        same = [n for n, i in registry.all_implementations().items() if i.pass_ == pass_]
        raise UsageError(f"--pass {pass_}: {impl.name} computes {impl.pass_}; implementations "
                         f"of {pass_}: {', '.join(same) or 'none'}")
    overrides = registry.parse_param_overrides(args.param)
    params = impl.resolve_params(overrides)  # validates --param before anything runs
    _check_args(args)
    layers = select_layers(load_layers(args.paramscsv), args.currlayer, args.lastlayer)
    if args.batch is not None:
        layers = [layer.with_batch(args.batch) for layer in layers]
    device = resolve_device(args.device)
    if device not in impl.targets:
        raise UsageError(f"--device {device}: {impl.name} has no schedule for it (targets: "
                         f"{', '.join(impl.targets)})")
    args.threads = set_threads(args.threads)
    return Session(impl, params, layers, device, args, overrides).run()


def default_outdir(impl_name: str, layers, device: str) -> Path:
    batches = {layer.batch for layer in layers}
    batch = f"b{batches.pop()}" if len(batches) == 1 else "bcsv"
    return Path("outputs") / f"{impl_name}_{batch}_{device}"


class Session:
    """One invocation: per layer, build (or load), verify, time."""

    def __init__(self, impl, params, layers, device, args, overrides=None):
        self.impl, self.params, self.layers, self.device, self.args = (
            impl, params, layers, device, args)
        #: The user's --param values; each layer's parameters are the defaults, updated by
        #: the tuned entry for the layer (convbench.tuning), updated by these.
        self.overrides = dict(overrides or {})
        self.policy = ("require" if args.require_precompiled else
                       "reuse" if args.loadprecompiled else "rebuild")
        self.passed = self.failed = self.unsupported = 0
        self.writer = None

    # -- set-up -----------------------------------------------------------------------------
    def _header(self) -> None:
        from . import devices
        impl, args = self.impl, self.args
        print(f"{impl.name} ({impl.pass_}, {impl.layout}) on {self.device}: "
              f"{devices.describe(self.device)}")
        threads = args.threads if args.threads is not None else "default"
        print(f"layer set {args.paramscsv}, {len(self.layers)} layer(s), seed {args.seed}, params "
              f"{self.params or 'none'}, threads {threads}, builds: {self.policy}", flush=True)

    def _start_profiling(self) -> None:
        from . import ceilings, references, results, timing, toolchain
        args = self.args
        self.refs = references.available(self.device)
        self.ref_options = references.ReferenceOptions(allow_tf32=args.allow_tf32,
                                                       cudnn_algo=args.cudnn_algo)
        self.timer = timing.make_timer(self.device, flush=not args.no_flush)
        outdir = Path(args.outdir) if args.outdir else default_outdir(
            self.impl.name, self.layers, self.device)
        print(f"measuring the {self.device} ceilings (SGEMM, copy) ...", end=" ", flush=True)
        ceil = ceilings.measure(self.device)
        print(f"{ceil['peak_gflops']:.0f} GFLOP/s, {ceil['bandwidth_gbs']:.0f} GB/s", flush=True)
        meta = results.run_metadata(toolchain.PROJECT_ROOT, self.device, args.threads)
        meta.update({
            "implementation": self.impl.name, "pass": str(self.impl.pass_),
            "layout": str(self.impl.layout), "params": self.params,
            "layer_set": args.paramscsv, "batch": args.batch, "seed": args.seed,
            "layers": [{"name": layer.name, "geometry": layer.describe(), "key": layer.key()}
                       for layer in self.layers],
            "references": [r.name for r in self.refs],
            "reference_settings": {r.name: r.settings(self.device, self.ref_options)
                                   for r in self.refs},
            "timing": {"method": self.timer.method, "warmup": args.warmupiter,
                       "iterations": args.totaliter, "time_limit_s": args.time_limit,
                       "flush_bytes": self.timer.flush_bytes,
                       "noisy_if_iqr_over_median_above": timing.NOISY_IQR},
            "ceilings": ceil,
            "dace_config": {"flags": toolchain.toolchain_flags(self.device),
                            "toolchain": toolchain.toolchain_versions(self.device)},
            "cache": {"dir": str(args.cachedir or toolchain.default_cachedir()),
                      "policy": self.policy},
        })
        self.writer = results.RunWriter(outdir, meta, [r.name for r in self.refs])
        print(f"results: {outdir}/ (samples.csv, summary.csv, metadata.json)", flush=True)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        self._header()
        if self.args.compareprof:
            self._start_profiling()
        status = "interrupted"
        try:
            for i, layer in enumerate(self.layers):
                self._layer(i, layer)
            status = "complete"
        finally:
            if self.writer is not None:
                self.writer.finish(status)
                if self.args.enableplots and self.writer.summary:
                    self._plots()
        total_failed = self.failed + (self.unsupported if self.args.strict else 0)
        print(f"{self.impl.name}: {self.passed} passed, {self.failed} failed, "
              f"{self.unsupported} unsupported (of {len(self.layers)} layers)")
        return 1 if total_failed else 0

    def _plots(self) -> None:
        from . import plots
        paths = plots.plot_run(self.writer.outdir)
        print("plots: " + ", ".join(str(p) for p in paths), flush=True)

    def _layer(self, i: int, layer) -> None:
        from . import toolchain, verify
        args, impl = self.args, self.impl
        print(f"[{i + 1}/{len(self.layers)}] {layer.name:<8} {layer.describe():<34}", end=" ",
              flush=True)
        from . import tuning
        params = tuning.tuned_params(impl, layer, self.device, self.overrides)
        reason = impl.unsupported_reason(layer, params)
        if reason:
            self.unsupported += 1
            print(f"unsupported: {reason}" + ("  FAIL (--strict)" if args.strict else ""),
                  flush=True)
            return
        try:
            spec = toolchain.make_spec(impl, layer, "float32", self.device, params)
            if params != self.params:
                print(f"params {','.join(f'{k}={v}' for k, v in params.items())}", end=" ")
            build = toolchain.build(spec, args.cachedir, policy=self.policy)
            print(f"{build.origin} {build.seconds:.1f}s", end=" ", flush=True)
            ok, detail, reference = True, "", None
            if args.verify:
                t0 = time.perf_counter()
                reference = verify.make_reference(layer, impl.pass_, seed=args.seed + i,
                                                   device=self.device)
                checks = verify.verify_build(build, reference, self.device,
                                             cudnn_algo=args.cudnn_algo)
                ok = all(c.ok for c in checks)
                detail = "  ".join(f"[{c.reference}] {c.summary()}" if len(checks) > 1
                                   else c.summary() for c in checks)
                print(f" check {time.perf_counter() - t0:.1f}s  {detail}  "
                      f"{'PASS' if ok else 'FAIL'}", end="", flush=True)
            if args.compareprof:
                inputs = (reference.inputs if reference is not None else
                          verify.make_inputs(layer, impl.pass_, args.seed + i))
                print(flush=True)
                self._profile(i, layer, build, inputs, {"build": build.origin,
                              "build_seconds": round(build.seconds, 3), "params": params,
                              **({"verified": ok} if args.verify else {})})
            else:
                print(flush=True)
        except UsageError:
            raise
        except Exception as err:  # a build or run failure fails this layer, not the run
            self.failed += 1
            first = (str(err).strip().splitlines() or [""])[0]
            print(f"ERROR {type(err).__name__}: {first}", flush=True)
            return
        self.passed += ok
        self.failed += not ok

    def _profile(self, i, layer, build, inputs, extra) -> None:
        from .progress import Progress
        from .results import DACE, Measurement
        from .timing import prepared_call
        from .verify import program_arrays
        args, impl = self.args, self.impl
        arrays = program_arrays(impl, layer, inputs, self.device, build.spec.dtype.torch, 0.0)
        tdev = "cuda" if self.device == "gpu" else "cpu"
        device_inputs = {r: t.to(tdev) for r, t in inputs.items()}
        backends = [(DACE, lambda: prepared_call(build, arrays))] + [
            (r.name, lambda r=r: r.prepare(layer, impl.pass_, impl.layout, self.device,
                                           device_inputs, self.ref_options)) for r in self.refs]
        per_backend = args.warmupiter + args.totaliter
        measurements, infos = [], {}
        with Progress(per_backend * len(backends), label=f"  timing {layer.name}",
                      heartbeat=60) as bar:
            for name, prepare in backends:
                bar.label = f"  timing {layer.name} {name}"
                fn = prepare()  # cuDNN's Find runs here, outside the timed region
                if getattr(fn, "info", None):
                    infos[name] = fn.info
                timing = self.timer.measure(fn, args.warmupiter, args.totaliter,
                                            args.time_limit, progress=bar)
                measurements.append(Measurement(name, timing))
                bar.done = per_backend * len(measurements)
        if infos:
            extra = dict(extra, references=infos)
        rows = self.writer.add_layer(i, layer, impl.name, measurements, extra)
        print("    " + "   ".join(_describe_row(r, self.refs) for r in rows), flush=True)
        for name, info in infos.items():
            print(f"    {name}: {info.get('algo')} ({info.get('method')}, {info.get('math')}, "
                  f"chosen in {info.get('find_ms')} ms)", flush=True)


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
