#!/usr/bin/env python3
"""Parameter search for a CPU implementation: the fastest tile sizes per layer.

    python scripts/tune_cpu.py [--implementation directConvNDHWCblocked]
                               [--paramscsv SET ...] [--batch 2] [--threads 2]
                               [--space "PIX=8,12,16,24;KOUTER=0,1"] [--samples 5]
                               [--store] [--out results/cpu/tuning_<impl>_b<B>.json]

For every layer, every combination of ``--space`` is built (or loaded from the build
cache), verified against float64 torch (a wrong configuration is never chosen), and
timed: one warm-up call, then ``--samples`` calls with the caches flushed before each;
the median decides.  With ``--store`` the winner per layer is written to the tuning
file the harness reads (``tuning/cpu.json``, see :mod:`convbench.tuning`), where
``profile_conv3d.py``, ``bench_cpu.py`` and ``cosmoflow_end2end.py`` find it;
``--param`` still overrides it.  Every configuration's time goes to ``--out``.
"""

import dataclasses
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convbench.errors import (ArgumentParser, UsageError, add_cachedir_flag,  # noqa: E402
                              add_threads_flag, check_at_least, run_main)

PROG = "tune_cpu.py"
#: The search space per implementation (``--space`` replaces it).
DEFAULT_SPACES = {"directConvNDHWCblocked": "PIX=8,12,16,24;KOUTER=0,1",
                  "directConvNDHWCdot": "PIX=2,4,6;KT=4,8;KOUTER=0,1"}


def build_parser():
    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--implementation", default="directConvNDHWCblocked", metavar="NAME")
    p.add_argument("--paramscsv", action="append", default=None, metavar="SET",
                   help="layer set (repeatable; default: cosmoflow_mlperf and cosmoflow)")
    p.add_argument("--batch", type=int, default=2, metavar="N")
    add_threads_flag(p, default=2)
    p.add_argument("--space", default=None, metavar="P=a,b;Q=c",
                   help="values to try per parameter (default per implementation: "
                   + "; ".join(f"{k}: {v!r}" for k, v in DEFAULT_SPACES.items())
                   + "); the other parameters keep their defaults")
    p.add_argument("--samples", type=int, default=5, metavar="N")
    p.add_argument("--store", action="store_true", help="write the winners to the tuning file")
    p.add_argument("--out", default=None, metavar="FILE.json")
    add_cachedir_flag(p)
    return p


def parse_space(text, impl):
    """``"PIX=12,16;KOUTER=0,1"`` -> list of parameter dicts.  Every value must be valid
    on its own (else a usage error); combinations the implementation refuses together
    (too many accumulators, say) are left out, and at least one must remain."""
    axes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, values = part.partition("=")
        if not sep:
            raise UsageError(f"--space: expected NAME=v1,v2 in {part!r}")
        axis = [(name.strip(), v.strip()) for v in values.split(",") if v.strip()]
        alone = dataclasses.replace(impl, check_params=None)  # each value on its own
        for name_value in axis:
            alone.resolve_params(dict([name_value]), source="--space")
        axes.append(axis)
    configs, refused = [], []
    for combo in itertools.product(*axes):
        try:
            configs.append(impl.resolve_params(dict(combo), source="--space"))
        except UsageError as err:
            refused.append(str(err))
    if not configs:
        raise UsageError(f"--space: no valid combination ({refused[0]})")
    return configs


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from convbench import registry
    from convbench.cli import set_threads
    from convbench.layers import load_layers
    check_at_least(("--batch", args.batch, 1), ("--threads", args.threads, 1),
                   ("--samples", args.samples, 1))
    impl = registry.get(args.implementation)
    if "cpu" not in impl.targets:
        raise UsageError(f"{impl.name} has no CPU schedule")
    space = args.space or DEFAULT_SPACES.get(impl.name)
    if space is None:
        raise UsageError(f"--space: give one for {impl.name} (no default space)")
    configs = parse_space(space, impl)
    args.space = space
    sets = args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"]
    layers = [(s, layer.with_batch(args.batch)) for s in sets for layer in load_layers(s)]
    set_threads(args.threads)
    return tune(args, impl, configs, layers)


def main(argv=None) -> int:
    return run_main(PROG, _main, argv)


def tune(args, impl, configs, layers) -> int:
    import torch

    from convbench import toolchain, tuning, verify
    from convbench.results import device_metadata, run_metadata, save_records
    from convbench.timing import CpuTimer, prepared_call
    timer = CpuTimer()
    records, winners = [], {}
    machine = {"cpu": device_metadata("cpu")["cpu"], "threads": torch.get_num_threads()}
    for layer_set, layer in layers:
        label = f"{Path(layer_set).stem}/{layer.name}"
        print(f"{label}: {layer.describe()}", flush=True)
        reference = verify.make_reference(layer)
        results = []
        for params in configs:
            if impl.unsupported_reason(layer, params):
                continue
            t0 = time.perf_counter()
            build = toolchain.build(toolchain.make_spec(impl, layer, params=params),
                                    args.cachedir, policy="reuse")
            build_s = time.perf_counter() - t0
            check = verify.verify_build(build, reference)[0]
            record = {"layer": label, "key": layer.key(), "params": params, "ok": check.ok,
                      "build_s": round(build_s, 2)}
            if check.ok:
                timing = timer.measure(prepared_call(build, verify.program_arrays(
                    impl, layer, reference.inputs)), warmup=1, iterations=args.samples)
                record.update(timing.stats(), samples_ms=timing.samples_ms)
                results.append(record)
            records.append(record)
            shown = ",".join(f"{k}={v}" for k, v in params.items())
            print(f"  {shown:30s} " + (f"{record['median_ms']:9.2f} ms" if check.ok else
                                       f"WRONG {check.summary()}"), flush=True)
        if not results:
            print("  no valid configuration", flush=True)
            continue
        best = min(results, key=lambda r: r["median_ms"])
        default = impl.resolve_params()
        base = next((r for r in results if r["params"] == default), None)
        gain = f", {base['median_ms'] / best['median_ms']:.2f}x the defaults" if base else ""
        print(f"  best: {best['params']} {best['median_ms']:.2f} ms{gain}", flush=True)
        winners[label] = best["params"]
        if args.store:
            tuning.store("cpu", impl.name, layer, best["params"], machine)
    out = Path(args.out) if args.out else \
        ROOT / "results" / "cpu" / f"tuning_{impl.name}_b{args.batch}.json"
    meta = run_metadata(ROOT, "cpu", args.threads)
    meta.update(implementation=impl.name, space=args.space, samples=args.samples,
                timing=timer.method, winners=winners)
    save_records(out, meta, records)
    if args.store:
        print(f"stored {len(winners)} entries in {tuning.tuning_file('cpu')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
