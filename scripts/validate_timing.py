#!/usr/bin/env python3
"""Validate the profiler's timer against DaCe's own instrumentation, and measure the
spread of medians across repeated rounds.

    python scripts/validate_timing.py [--implementation NAME] [--paramscsv SET]
                                      [--layer NAME ...] [--batch N] [--device cpu|gpu]
                                      [--rounds R] [--warmupiter W] [--totaliter T]
                                      [--out results/cpu/timing_validation.json]

For each layer, the implementation is built once more with DaCe instrumentation on
the whole SDFG (``Timer``: C++ ``chrono`` inside the compiled code on the CPU;
``GPU_Events``: CUDA events that DaCe records itself on the GPU), outside the
cache.  Then ``R`` rounds of the profiler's own measurement
(:mod:`convbench.timing`, the same timer, flush and prepared call that
``--compareprof`` uses) run on that build.  Every timed call is thus measured twice:
by the profiler from outside, and by DaCe from inside.  The script reports

* the per-call difference, profiler minus DaCe (the profiler's overhead: the Python
  call, ctypes, on the GPU event placement), as a median and a range;
* the median of each round and their spread, (max - min) / median.
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROG = "validate_timing.py"


def instrumented_build(spec, folder, device):
    import dace

    from convbench import toolchain
    kind = (dace.InstrumentationType.GPU_Events if device == "gpu"
            else dace.InstrumentationType.Timer)

    def prepare(sdfg):
        sdfg.instrument = kind
    # One report with every call, written when the program is finalised.
    with dace.config.set_temporary("instrumentation", "report_each_invocation", value=False):
        sdfg, library, _ = toolchain.compile_spec(spec, Path(folder) / spec.name,
                                                  prepare=prepare)
    return sdfg, toolchain.load_program(library, sdfg)


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--implementation", default="implicitGemm")
    p.add_argument("--paramscsv", default="cosmoflow")
    p.add_argument("--layer", action="append", default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmupiter", type=int, default=5)
    p.add_argument("--totaliter", type=int, default=30)
    p.add_argument("--no-flush", action="store_true", help="do not flush caches between calls")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from convbench import registry, toolchain, verify
    from convbench.devices import resolve_device
    from convbench.errors import UsageError
    from convbench.layers import load_layers
    from convbench.timing import make_timer, prepared_call, summarize
    try:
        device = resolve_device(args.device)
        impl = registry.get(args.implementation)
        layers = [x.with_batch(args.batch) for x in load_layers(args.paramscsv)
                  if args.layer is None or x.name in args.layer]
        if not layers:
            raise UsageError(f"--layer: none of {args.layer} in {args.paramscsv}")
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    timer = make_timer(device, flush=not args.no_flush)
    records = []
    with tempfile.TemporaryDirectory(prefix="validate_timing_") as tmp:
        for layer in layers:
            if impl.unsupported_reason(layer, impl.resolve_params()):
                continue
            spec = toolchain.make_spec(impl, layer, "float32", device)
            sdfg, program = instrumented_build(spec, tmp, device)
            build = toolchain.Build(spec=spec, folder=Path(tmp), program=program, times={},
                                    sdfg=sdfg)
            inputs = verify.make_inputs(layer, impl.pass_, seed=0)
            arrays = verify.program_arrays(impl, layer, inputs, device, fill=0.0)
            call = prepared_call(build, arrays)  # one checked call
            rounds = [timer.measure(call, args.warmupiter, args.totaliter).samples_ms
                      for _ in range(args.rounds)]
            program.finalize()  # DaCe writes its report now
            inside = dace_durations(sdfg)
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
            rec = {"layer": layer.name, "geometry": layer.describe(),
                   "profiler_ms": rounds, "dace_ms": dace_rounds,
                   "overhead_ms": {"median": statistics.median(diffs), "min": min(diffs),
                                   "max": max(diffs)},
                   "round_medians_ms": medians, "dace_round_medians_ms": dace_medians,
                   "round_spread": (max(medians) - min(medians)) / statistics.median(medians),
                   "noisy_rounds": [summarize(x)["noisy"] for x in rounds]}
            records.append(rec)
            print(f"{layer.name:<6} {layer.describe():<34} profiler median "
                  f"{statistics.median(medians):9.3f} ms, DaCe inside {statistics.median(dace_medians):9.3f}"
                  f" ms, overhead median {rec['overhead_ms']['median'] * 1e3:7.1f} us "
                  f"[{rec['overhead_ms']['min'] * 1e3:.1f}, {rec['overhead_ms']['max'] * 1e3:.1f}], "
                  f"round medians {', '.join(f'{m:.3f}' for m in medians)} "
                  f"(spread {100 * rec['round_spread']:.1f}%)", flush=True)
            del program, build
    if args.out:
        from convbench.results import run_metadata, save_records
        meta = run_metadata(toolchain.PROJECT_ROOT, device, None)
        meta.update({"implementation": impl.name, "layer_set": args.paramscsv,
                     "batch": args.batch, "rounds": args.rounds, "warmup": args.warmupiter,
                     "iterations": args.totaliter, "timer": timer.method,
                     "host": platform.node(), "cpu_count": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        save_records(args.out, meta, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
