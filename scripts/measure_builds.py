#!/usr/bin/env python3
"""Measure build times: CPU (g++/OpenMP) and GPU (nvcc, sm_90, compile only), per
implementation, for one layer of a layer set.

    python scripts/measure_builds.py [--paramscsv cosmoflow] [--layer 1] [--batch 1]
                                     [--targets cpu,gpu] [--repeat 1]

Each build starts from an empty folder (nothing cached).  Prints one line per
build and a summary table; GPU builds are skipped when nvcc is missing.
"""

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convbench import registry, toolchain  # noqa: E402
from convbench.errors import UsageError  # noqa: E402
from convbench.layers import load_layers  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paramscsv", default="cosmoflow")
    p.add_argument("--layer", type=int, default=1, help="layer index in the set (default 1)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--targets", default="cpu,gpu")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--implementation", action="append", default=None,
                   help="restrict to these implementations (repeatable)")
    args = p.parse_args(argv)
    try:
        layers = load_layers(args.paramscsv)
        if not 0 <= args.layer < len(layers):
            raise UsageError(f"--layer: {args.layer} is out of range (0..{len(layers) - 1})")
        layer = layers[args.layer].with_batch(args.batch)
        names = args.implementation or list(registry.all_implementations())
        impls = [registry.get(n) for n in names]
    except UsageError as err:
        print(f"measure_builds.py: error: {err}", file=sys.stderr)
        return 2
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if "gpu" in targets and shutil.which("nvcc") is None:
        print("nvcc not found: skipping GPU builds")
        targets.remove("gpu")
    print(f"layer {layer.name} {layer.describe()}, {args.repeat} build(s) each, fresh folders")
    rows = []
    for impl in impls:
        for target in targets:
            if target not in impl.targets:
                continue
            times = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    spec = toolchain.make_spec(impl, layer, target=target)
                    build = toolchain.build(spec, tmp, load=False)
                    times.append(build.times)
                    print(f"  {impl.name:<20} {target}: sdfg {build.times['sdfg']:.2f}s  "
                          f"compile {build.times['compile']:.2f}s", flush=True)
            rows.append((impl.name, target,
                         statistics.median(t["sdfg"] for t in times),
                         statistics.median(t["compile"] for t in times)))
    print(f"\n{'implementation':<20} {'target':<6} {'sdfg [s]':>9} {'compile [s]':>12} "
          f"{'total [s]':>10}")
    for name, target, sdfg, comp in rows:
        print(f"{name:<20} {target:<6} {sdfg:>9.2f} {comp:>12.2f} {sdfg + comp:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
