"""CPU benchmark: torch's conv3d against every DaCe implementation of a pass, per layer.

docs/benchmarking.md describes the method,
the ceilings and the table.  Both sides are timed alike: each call allocates its output
(torch through its API, DaCe a fresh tensor per call) from the heap policy of
:mod:`convbench.timing.heap`, after the same flush, with the same warm-up, interleaved.  Each
build is verified and screened once; then ``--rounds`` independent rounds over all
layers each warm up and sample anew, and a layer's ratio is the median over the rounds,
with its min-max.  An implementation screened out by ``--skip-slower`` has its
first-call time in the metadata; a wrong kernel's time is not reported; ``im2colGemm``
(MKL's SGEMM) has its own column and never counts as DaCe-generated (:data:`VENDOR`).
Besides the usual result files, ``table.md`` holds the printed table and ``rounds.csv``
each round's medians and ratio.
"""

import math
from pathlib import Path

from convbench.build.chatter import add_verbose_flag, set_verbose
from convbench.commands import flags
from convbench.results import schema
from convbench.build import tuned
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.build.toolchain import PROJECT_ROOT

PROG = "bench_cpu.py"
DEFAULT_SETS = ["cosmoflow_mlperf", "cosmoflow"]
#: Implementations whose arithmetic is a vendor BLAS call, not DaCe-generated code.
VENDOR = {"im2colGemm"}
TORCH = ("torch-ncdhw", "torch-ndhwc")
#: Suffix of the float32 backends a 16-bit bench times besides its own: torch's, and the
#: float32 build of each implementation (the speed-up the narrower storage brings).
WIDE = "@float32"


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
                   help="interleaved timed calls per backend and round, as --totaliter "
                   "(default 7, at least 5)")
    p.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="independent rounds over all layers, each with its own warm-up and "
                   "samples; the table gives the median ratio and its range over them "
                   "(default 3)")
    flags.add_threads_flag(p, default=2)
    p.add_argument("--skip-slower", type=float, default=20.0, metavar="X",
                   help="do not sample an implementation whose first call is X times "
                   "torch's (default 20)")
    p.add_argument("--store", action="store_true",
                   help="record each layer's fastest DaCe-generated implementation of each "
                   "pass in the tuning file (what cosmoflow_end2end.py takes by default)")
    flags.add_precision_flags(p)
    flags.add_outdir_flag(p, "results/cpu/<machine>/bench_cpu_<sets>_b<B>[_<dtype>]/")
    flags.add_cachedir_flag(p)
    add_verbose_flag(p)
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    set_verbose(args.verbose)
    check_at_least(("--batch", args.batch, 1), ("--samples", args.totaliter, 5),
                   ("--warmup", args.warmupiter, 1), ("--threads", args.threads, 1),
                   ("--rounds", args.rounds, 1))
    flags.check_heap_flag(args)
    if not args.skip_slower > 1:
        raise UsageError(f"--skip-slower: must be > 1, got {args.skip_slower}")
    from .. import registry
    from convbench.commands.profile_conv3d import resolve_pass
    from convbench.timing.devices import set_threads
    from convbench.experiment.pipeline import (Experiment, TimingOptions,
                                               resolve_implementations)
    from convbench.layersets.sets import load_layers
    from convkernels.layouts import Pass
    from convbench.build.precision import check_device, from_args

    dtype = check_device(from_args(args), "cpu")
    if args.store and dtype.name != "float32":
        raise UsageError(f"--store: the tuning file names float32 winners (the network runs in "
                         f"float32), not {dtype.name} ones")
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
    refused = [f"{i.name} {i.unsupported_dtype(dtype)}" for _, impls in plan for i in impls
               if names is not None and i.unsupported_dtype(dtype)]
    if refused:
        raise UsageError(f"--dtype {dtype.name}: " + "; ".join(refused))
    plan = [(pass_, [i for i in impls if not i.unsupported_dtype(dtype)]) for pass_, impls in plan]
    for pass_, impls in plan:
        if not impls:
            raise UsageError(f"--dtype {dtype.name}: no implementation of {pass_} has a "
                             f"{dtype.name} version")
    set_threads(args.threads)
    base = Path(args.outdir) if args.outdir else PROJECT_ROOT / "results" / "cpu" / \
        tuned.machine_folder() / (f"bench_cpu_{'+'.join(Path(s).stem for s in sets)}_b{args.batch}"
                                   + ("" if dtype.name == "float32" else f"_{dtype.name}"))
    status = 0
    for pass_, impls in plan:
        outdir = (base if pass_ == Pass.FWD else base.with_name(f"{base.name}_{pass_}")) \
            if args.outdir is None or len(plan) == 1 else base / str(pass_)
        exp = Experiment(impls, [layer for _, layer in layers], "cpu",
                         policy="reuse", cachedir=args.cachedir, outdir=outdir,
                         threads=args.threads, dtype=dtype, timing=TimingOptions(
                             args.warmupiter, args.totaliter, flush=not args.no_flush,
                             heap=args.heap))
        status |= Bench(exp, args, layers, pass_, len(plan) > 1).run()
    return status


