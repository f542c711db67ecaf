"""Parameter search for a CPU implementation: the fastest tile sizes per layer; with
``--quick SET``, the quick autotune of every pass over the candidate implementations
(:mod:`convbench.tuning.autotune`).

docs/benchmarking.md, "Tuning and the CPU bench", describes the search and where the winners
that ``--store`` writes are used.  Each configuration gets one warm-up call before its
flushed samples, and one that fails verification is never chosen.  The fastest few and
the defaults are then timed again in turn (``--confirm``), and the winner is taken from
those samples.  Every configuration's time goes to ``--out``.
"""

import statistics
from pathlib import Path

from convbench.commands import flags
from convkernels.cpu import isa
from convbench.build.chatter import add_verbose_flag, set_verbose
from convbench.build.tuned import parse_space, within_registers  # noqa: F401 - tests call it here
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.build.toolchain import PROJECT_ROOT

PROG = "tune_cpu.py"
DEFAULT_IMPLEMENTATION = "directConvNDHWCblocked"
DEFAULT_SETS = ["cosmoflow_mlperf", "cosmoflow"]
#: ``--space elsewhere``: per layer, the defaults and the other machines' entries.
ELSEWHERE = "elsewhere"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_implementation_flag(p, f"default: {DEFAULT_IMPLEMENTATION}")
    flags.add_layer_flags(p, " and ".join(DEFAULT_SETS), many=True, batch_default=2,
                          select=False)
    flags.add_threads_flag(p, default=2)
    p.add_argument("--space", default=None, metavar="P=a,b;Q=c",
                   help="values to try per parameter (default: the implementation's own "
                   "search space, which convbench list shows); the other parameters keep their "
                   "defaults, and configurations whose "
                   "accumulators would not fit this CPU's vector registers are left out. "
                   "'elsewhere': a short "
                   "retune, each layer's defaults and the entries tuned for it on other machines")
    p.add_argument("--samples", type=int, default=5, metavar="N",
                   help="timed calls per configuration, after one warm-up call (default 5)")
    p.add_argument("--confirm", type=int, default=3, metavar="R",
                   help="rounds of the confirmation: the 3 fastest configurations and the "
                   "defaults timed again in turn, R blocks of --samples calls each, the "
                   "winner taken from all their samples (default 3; 0: the sweep's fastest)")
    p.add_argument("--store", action="store_true", help="write the winners to the tuning file")
    p.add_argument("--quick", nargs="+", default=None, metavar="SET",
                   help="the quick autotune instead, on these layer sets: per layer and pass "
                   "(--passes), the implementations with a rule and a few configurations of "
                   "each, verified, timed, the winners stored under this machine's key (the "
                   "implementation and --space flags do not apply)")
    p.add_argument("--budget", default=None, metavar="MIN",
                   help="with --quick: at most MIN minutes (default 10)")
    p.add_argument("--passes", default="fwd,bwd_data,bwd_filter", metavar="P,...",
                   help="with --quick: the passes to tune (default all three)")
    add_verbose_flag(p)
    flags.add_out_flag(p, "results/cpu/<machine>/tuning/tuning_<impl>_b<B>.json")
    flags.add_cachedir_flag(p)
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--batch", args.batch, 1), ("--threads", args.threads, 1),
                   ("--samples", args.samples, 1), ("--confirm", args.confirm, 0))
    set_verbose(args.verbose)
    if args.quick is not None:
        return quick(args)
    if args.budget is not None:
        raise UsageError("--budget: only with --quick")
    from convbench.timing.devices import set_threads
    from convbench.experiment.pipeline import (Experiment, TimingOptions,
                                               resolve_implementations)
    from convbench.layersets.sets import load_layers
    impl, = resolve_implementations([args.implementation or DEFAULT_IMPLEMENTATION],
                                    device="cpu", flag="--implementation")
    space = args.space or impl.search_space
    if not space:
        raise UsageError(f"--space: give one for {impl.name} (it declares no search_space)")
    configs = None if space == ELSEWHERE else parse_space(space, impl)
    sets = args.paramscsv or DEFAULT_SETS
    layers = [(s, layer.with_batch(args.batch)) for s in sets for layer in load_layers(s)]
    set_threads(args.threads)
    exp = Experiment(impl, [layer for _, layer in layers], "cpu", policy="reuse",
                     cachedir=args.cachedir, threads=args.threads,
                     timing=TimingOptions(warmup=1, iterations=args.samples))
    return tune(exp, args, space, configs, layers)


def quick(args) -> int:
    """``--quick SET ...``: the quick autotune (:mod:`convbench.tuning.autotune`)."""
    from convbench.tuning.autotune import DEFAULT_BUDGET_MIN, parse_budget, tune as autotune
    from convbench.timing.devices import set_threads
    from convkernels.layouts import Pass
    from convbench.layersets.sets import load_layers
    if args.implementation or args.space or args.paramscsv:
        raise UsageError("--quick: takes its layer sets as its values; --implementation, "
                         "--space and --paramscsv do not apply")
    budget = parse_budget(args.budget if args.budget is not None else DEFAULT_BUDGET_MIN)
    try:
        passes = [Pass(p.strip()) for p in args.passes.split(",") if p.strip()]
    except ValueError:
        raise UsageError(f"--passes: expected names among fwd, bwd_data, bwd_filter, got "
                         f"{args.passes!r}") from None
    if not passes:
        raise UsageError("--passes: name at least one pass")
    layers = [layer.with_batch(args.batch) for s in args.quick for layer in load_layers(s)]
    set_threads(args.threads)
    result = autotune([(layer, p) for layer in layers for p in passes], budget,
                      cachedir=args.cachedir, threads=args.threads)
    from convbench.build import tuned
    from convbench.results.writer import run_metadata, save_records
    out = Path(args.out) if args.out else (
        PROJECT_ROOT / "results" / "cpu" / tuned.machine_folder() / "tuning" /
        f"autotune_{'_'.join(Path(s).stem for s in args.quick)}_b{args.batch}.json")
    meta = run_metadata(PROJECT_ROOT, "cpu", args.threads)
    meta.update(kind="autotune", sets=args.quick, budget_min=budget, passes=args.passes,
                seconds=round(result["seconds"], 1), left=result["left"])
    save_records(out, meta, result["candidates"])
    print(f"candidates' times: {out}")
    return 0


