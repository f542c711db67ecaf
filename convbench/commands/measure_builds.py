"""Measure build times: CPU (g++/OpenMP) and GPU (nvcc, sm_90, compile only), per
implementation, for one layer of a layer set.

Each build starts in an empty cache folder, with the implementation's default
parameters (not the tuned ones).
"""

import shutil
import statistics
import tempfile

from convbench.commands import flags
from convbench.base.errors import (ArgumentParser, UsageError, check_at_least, check_choice,
                                   run_main)

PROG = "measure_builds.py"
TARGETS = ("cpu", "gpu")


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_layer_flags(p, "cosmoflow", batch_default=1, select=False)
    p.add_argument("--layer", type=int, default=1, metavar="I",
                   help="layer index in the set (default 1)")
    p.add_argument("--targets", default="cpu,gpu", metavar="cpu,gpu",
                   help="targets to build for (default cpu,gpu)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="builds per implementation and target; the median is reported "
                   "(default 1)")
    flags.add_implementation_flag(p, "default: every one", many=True)
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--batch", args.batch, 1), ("--repeat", args.repeat, 1))
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for target in targets or [""]:
        check_choice("--targets", target, TARGETS, "target")
    from convbench.build import cache, toolchain
    from convbench.experiment.pipeline import resolve_implementations
    from convbench.layersets.sets import load_layers
    layers = load_layers(args.paramscsv)
    if not 0 <= args.layer < len(layers):
        raise UsageError(f"--layer: {args.layer} is out of range (0..{len(layers) - 1})")
    layer = layers[args.layer].with_batch(args.batch)
    impls = resolve_implementations(flags.implementation_names(args.implementation))
    if "gpu" in targets and shutil.which("nvcc") is None:
        print("nvcc not found: skipping GPU builds")
        targets.remove("gpu")
    print(f"layer {layer.name} {layer.describe()}, {args.repeat} build(s) each, fresh folders")
    rows = []
    for impl in impls:
        for target in (t for t in targets if t in impl.targets):
            times = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    build = cache.build(toolchain.make_spec(impl, layer, target=target), tmp,
                                        load=False)
                times.append(build.times)
                print(f"  {impl.name:<20} {target}: sdfg {build.times['sdfg']:.2f}s  "
                      f"compile {build.times['compile']:.2f}s", flush=True)
            rows.append((impl.name, target, statistics.median(t["sdfg"] for t in times),
                         statistics.median(t["compile"] for t in times)))
    print(f"\n{'implementation':<20} {'target':<6} {'sdfg [s]':>9} {'compile [s]':>12} "
          f"{'total [s]':>10}")
    for name, target, sdfg, comp in rows:
        print(f"{name:<20} {target:<6} {sdfg:>9.2f} {comp:>12.2f} {sdfg + comp:>10.2f}")
    return 0