class Bench:
    """Every implementation against torch, layer by layer: each build verified and screened
    once, then ``--rounds`` independent rounds over all layers (warm-up, then interleaved
    samples), then the table of median ratios with their ranges."""

    def __init__(self, exp, args, layers, pass_="fwd", name_pass=False):
        from convbench.experiment.pipeline import Experiment
        self.exp, self.args, self.layers, self.pass_ = exp, args, layers, pass_
        self.suffix = f" ({pass_})" if name_pass else ""
        #: A 16-bit bench also builds, verifies and times every implementation in float32.
        self.wide = None if exp.dtype.name == "float32" else Experiment(
            exp.impls, [], "cpu", policy="reuse", cachedir=exp.cachedir, threads=exp.threads,
            timing=exp.timing)
        #: torch in the bench's own precision is timed only where oneDNN has a kernel for
        #: it (:func:`torch_has_fast`): without one, torch's 16-bit CPU convolution falls back
        #: to a generic loop some 30 times slower than its float32 one.
        self.torch_own = not self.wide or torch_has_fast(exp.dtype.name)
        self.torch_names = ((TORCH if self.torch_own else ())
                            + (tuple(n + WIDE for n in TORCH) if self.wide else ()))

    def generated(self, times):
        """The DaCe-generated backends of ``times`` (name -> ms) in the bench's precision."""
        return {n: t for n, t in times.items()
                if n not in self.torch_names and n not in VENDOR and not n.endswith(WIDE)}

    def run(self) -> int:
        import torch

        from convbench.timing import heap
        a, exp, timer = self.args, self.exp, self.exp.timer
        rule = exp.output_rule()
        print(f"measuring the CPU ceilings ({torch.get_num_threads()} threads) ...", flush=True)
        exp.extra_metadata.update(
            torch_in_precision=self.torch_own or f"not timed: no oneDNN {exp.dtype.name} "
                                                 "convolution on this CPU",
            kind="bench_cpu", bench_pass=str(self.pass_), batch=a.batch, vendor=sorted(VENDOR),
            skip_slower=a.skip_slower, layers={},
            timing={"method": timer.method, "warmup": a.warmupiter, "samples": a.totaliter,
                    "rounds": a.rounds, "interleaved": True, "flush_bytes": timer.flush_bytes,
                    "outputs": rule, **exp.heap_metadata(),
                    "ratio": "per round: the fastest verified DaCe-generated median over the "
                             "faster torch layout's median; reported: the median over rounds "
                             "and its min-max"})
        writer = exp.start_results()
        ceil = writer.metadata["ceilings"]
        peak, fma = ceil.get("peak_gflops"), ceil.get("fma_peak_gflops") or math.nan
        print(f"SGEMM peak {peak:.1f} GFLOP/s, FMA peak {fma:.1f} GFLOP/s, copy "
              f"{ceil.get('bandwidth_gbs', math.nan):.1f} GB/s", flush=True)
        print(f"timing rule: {rule}; caches {'flushed' if timer.flush_bytes else 'not flushed'}"
              f" before each call, {a.warmupiter} warm-up calls then {a.totaliter} interleaved "
              f"samples per backend, {a.rounds} independent round(s)", flush=True)
        status = schema.INTERRUPTED
        groups = _groups(list(enumerate(self.layers)), self.pass_,
                         len(exp.impls) * (2 if self.wide else 1))
        if len(groups) > 1:
            print(f"the layers' tensors do not fit in memory at once: {len(groups)} groups, "
                  "each prepared, then sampled over all rounds", flush=True)
        try:
            rows = []
            for group in groups:
                runs = [self._prepare(i, s, layer) for i, (s, layer) in group]
                with exp.timed_section():
                    heap.reserve(max(_footprint(run["layer"], self.pass_)[1] for run in runs))
                    for r in range(a.rounds):
                        for run in runs:
                            self._round(run, r)
                rows += [self._finish(run, writer) for run in runs]
                del runs
            status = schema.COMPLETE
        finally:
            writer.finish(status)
        table = _table(rows, peak, fma, a.rounds, exp.dtype.name)
        (exp.outdir / "table.md").write_text(table + "\n")
        (exp.outdir / "rounds.csv").write_text(_rounds_csv(rows))
        print(table)
        print(f"results: {exp.outdir}/")
        print(f"max best/torch ratio: {max(r['ratio'] for r in rows):.3f}{self.suffix}")
        return 0

    def _prepare(self, index, layer_set, layer):
        """Every implementation on one layer through the case runner, against one ground
        truth: built, screened on its first call, verified; the calls to sample."""
        import torch

        from convkernels.layouts import Layout
        from convbench.check.references import TORCH as REF
        exp, timer = self.exp, self.exp.timer
        label = f"{Path(layer_set).stem}/{layer.name}"
        print(f"[{index + 1}/{len(self.layers)}] {label}: {layer.describe()}", flush=True)
        truths = {"": exp.truth(self.pass_, layer)}
        if self.wide:  # the same draw in float32
            truths[WIDE] = self.wide.truth(self.pass_, layer)
        calls = {name + suffix: REF.prepare(layer, self.pass_, layout, "cpu", truth.inputs,
                                            exp.ref_options)
                 for suffix, truth in truths.items()
                 for name, layout in zip(TORCH, (Layout.NCDHW, Layout.NDHWC))
                 if name + suffix in self.torch_names}
        with torch.no_grad():
            # torch's first (flushed) call is the yardstick; a DaCe build is screened on
            # its initialising call, so a very slow one runs only once.
            torch_first = min(timer.once(calls[n]) for n in self.torch_names)
            info = {}
            for impl in exp.impls:
                for suffix, truth in truths.items():
                    runner = self.wide if suffix else exp
                    prepared = {}
                    record = runner.run_case(impl, layer, index, truth=truth, timed=False,
                                             screen=lambda build, p=prepared, t=truth, e=runner:
                                             self._screen(build, t.inputs, p, torch_first, e))
                    info[impl.name + suffix], line = self._info(record, prepared.get("call"))
                    if line:
                        print(f"  {impl.name + suffix}: {line}", flush=True)
                    if record.status == "passed":
                        calls[impl.name + suffix] = prepared["call"]
                    elif suffix == "":
                        break  # no float32 comparison for a kernel not timed at all
        for truth in truths.values():
            truth.drop()
        return {"index": index, "label": label, "set": layer_set, "layer": layer,
                "calls": calls, "info": info, "rounds": []}

    def _screen(self, build, inputs, prepared, torch_first, exp=None):
        """The build's prepared call (its first call run, by ``exp``, default the bench's
        experiment) into ``prepared``; why it is not worth sampling (a first call over
        ``--skip-slower`` times torch's), or None."""
        call = prepared["call"] = (exp or self.exp).call(build, inputs)
        limit = self.args.skip_slower
        if call.first_ms > limit * torch_first:
            return f"first call {call.first_ms:.1f} ms > {limit:g}x torch"
        return None

    def _round(self, run, r) -> None:
        """One independent round on one layer: warm-up, then interleaved samples."""
        import torch

        from convbench.timing.timers import summarize
        a, timer, calls = self.args, self.exp.timer, run["calls"]
        with torch.no_grad():
            for fn in calls.values():
                for _ in range(a.warmupiter):
                    timer.once(fn)
            samples = timer.interleaved(calls, a.totaliter)
        med = {n: summarize(s)["median_ms"] for n, s in samples.items()}
        torch_name = min(self.torch_names, key=lambda n: med[n])
        generated = self.generated(med)
        best = min(generated, key=generated.get) if generated else None
        ratio = generated[best] / med[torch_name] if best else math.inf
        run["rounds"].append({"samples": samples, "median_ms": med, "torch": torch_name,
                              "best": best, "ratio": ratio})
        print(f"  round {r + 1}/{a.rounds} {run['label']}: torch {med[torch_name]:.2f} ms "
              f"({torch_name[6:]}), best DaCe {best} {generated.get(best, math.nan):.2f} ms, "
              f"ratio {ratio:.2f}", flush=True)

    def _finish(self, run, writer):
        """The layer's result rows and its table row: medians over the rounds."""
        import statistics

        import torch

        from convbench.results.writer import Measurement
        from convbench.timing.timers import Timing
        a, timer, rounds, info = self.args, self.exp.timer, run["rounds"], run["info"]
        pooled = {n: [t for rd in rounds for t in rd["samples"][n]] for n in run["calls"]}
        med = {n: statistics.median(rd["median_ms"][n] for rd in rounds) for n in pooled}
        torch_name = min(self.torch_names, key=lambda n: med[n])
        # torch: the faster layout (and precision) in each round (choices may differ).
        torch_samples = [t for rd in rounds for t in rd["samples"][rd["torch"]]]
        measurements = [Measurement(n, Timing(s, a.warmupiter, timer.method))
                        for n, s in [("torch", torch_samples)] + list(pooled.items())]
        for name in med:
            if name in info:
                info[name]["status"] = "timed"
        ratios = [rd["ratio"] for rd in rounds]
        label = run["label"]
        writer.metadata["layers"][label] = dict(info, torch_layout=torch_name, rounds=[
            {"torch_layout": rd["torch"], "torch_ms": rd["median_ms"][rd["torch"]],
             "best": rd["best"], "best_ms": rd["median_ms"].get(rd["best"], math.nan),
             "ratio": rd["ratio"]} for rd in rounds])
        writer.add_layer(run["index"], run["layer"], label, measurements,
                         extra={"set": run["set"]})
        generated = self.generated(med)
        best = min(generated, key=generated.get) if generated else None
        # the measured error of the best and of the fastest direct sum (no bound of its own)
        direct = {n: t for n, t in generated.items() if not _own_bound(n)}
        best_direct = min(direct, key=direct.get) if direct else None
        speedups = [rd["median_ms"][best + WIDE] / rd["median_ms"][best] for rd in rounds
                    if best and best + WIDE in rd["median_ms"]] or [math.nan]
        row = {"wide_ms": med.get(f"{best}{WIDE}", math.nan) if self.wide else None,
               "speedup": statistics.median(speedups), "speedup_range": (min(speedups),
                                                                          max(speedups)),
               "label": label, "layer": run["layer"],
               "torch": statistics.median(rd["median_ms"][rd["torch"]] for rd in rounds),
               "torch_layout": torch_name, "best": best,
               "best_ms": generated.get(best, math.nan),
               "vendor": {n: med.get(n, math.nan) for n in VENDOR},
               "error": info.get(best, {}).get("max_rel_error", math.nan),
               "direct": best_direct,
               "direct_error": info.get(best_direct, {}).get("max_rel_error", math.nan),
               "ratio": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "rounds": rounds}
        print(f"  {label}: torch {row['torch']:.2f} ms ({torch_name[6:]}), best DaCe {best} "
              f"{row['best_ms']:.2f} ms, ratio {row['ratio']:.2f} "
              f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f} over {len(ratios)} rounds)",
              flush=True)
        if a.store and best:
            tuned.store_best("cpu", str(self.pass_), run["layer"], best,
                              {"cpu": writer.metadata["device"]["cpu"],
                               "threads": torch.get_num_threads()})
        return row

    @staticmethod
    def _info(record, call):
        """The metadata of one implementation on the layer (what happened, and why), and
        the progress line that says why it is not timed (None when it is)."""
        if record.status == "unsupported":
            return {"status": "unsupported", "reason": record.reason}, None
        info = {"params": record.params, "build": record.build_origin,
                "build_s": round(record.build_seconds, 2)}
        if call is not None:
            info["first_call_ms"] = call.first_ms
        line = None
        if record.status == "skipped":
            info["status"] = f"skipped: {record.reason}"
            line = f"{call.first_ms:.0f} ms, skipped ({record.reason})"
        elif record.status == "error":
            info["status"] = f"error: {record.reason}"
            line = f"ERROR ({record.reason}), not timed"
        elif record.checks:
            check = record.checks[0]
            info.update(verified=check.ok, err_over_tol=check.worst_ratio,
                        max_rel_error=check.max_rel)
            if not check.ok:
                info["status"] = "wrong"
                line = f"WRONG ({check.summary()}), not timed"
        return info, line


