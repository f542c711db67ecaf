"""CPU benchmark: torch's conv3d against every DaCe implementation of a pass, per layer.

README.md, "CPU performance" ("Benchmark"), describes the method, the ceilings and the
table.  Not there: the screening first call counts as one of the ``--warmup`` calls; an
implementation screened out by ``--skip-slower`` has its first-call time in the
metadata; a wrong kernel's time is not reported; ``im2colGemm`` (MKL's SGEMM) has its
own column and never counts as DaCe-generated (:data:`VENDOR`).  Besides the usual
result files, ``table.md`` holds the printed table.
"""

import math
from pathlib import Path

from .. import flags, schema
from ..errors import ArgumentParser, UsageError, check_at_least, run_main
from ..toolchain import PROJECT_ROOT

PROG = "bench_cpu.py"
DEFAULT_SETS = ["cosmoflow_mlperf", "cosmoflow"]
#: Implementations whose arithmetic is a vendor BLAS call, not DaCe-generated code.
VENDOR = {"im2colGemm"}
TORCH = ("torch-ncdhw", "torch-ndhwc")


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_layer_flags(p, " and ".join(DEFAULT_SETS), many=True, batch_default=2,
                          select=False)
    p.add_argument("--pass", dest="pass_", default="fwd", metavar="fwd,bwd_data,bwd_filter",
                   help="the passes to benchmark, one table each (default fwd)")
    flags.add_implementation_flag(p, "default: every one of the pass with a CPU schedule",
                                  many=True)
    flags.add_timing_flags(p, warmup=2, iters=7, time_limit=False)
    p.add_argument("--samples", dest="totaliter", type=int, default=7, metavar="N",
                   help="interleaved timed rounds: the samples per backend, as --totaliter "
                   "(default 7, at least 5)")
    flags.add_threads_flag(p, default=2)
    p.add_argument("--skip-slower", type=float, default=20.0, metavar="X",
                   help="do not sample an implementation whose first call is X times "
                   "torch's (default 20)")
    p.add_argument("--store", action="store_true",
                   help="record each layer's fastest DaCe-generated implementation of each "
                   "pass in the tuning file (what cosmoflow_end2end.py takes by default)")
    flags.add_outdir_flag(p, "results/cpu/bench_cpu_<sets>_b<B>/")
    flags.add_cachedir_flag(p)
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--batch", args.batch, 1), ("--samples", args.totaliter, 5),
                   ("--warmup", args.warmupiter, 1), ("--threads", args.threads, 1))
    if not args.skip_slower > 1:
        raise UsageError(f"--skip-slower: must be > 1, got {args.skip_slower}")
    from .. import registry
    from ..cli import resolve_pass
    from ..devices import set_threads
    from ..experiment import Experiment, TimingOptions, resolve_implementations
    from ..layers import load_layers
    from ..layouts import Pass

    sets = args.paramscsv or DEFAULT_SETS
    layers = [(s, layer.with_batch(args.batch)) for s in sets for layer in load_layers(s)]
    passes = [resolve_pass(p.strip()) for p in args.pass_.split(",") if p.strip()]
    if not passes:
        raise UsageError("--pass: give at least one of fwd, bwd_data, bwd_filter")
    names = flags.implementation_names(args.implementation)
    stray = [n for n in names or [] if registry.get(n).pass_ not in passes]
    resolve_implementations(stray, passes[0], "cpu")  # names of another pass: a usage error
    plan = [(pass_, resolve_implementations(
        None if names is None else [n for n in names if registry.get(n).pass_ == pass_],
        pass_, "cpu")) for pass_ in passes]
    set_threads(args.threads)
    base = Path(args.outdir) if args.outdir else PROJECT_ROOT / "results" / "cpu" / \
        f"bench_cpu_{'+'.join(Path(s).stem for s in sets)}_b{args.batch}"
    status = 0
    for pass_, impls in plan:
        outdir = (base if pass_ == Pass.FWD else base.with_name(f"{base.name}_{pass_}")) \
            if args.outdir is None or len(plan) == 1 else base / str(pass_)
        exp = Experiment(impls, [layer for _, layer in layers], "cpu",
                         policy="reuse", cachedir=args.cachedir, outdir=outdir,
                         threads=args.threads, timing=TimingOptions(
                             args.warmupiter, args.totaliter, flush=not args.no_flush))
        status |= Bench(exp, args, layers, pass_, len(plan) > 1).run()
    return status


