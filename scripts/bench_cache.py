#!/usr/bin/env python3
"""Benchmark of the build cache: cold build against warm load, per target.

    python scripts/bench_cache.py [--implementation NAME] [--paramscsv SET] [--layer NAME]
                                  [--batch N] [--target cpu|gpu ...] [--cold K] [--warm K]
                                  [--out results/cpu/epyc_f26m2_avx512/bench_cache.json]

docs/build-cache.md describes what is measured.  Cold
builds run in this process, each into a fresh folder; each warm load runs in a fresh
process, which reports the load and its own wall time.  No GPU is needed (nothing
runs).  Not a test: numbers depend on the machine and its load.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROG = "bench_cache.py"

_WARM = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from convbench import registry
from convbench.build import toolchain
from convbench.build.cache import BuildCache
from convbench.layersets import load_layers
layer = [l for l in load_layers({set!r}) if l.name == {layer!r}][0].with_batch({batch})
spec = toolchain.make_spec(registry.get({impl!r}), layer, "float32", {target!r})
t1 = time.perf_counter()
build = BuildCache({cachedir!r}).get(spec, policy="require", load=True)
t2 = time.perf_counter()
print(json.dumps({{"origin": build.origin, "imports_s": t1 - t0, "load_s": t2 - t1}}))
"""


def main(argv=None) -> int:
    from convbench.base.errors import run_main
    return run_main(PROG, _main, argv)


def _main(argv) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--implementation", default="implicitGemmNCDHW")
    p.add_argument("--paramscsv", default="cosmoflow_mlperf")
    p.add_argument("--layer", default="conv3")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--target", action="append", default=None)
    p.add_argument("--cold", type=int, default=3)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON file for the raw numbers")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    from convbench import registry
    from convbench.build import toolchain
    from convbench.build.cache import BuildCache
    from convbench.base.errors import UsageError
    from convbench.layersets.sets import load_layers
    impl = registry.get(args.implementation)
    layers = [x for x in load_layers(args.paramscsv) if x.name == args.layer]
    if not layers:
        raise UsageError(f"--layer: no layer '{args.layer}' in {args.paramscsv}")
    layer = layers[0].with_batch(args.batch)
    records = []
    for target in args.target or ["cpu", "gpu"]:
        spec = toolchain.make_spec(impl, layer, "float32", target)
        with tempfile.TemporaryDirectory(prefix="bench_cache_") as tmp:
            cold = []
            for k in range(max(args.cold, 1)):
                folder = Path(tmp) / f"cold{k}"
                t0 = time.perf_counter()
                BuildCache(folder).get(spec, policy="rebuild", load=False)
                cold.append(time.perf_counter() - t0)
                print(f"{target}: cold build {k + 1}: {cold[-1]:.2f}s", flush=True)
            warm, process = [], []
            script = _WARM.format(root=str(ROOT), set=args.paramscsv, layer=layer.name,
                                  batch=layer.batch, impl=impl.name, target=target,
                                  cachedir=str(folder))
            for k in range(max(args.warm, 1)):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                     text=True, check=True)
                process.append(time.perf_counter() - t0)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                assert result["origin"] == "loaded", result
                warm.append(result["load_s"])
                print(f"{target}: warm load {k + 1}: {warm[-1]:.3f}s (process {process[-1]:.2f}s)",
                      flush=True)
        rec = {"target": target, "implementation": impl.name, "layer": layer.name,
               "geometry": layer.describe(), "cold_s": cold, "warm_load_s": warm,
               "warm_process_s": process,
               "ratio_cold_over_warm_load": statistics.median(cold) / statistics.median(warm),
               "ratio_cold_over_warm_process": statistics.median(cold) / statistics.median(process)}
        records.append(rec)
    print(f"\n{impl.name} on {args.paramscsv}/{layer.name} ({layer.describe()}), medians:")
    print(f"{'target':<6} {'cold build':>11} {'warm load':>10} {'ratio':>8} "
          f"{'warm process':>13} {'ratio':>7}")
    for r in records:
        print(f"{r['target']:<6} {statistics.median(r['cold_s']):10.2f}s "
              f"{statistics.median(r['warm_load_s']):9.3f}s {r['ratio_cold_over_warm_load']:7.0f}x "
              f"{statistics.median(r['warm_process_s']):12.2f}s "
              f"{r['ratio_cold_over_warm_process']:6.1f}x")
    if args.out:
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                "cpu_count": os.cpu_count(), "python": platform.python_version(),
                "method": "cold: build into an empty cache folder in-process; warm: "
                          "policy=require load in a fresh process (lookup + checksums + "
                          "SDFG read + dlopen), and that process's wall time"}
        from convbench.results.writer import save_records
        save_records(args.out, meta, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
