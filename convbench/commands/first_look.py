"""A first look at CPU speed: wall time per implementation per layer, and torch's conv3d
on the same inputs for scale.

Per layer and implementation: build (or reuse the cache), one warm-up call, then
``--repeat`` timed calls; the median is reported.  No cache flush and no pinning: this
is an indication, not the profiler (``--compareprof`` is).  Raw samples and the
machine description go to the ``--out`` JSON file; ``--table`` prints the medians of
such files as a markdown table.
"""

import datetime
import json
import os
import platform
import statistics
from pathlib import Path

from .. import flags
from ..errors import ArgumentParser, UsageError, check_at_least, run_main

PROG = "cpu_first_look.py"
METHOD = "wall clock, 1 warm-up, median, no L2 flush"


def table(paths) -> str:
    """Median milliseconds per implementation (rows) and layer (columns), from result files."""
    out = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            recs, meta = data["records"], data["meta"]
            med = {(r["impl"], r["layer"]): statistics.median(r["samples_s"]) * 1e3 for r in recs}
            title = (f"{meta['paramscsv']}, batch {meta['batch']}, {meta['date']}, "
                     f"{meta['method']}, ms:\n")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--table: {path}: not a result file of this tool "
                             f"({type(err).__name__}: {err})") from None
        layers = list(dict.fromkeys(layer for _, layer in med))
        impls = list(dict.fromkeys(impl for impl, _ in med))
        out += [title, "| implementation | " + " | ".join(layers) + " |",
                "|---|" + "---:|" * len(layers)]
        for impl in impls:
            cells = [f"{med[impl, layer]:.1f}" if (impl, layer) in med else "-" for layer in layers]
            out.append(f"| {impl} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_layer_flags(p, "cosmoflow", batch_default=1, select=False)
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="timed calls after one warm-up call (default 3)")
    flags.add_implementation_flag(p, "default: every forward one with a CPU schedule",
                                  many=True)
    flags.add_cachedir_flag(p)
    flags.add_out_flag(p, "none: print only")
    p.add_argument("--table", nargs="+", metavar="JSON", default=None,
                   help="print the medians of result files as a markdown table, and stop")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    check_at_least(("--batch", args.batch, 1), ("--repeat", args.repeat, 1))
    import torch
    import torch.nn.functional as F

    from ..experiment import Experiment, TimingOptions, resolve_implementations
    from ..layers import load_layers
    from ..layouts import Pass
    from ..verify import make_inputs
    layers = [layer.with_batch(args.batch) for layer in load_layers(args.paramscsv)]
    impls = resolve_implementations(flags.implementation_names(args.implementation), Pass.FWD,
                                    "cpu")  # torch.conv3d is the yardstick
    exp = Experiment(impls, layers, "cpu", policy="reuse", cachedir=args.cachedir,
                     timing=TimingOptions(warmup=1, iterations=args.repeat, flush=False))
    records = []
    for layer in layers:
        inputs = make_inputs(layer, Pass.FWD, seed=0)
        calls = {"torch.conv3d": lambda: lambda: F.conv3d(
            inputs["x"], inputs["w"], stride=layer.stride, padding=layer.pads)}
        params = {i.name: exp.params(i, layer) for i in impls}
        calls.update({i.name: lambda i=i: exp.call(exp.build(i, layer, params[i.name]), inputs)
                      for i in impls if not i.unsupported_reason(layer, params[i.name])})
        for name, prepare in calls.items():
            (measured,), _ = exp.time({name: prepare})  # the build is outside the timing
            med = measured.timing.stats()["median_ms"]
            record = {"layer": layer.name, "impl": name}
            if name in params:
                record["params"] = params[name]
            records.append(dict(record, samples_s=[t * 1e-3 for t in measured.timing.samples_ms]))
            print(f"{layer.name:6s} {name:<24} {med:9.1f} ms "
                  f"({layer.flops() / 1e6 / med:6.1f} GFLOP/s)", flush=True)
    if args.out:
        from ..results import save_records
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "torch_threads": torch.get_num_threads(), "paramscsv": args.paramscsv,
                "batch": args.batch, "repeat": args.repeat, "method": METHOD}
        save_records(args.out, meta, records)
    return 0
