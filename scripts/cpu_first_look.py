#!/usr/bin/env python3
"""A first look at CPU speed: wall time per implementation per layer, and torch's conv3d
on the same inputs for scale.

    python scripts/cpu_first_look.py [--paramscsv cosmoflow] [--batch 1] [--repeat 3]
                                     [--implementation NAME ...] [--out results/cpu/x.json]
    python scripts/cpu_first_look.py --table results/cpu/x.json [...]   # markdown, ms

Per layer and implementation: build (or reuse the cache), one warm-up call, then
``--repeat`` timed calls; the median is reported.  No L2 flush and no pinning: this
is an indication, not the profiler (``--compareprof`` is).  Raw samples and the
machine description go to the JSON file.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convbench import registry, toolchain, verify  # noqa: E402
from convbench.errors import UsageError  # noqa: E402
from convbench.layers import load_layers  # noqa: E402


def _time(fn, repeat):
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def table(paths) -> str:
    """Median milliseconds per implementation (rows) and layer (columns), from result files."""
    out = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        recs, meta = data["records"], data["meta"]
        layers = list(dict.fromkeys(r["layer"] for r in recs))
        impls = list(dict.fromkeys(r["impl"] for r in recs))
        med = {(r["impl"], r["layer"]): statistics.median(r["samples_s"]) * 1e3 for r in recs}
        out.append(f"{meta['paramscsv']}, batch {meta['batch']}, {meta['date']}, "
                   f"{meta['method']}, ms:\n")
        out.append("| implementation | " + " | ".join(layers) + " |")
        out.append("|---|" + "---:|" * len(layers))
        for impl in impls:
            cells = [f"{med[impl, layer]:.1f}" if (impl, layer) in med else "-" for layer in layers]
            out.append(f"| {impl} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paramscsv", default="cosmoflow")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--implementation", action="append", default=None)
    p.add_argument("--out", default=None, help="JSON file for the raw samples")
    p.add_argument("--table", nargs="+", metavar="JSON", default=None,
                   help="print the medians of result files as a markdown table, and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    import torch
    try:
        layers = [layer.with_batch(args.batch) for layer in load_layers(args.paramscsv)]
        names = args.implementation or [n for n, i in registry.all_implementations().items()
                                        if i.pass_ == "fwd"]  # torch.conv3d is the yardstick
        impls = [registry.get(n) for n in names]
    except UsageError as err:
        print(f"cpu_first_look.py: error: {err}", file=sys.stderr)
        return 2
    records = []
    for layer in layers:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(layer.input_shape, generator=gen) * 2 - 1
        w = torch.rand(layer.filter_shape, generator=gen) * 2 - 1
        gflop = layer.flops() / 1e9
        ref = _time(lambda: torch.nn.functional.conv3d(x, w, stride=layer.stride,
                                                        padding=layer.pads), args.repeat)
        records.append({"layer": layer.name, "impl": "torch.conv3d", "samples_s": ref})
        line = [f"{layer.name:6s} torch {statistics.median(ref) * 1e3:9.1f} ms "
                f"({gflop / statistics.median(ref):6.1f} GFLOP/s)"]
        for impl in impls:
            params = impl.resolve_params()
            if impl.unsupported_reason(layer, params):
                continue
            build = toolchain.build(toolchain.make_spec(impl, layer, params=params))
            a = verify.program_arrays(impl, layer, {"x": x, "w": w}, fill=0.0)
            samples = _time(lambda: build(**a), args.repeat)
            med = statistics.median(samples)
            records.append({"layer": layer.name, "impl": impl.name, "params": params,
                            "samples_s": samples})
            line.append(f"  {impl.name} {med * 1e3:.1f} ms ({gflop / med:.1f} GFLOP/s)")
            print("\n".join(line), flush=True)
            line = []
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads":
            torch.get_num_threads(), "paramscsv": args.paramscsv, "batch": args.batch,
            "repeat": args.repeat, "method": "wall clock, 1 warm-up, median, no L2 flush"}
    if args.out:
        from convbench.results import save_records
        save_records(args.out, meta, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
