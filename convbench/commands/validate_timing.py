"""Validate the profiler's timer against DaCe's own instrumentation, and measure the
spread of medians across repeated rounds.

results/cpu/epyc_f26m2_avx512/README.md, "How the timer was validated", describes the method
and its results.  The instrumented build (DaCe's ``Timer`` or ``GPU_Events`` on the whole
SDFG) is made in a temporary folder, outside the build cache, which holds only
uninstrumented builds.
"""

import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from convbench.commands import flags
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main

PROG = "validate_timing.py"
DEFAULT_IMPLEMENTATION = "implicitGemm"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_implementation_flag(p, f"default: {DEFAULT_IMPLEMENTATION}")
    flags.add_layer_flags(p, "cosmoflow", batch_default=1, select=False)
    p.add_argument("--layer", action="append", default=None, metavar="NAME",
                   help="only the layer of this name (repeatable; default: every layer)")
    flags.add_device_flag(p, default="cpu")
    p.add_argument("--rounds", type=int, default=3, metavar="R",
                   help="rounds of the profiler's measurement per layer (default 3)")
    flags.add_timing_flags(p, warmup=5, iters=30, time_limit=False)
    flags.add_out_flag(p, "none: print only")
    return p


def instrumented_build(spec, folder):
    """A :class:`~convbench.build.toolchain.Build` of ``spec`` in ``folder`` (not the cache),
    with DaCe's timer on the whole SDFG."""
    import dace

    from convbench.build import toolchain
    kind = (dace.InstrumentationType.GPU_Events if spec.target == "gpu"
            else dace.InstrumentationType.Timer)

    def prepare(sdfg):
        sdfg.instrument = kind
    # One report with every call, written when the program is finalised.
    with dace.config.set_temporary("instrumentation", "report_each_invocation", value=False):
        sdfg, library, times = toolchain.compile_spec(spec, Path(folder) / spec.name,
                                                      prepare=prepare)
    return toolchain.Build(spec=spec, folder=Path(folder) / spec.name, times=times,
                           program=toolchain.load_program(library, sdfg), library=library,
                           sdfg=sdfg)


def dace_durations(sdfg):
    """Per-call durations (ms) of the whole SDFG from DaCe's latest report."""
    report = sdfg.get_latest_report()
    if report is None:
        raise RuntimeError("DaCe wrote no instrumentation report")
    for uuid, names in report.durations.items():
        if uuid[1] == -1 and uuid[2] == -1:  # the SDFG itself, not a state or node
            for per_thread in names.values():
                for times in per_thread.values():
                    return list(times)
    raise RuntimeError("no SDFG-level duration in DaCe's report")


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    flags.check_timing_flags(args)
    check_at_least(("--batch", args.batch, 1), ("--rounds", args.rounds, 1))
    warnings.simplefilter("ignore")
    from convbench.build import toolchain
    from convbench.timing.devices import resolve_device
    from convbench.experiment.pipeline import (Experiment, TimingOptions,
                                               resolve_implementations)
    from convbench.layersets.sets import load_layers
    from convbench.check.verify import make_inputs
    device = resolve_device(args.device)
    impl, = resolve_implementations([args.implementation or DEFAULT_IMPLEMENTATION],
                                    device=device, flag="--implementation")
    layers = [x.with_batch(args.batch) for x in load_layers(args.paramscsv)
              if args.layer is None or x.name in args.layer]
    if not layers:
        raise UsageError(f"--layer: none of {', '.join(args.layer)} in {args.paramscsv}")
    exp = Experiment(impl, layers, device, timing=TimingOptions(
        args.warmupiter, args.totaliter, flush=not args.no_flush, heap=args.heap))
    records = []
    with tempfile.TemporaryDirectory(prefix="validate_timing_") as tmp:
        for layer in layers:
            params = exp.params(impl, layer)
            if impl.unsupported_reason(layer, params):
                continue
            build = instrumented_build(toolchain.make_spec(impl, layer, "float32", device,
                                                           params), tmp)
            # one checked call; later ones in place, as DaCe's own timer sees them
            call = exp.call(build, make_inputs(layer, impl.pass_, seed=0), fresh=False)
            rounds = [exp.timer.measure(call, args.warmupiter, args.totaliter).samples_ms
                      for _ in range(args.rounds)]
            build.program.finalize()  # DaCe writes its report now
            records.append(_compare(layer, rounds, dace_durations(build.sdfg), args))
            del call, build
    if args.out:
        from convbench.results.writer import run_metadata, save_records
        meta = run_metadata(toolchain.PROJECT_ROOT, device, None)
        meta.update({"implementation": impl.name, "layer_set": args.paramscsv,
                     "batch": args.batch, "rounds": args.rounds, "warmup": args.warmupiter,
                     "iterations": args.totaliter, "timer": exp.timer.method,
                     "host": platform.node(), "cpu_count": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        save_records(args.out, meta, records)
    return 0


def _compare(layer, rounds, inside, args):
    """The record of one layer: the profiler's samples next to DaCe's, call by call."""
    from convbench.timing.timers import summarize
    # Calls: 1 checked, then per round warm-up + samples.
    per_round = args.warmupiter + args.totaliter
    if len(inside) != 1 + args.rounds * per_round:
        raise RuntimeError(f"DaCe recorded {len(inside)} calls, expected "
                           f"{1 + args.rounds * per_round}")
    diffs, dace_rounds = [], []
    for r, ours in enumerate(rounds):
        start = 1 + r * per_round + args.warmupiter
        theirs = inside[start:start + args.totaliter]
        dace_rounds.append(theirs)
        diffs += [a - b for a, b in zip(ours, theirs)]
    medians = [statistics.median(x) for x in rounds]
    dace_medians = [statistics.median(x) for x in dace_rounds]
    overhead = {"median": statistics.median(diffs), "min": min(diffs), "max": max(diffs)}
    rec = {"layer": layer.name, "geometry": layer.describe(),
           "profiler_ms": rounds, "dace_ms": dace_rounds, "overhead_ms": overhead,
           "round_medians_ms": medians, "dace_round_medians_ms": dace_medians,
           "round_spread": (max(medians) - min(medians)) / statistics.median(medians),
           "noisy_rounds": [summarize(x)["noisy"] for x in rounds]}
    print(f"{layer.name:<6} {layer.describe():<34} profiler median "
          f"{statistics.median(medians):9.3f} ms, DaCe inside "
          f"{statistics.median(dace_medians):9.3f} ms, overhead median "
          f"{overhead['median'] * 1e3:7.1f} us [{overhead['min'] * 1e3:.1f}, "
          f"{overhead['max'] * 1e3:.1f}], round medians {', '.join(f'{m:.3f}' for m in medians)} "
          f"(spread {100 * rec['round_spread']:.1f}%)", flush=True)
    return rec