def _own_bound(name: str) -> bool:
    """Whether implementation ``name`` is checked against an error bound of its own (an
    algorithm that does not sum the products directly: Winograd)."""
    from .. import registry
    impl = registry.all_implementations().get(name)
    return impl is not None and impl.error_bound is not None


def torch_has_fast(dtype: str) -> bool:
    """Whether torch's CPU convolution has a oneDNN kernel for ``dtype`` on this CPU
    (bfloat16: AVX-512 BF16 or AMX; float16: AVX-512 FP16 or AMX)."""
    import torch
    probe = {"float32": lambda: True,
             "bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported,
             "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported}
    try:
        return bool(probe[dtype]())
    except (AttributeError, RuntimeError):
        return False


def _footprint(layer, pass_):
    """Bytes a prepared layer holds (its inputs in the ground truth, in torch's two
    layouts and once per implementation: the multiplier of :func:`_groups`) and the
    bytes its timed calls allocate and free (a few outputs and inputs, the warm heap's
    reserve)."""
    from convkernels.layouts import PASS_SIGNATURE
    shapes = {"x": layer.input_shape, "w": layer.filter_shape, "y": layer.output_shape}
    roles, out = PASS_SIGNATURE[pass_]
    inputs = sum(4 * math.prod(shapes[r]) for r in roles)
    return inputs, 4 * (inputs + 4 * math.prod(shapes[out]))


def _groups(layers, pass_, n_impls, share: float = 0.4):
    """``layers`` cut, in order, into groups whose prepared tensors fit in ``share`` of
    the available memory (each group is sampled over all rounds on its own)."""
    from convbench.timing.devices import cpu_available_memory
    budget = share * cpu_available_memory()[0]
    groups, used = [[]], 0.0
    for item in layers:
        held, working = _footprint(item[1][1], pass_)
        need = held * (3 + n_impls)
        if groups[-1] and used + need + working > budget:
            groups.append([])
            used = 0.0
        groups[-1].append(item)
        used += need
    return groups


def _rounds_csv(rows) -> str:
    lines = ["layer,round,backend,median_ms,torch_layout,best,ratio"]
    for row in rows:
        for r, rd in enumerate(row["rounds"]):
            for name, ms in rd["median_ms"].items():
                lines.append(f"{row['label']},{r + 1},{name},{ms:.6g},{rd['torch']},"
                             f"{rd['best']},{rd['ratio']:.6g}")
    return "\n".join(lines) + "\n"


def _table(rows, peak, fma, rounds: int = 1, dtype: str = "float32") -> str:
    """The printed table; a 16-bit bench adds the best kernel's float32 build and the
    speed-up of the 16-bit one over it (medians over the rounds).  GFLOP/s count the
    direct sum's 2 C K taps per output (so an algorithm of fewer products, Winograd, can
    pass the FMA peak).  The error columns: ``max |out - ref| / max |ref|`` against float64
    of the best and of the fastest direct-sum kernel, on the bench's inputs."""
    wide = dtype != "float32"
    lines = ["| layer | geometry | torch ms (layout) | best DaCe-generated | ms | "
             f"ratio (median of {rounds}) | min-max | GFLOP/s | % of SGEMM peak | "
             "% of FMA peak | im2colGemm (MKL) ms | best's error | fastest direct sum's error |"
             + (f" same kernel, float32 ms | {dtype} speed-up (median of {rounds}) | min-max |"
                if wide else ""),
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|---:|---:|" if wide else "")]
    for r in rows:
        gflops = r["layer"].flops() / (r["best_ms"] * 1e-3) / 1e9 if r["best"] else math.nan
        vendor = r["vendor"].get("im2colGemm", math.nan)
        lines.append(f"| {r['label']} | {r['layer'].describe()} | {r['torch']:.2f} "
                     f"({r['torch_layout'][6:]}) | {r['best']} | {r['best_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {r['ratio_min']:.2f}-{r['ratio_max']:.2f} | "
                     f"{gflops:.1f} | {100 * gflops / peak:.0f}% | "
                     f"{100 * gflops / fma:.0f}% | {vendor:.2f} | {r['error']:.1e} | "
                     + (f"{r['direct_error']:.1e} ({r['direct']}) |"
                        if r["direct"] and r["direct"] != r["best"]
                        else "same |" if r["direct"] else "- |")
                     + (f" {r['wide_ms']:.2f} | {r['speedup']:.2f} | {r['speedup_range'][0]:.2f}-"
                        f"{r['speedup_range'][1]:.2f} |" if wide else ""))
    return "\n".join(lines)