class Bench:
    """The interleaved measurement of every implementation, layer by layer, and the table."""

    def __init__(self, exp, args, layers, pass_="fwd", name_pass=False):
        self.exp, self.args, self.layers, self.pass_ = exp, args, layers, pass_
        self.suffix = f" ({pass_})" if name_pass else ""

    def run(self) -> int:
        import torch

        a, exp, timer = self.args, self.exp, self.exp.timer
        print(f"measuring the CPU ceilings ({torch.get_num_threads()} threads) ...", flush=True)
        exp.extra_metadata.update(
            kind="bench_cpu", bench_pass=str(self.pass_), batch=a.batch, vendor=sorted(VENDOR), skip_slower=a.skip_slower,
            layers={}, timing={"method": timer.method, "warmup": a.warmupiter,
                               "samples": a.totaliter, "interleaved": True,
                               "flush_bytes": timer.flush_bytes})
        writer = exp.start_results()
        ceil = writer.metadata["ceilings"]
        peak, fma = ceil.get("peak_gflops"), ceil.get("fma_peak_gflops") or math.nan
        print(f"SGEMM peak {peak:.1f} GFLOP/s, FMA peak {fma:.1f} GFLOP/s, copy "
              f"{ceil.get('bandwidth_gbs', math.nan):.1f} GB/s", flush=True)
        status = schema.INTERRUPTED
        try:
            rows = [self._layer(i, s, layer, writer) for i, (s, layer) in enumerate(self.layers)]
            status = schema.COMPLETE
        finally:
            writer.finish(status)
        table = _table(rows, peak, fma)
        (exp.outdir / "table.md").write_text(table + "\n")
        print(table)
        print(f"results: {exp.outdir}/")
        print(f"max best/torch ratio: {max(r['ratio'] for r in rows):.3f}{self.suffix}")
        return 0

    def _layer(self, index, layer_set, layer, writer):
        import torch

        from ..layouts import Layout
        from ..references import TORCH as REF
        from ..results import Measurement
        from ..timing import Timing, summarize
        a, exp, timer = self.args, self.exp, self.exp.timer
        label = f"{Path(layer_set).stem}/{layer.name}"
        print(f"[{index + 1}/{len(self.layers)}] {label}: {layer.describe()}", flush=True)
        truth = exp.truth(self.pass_, layer)
        calls = {name: REF.prepare(layer, self.pass_, layout, "cpu", truth.inputs,
                                   exp.ref_options)
                 for name, layout in zip(TORCH, (Layout.NCDHW, Layout.NDHWC))}
        info, builds = {}, {}
        for impl in exp.impls:
            params = exp.params(impl, layer)
            reason = impl.unsupported_reason(layer, params)
            if reason:
                info[impl.name] = {"status": "unsupported", "reason": reason}
                continue
            build = builds[impl.name] = exp.build(impl, layer, params)
            info[impl.name] = {"params": params, "build": build.origin,
                               "build_s": round(build.seconds, 2)}
            calls[impl.name] = exp.call(build, truth.inputs)  # one (untimed) call: first_ms
        with torch.no_grad():
            # torch's first (flushed) call is the yardstick; a DaCe build is screened on
            # its initialising call, so a very slow one runs only once.
            torch_first = min(timer.once(calls[n]) for n in TORCH)
            active = {}
            for name, fn in calls.items():
                if name not in TORCH and not self._admit(name, fn, builds[name], truth,
                                                         info[name], torch_first):
                    continue
                for _ in range(a.warmupiter - 1):
                    timer.once(fn)
                active[name] = fn
            samples = timer.interleaved(active, a.totaliter)
        med = {n: summarize(s)["median_ms"] for n, s in samples.items()}
        torch_name = min(TORCH, key=lambda n: med[n])
        measurements = [Measurement(n, Timing(s, a.warmupiter, timer.method))
                        for n, s in [("torch", samples[torch_name])] + list(samples.items())]
        for name in med:
            if name in info:
                info[name]["status"] = "timed"
        writer.metadata["layers"][label] = dict(info, torch_layout=torch_name)
        writer.add_layer(index, layer, label, measurements, extra={"set": layer_set})
        generated = {n: t for n, t in med.items() if n not in TORCH and n not in VENDOR}
        best = min(generated, key=generated.get) if generated else None
        row = {"label": label, "layer": layer, "torch": med[torch_name], "torch_layout": torch_name,
               "best": best, "best_ms": generated.get(best, math.nan),
               "vendor": {n: med.get(n, math.nan) for n in VENDOR}}
        row["ratio"] = row["best_ms"] / row["torch"] if best else math.inf
        print(f"  torch {row['torch']:.2f} ms ({torch_name[6:]}), best DaCe {best} "
              f"{row['best_ms']:.2f} ms, ratio {row['ratio']:.2f}", flush=True)
        if a.store and best:
            from .. import tuning
            tuning.store_best("cpu", str(self.pass_), layer, best,
                              {"cpu": writer.metadata["device"]["cpu"],
                               "threads": torch.get_num_threads()})
        return row

    def _admit(self, name, fn, build, truth, info, torch_first) -> bool:
        """Screen a DaCe build on its first call, then verify it (a wrong kernel's time is
        not reported)."""
        limit = self.args.skip_slower
        first = info["first_call_ms"] = fn.first_ms
        if first > limit * torch_first:
            info["status"] = f"skipped: first call {first:.1f} ms > {limit:g}x torch"
            print(f"  {name}: {first:.0f} ms, skipped (> {limit:g}x torch)", flush=True)
            return False
        check = self.exp.check(build, truth)[0]
        info.update(verified=check.ok, err_over_tol=check.worst_ratio)
        if not check.ok:
            info["status"] = "wrong"
            print(f"  {name}: WRONG ({check.summary()}), not timed", flush=True)
        return check.ok


def _table(rows, peak, fma) -> str:
    lines = ["| layer | geometry | torch ms (layout) | best DaCe-generated | ms | ratio | "
             "GFLOP/s | % of SGEMM peak | % of FMA peak | im2colGemm (MKL) ms |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gflops = r["layer"].flops() / (r["best_ms"] * 1e-3) / 1e9 if r["best"] else math.nan
        vendor = r["vendor"].get("im2colGemm", math.nan)
        lines.append(f"| {r['label']} | {r['layer'].describe()} | {r['torch']:.2f} "
                     f"({r['torch_layout'][6:]}) | {r['best']} | {r['best_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {gflops:.1f} | {100 * gflops / peak:.0f}% | "
                     f"{100 * gflops / fma:.0f}% | {vendor:.2f} |")
    return "\n".join(lines)