def candidates(impl, layer, configs):
    """The configurations to try on ``layer``: ``configs``, or (``--space elsewhere``, when
    ``configs`` is None) the defaults and what other machines stored for it."""
    if configs is not None:
        return configs
    from convbench.build import tuned
    defaults = impl.resolve_params()
    return [defaults] + [p for p in tuned.params_elsewhere(impl, layer, "cpu") if p != defaults]


#: Configurations the confirmation times again (besides the defaults).
FINALISTS = 3


def confirm(exp, impl, layer, truth, results, base, rounds: int) -> None:
    """Time the sweep's :data:`FINALISTS` fastest configurations and the defaults again, in
    turn: ``rounds`` rounds, each a block of samples per configuration, starting one
    configuration later each round; each record gets ``confirmed_ms``, the median of its
    blocks' samples (and ``confirmed_samples_ms``).

    Each configuration's sweep median is a few samples taken at one moment; the fastest of
    many such medians is biased low (the fastest moment, not the fastest configuration),
    and the machine drifts over a long sweep.  Timing the finalists in turn spreads that
    drift over all of them: a winner the confirmation does not confirm is not stored."""
    finalists = sorted(results, key=lambda r: r["median_ms"])[:FINALISTS]
    if base is not None and base not in finalists:
        finalists.append(base)
    samples = {id(r): [] for r in finalists}
    for i in range(rounds):
        k = i % len(finalists)
        for record in finalists[k:] + finalists[:k]:
            case = exp.run_case(impl, layer, params=record["params"], truth=truth,
                                references=False, time_wrong=False, catch=False)
            if case.checks[0].ok:
                samples[id(record)].extend(case.measurements[0].timing.samples_ms)
    for record in finalists:
        if samples[id(record)]:
            record["confirmed_ms"] = statistics.median(samples[id(record)])
            record["confirmed_samples_ms"] = samples[id(record)]
            shown = ",".join(f"{k}={v}" for k, v in record["params"].items())
            print(f"  confirmed {shown:30s} {record['confirmed_ms']:9.2f} ms "
                  f"(sweep {record['median_ms']:.2f})", flush=True)


def tune(exp, args, space, configs, layers) -> int:
    """Build, verify and time every configuration on every layer; store the winners."""
    import torch

    from convbench.build import tuned
    from convbench.results.writer import device_metadata, run_metadata, save_records
    impl = exp.impls[0]
    records, winners = [], {}
    machine = {"cpu": device_metadata("cpu")["cpu"], "threads": torch.get_num_threads()}
    for layer_set, layer in layers:
        label = f"{Path(layer_set).stem}/{layer.name}"
        print(f"{label}: {layer.describe()}", flush=True)
        truth = exp.truth(impl.pass_, layer)
        results = []
        tried, spilled = within_registers(impl, layer, [
            params for params in candidates(impl, layer, configs)
            if not impl.unsupported_reason(layer, params)])
        if spilled:
            print(f"  left out {spilled} configuration(s) over {isa.accumulator_budget()} "
                  f"accumulator registers ({isa.widest_isa()})", flush=True)
        for params in tried:
            case = exp.run_case(impl, layer, params=params, truth=truth, references=False,
                                time_wrong=False, catch=False)
            check = case.checks[0]
            record = {"layer": label, "key": layer.key(), "params": params, "ok": check.ok,
                      "build_s": round(case.build_seconds, 2)}
            if check.ok:
                measured, = case.measurements
                record.update(measured.timing.stats(), samples_ms=measured.timing.samples_ms)
                results.append(record)
            records.append(record)
            shown = ",".join(f"{k}={v}" for k, v in params.items())
            print(f"  {shown:30s} " + (f"{record['median_ms']:9.2f} ms" if check.ok else
                                       f"WRONG {check.summary()}"), flush=True)
        if not results:
            truth.drop()
            print("  no valid configuration", flush=True)
            continue
        base = next((r for r in results if r["params"] == impl.resolve_params()), None)
        speed = "median_ms"
        if args.confirm and len(results) > 1:
            confirm(exp, impl, layer, truth, results, base, args.confirm)
            speed = "confirmed_ms"
        truth.drop()
        best = min((r for r in results if speed in r), key=lambda r: r[speed])
        gain = f", {base[speed] / best[speed]:.2f}x the defaults" if base and speed in base else ""
        print(f"  best: {best['params']} {best[speed]:.2f} ms{gain}", flush=True)
        winners[label] = best["params"]
        if args.store:
            tuned.store("cpu", impl.name, layer, best["params"], machine)
    out = Path(args.out) if args.out else \
        PROJECT_ROOT / "results" / "cpu" / tuned.machine_folder() / "tuning" / \
        f"tuning_{impl.name}_b{args.batch}.json"
    meta = run_metadata(PROJECT_ROOT, "cpu", args.threads)
    meta.update(implementation=impl.name, space=space, samples=args.samples,
                confirm_rounds=args.confirm, timing=exp.timer.method, winners=winners)
    save_records(out, meta, records)
    if args.store:
        print(f"stored {len(winners)} entries in {tuned.tuning_file('cpu')}")
    return 0
