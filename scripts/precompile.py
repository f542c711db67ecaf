#!/usr/bin/env python3
"""Fill the build cache: implementations x layers x batches x targets, in parallel.

    python scripts/precompile.py [--implementation NAME ...] [--paramscsv SET ...]
                                 [--batch N ...] [--target cpu|gpu ...] [--jobs J]
                                 [--cachedir DIR] [--force] [--param NAME=VALUE ...]

Defaults: every implementation, the CosmoFlow sets (``cosmoflow_mlperf`` and
``cosmoflow``) at their CSV batch, the CPU target, one job per core.  Parameters are
the tuned ones (``tuning/<target>.json``, see ``convbench.tuning``) updated by
``--param``, as every other entry point builds them.  Builds that
are already valid in the cache are skipped (``--force`` rebuilds them), layers an
implementation does not support are counted and skipped.  GPU builds compile
without a GPU.  Every worker process builds with the cache's lock, so several
precompile runs (or a profiler) can share one cache folder.

Afterwards ``profile_conv3d.py --loadprecompiled`` (or ``--require-precompiled``)
loads these builds without compiling.  Exit status 1 if any build failed.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convbench.errors import UsageError, add_cachedir_flag  # noqa: E402

PROG = "precompile.py"


def _parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--implementation", action="append", default=None, metavar="NAME",
                   help="implementation to build (repeatable; default: all)")
    p.add_argument("--paramscsv", action="append", default=None, metavar="SET",
                   help="layer set (repeatable; default: cosmoflow_mlperf and cosmoflow)")
    p.add_argument("--batch", action="append", type=int, default=None, metavar="N",
                   help="batch size (repeatable; default: the CSV's)")
    p.add_argument("--target", action="append", default=None, metavar="cpu|gpu",
                   help="target (repeatable; default: cpu)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="tunable parameter (needs exactly one --implementation)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="J",
                   help="parallel build processes (default: one per core)")
    add_cachedir_flag(p)
    p.add_argument("--force", action="store_true", help="rebuild valid entries too")
    p.add_argument("--dry-run", action="store_true", help="list the builds and stop")

    def error(message):
        raise UsageError(message)
    p.error = error
    return p


def plan(args):
    """The builds to make (:class:`convbench.cache.Job`), and how many layers were skipped
    as unsupported."""
    from convbench import registry, tuning
    from convbench.cache import Job
    from convbench.layers import load_layers
    if args.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1, got {args.jobs}")
    names = args.implementation or list(registry.all_implementations())
    impls = [registry.get(n) for n in names]
    overrides = registry.parse_param_overrides(args.param)
    if overrides and len(impls) != 1:
        raise UsageError("--param: give exactly one --implementation with it")
    targets = args.target or ["cpu"]
    for t in targets:
        if t not in ("cpu", "gpu"):
            raise UsageError(f"--target: unknown target '{t}' (choose cpu or gpu)")
    for b in args.batch or []:
        if b <= 0:
            raise UsageError(f"--batch: must be a positive integer, got {b}")
    sets = args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"]
    jobs, unsupported = [], 0
    for set_name in sets:
        layers = load_layers(set_name)
        for batch in args.batch or [None]:
            for layer in layers:
                layer = layer if batch is None else layer.with_batch(batch)
                for impl in impls:
                    for target in targets:
                        if target not in impl.targets:
                            continue
                        # the parameters every other entry point builds with
                        params = tuning.tuned_params(impl, layer, target, overrides)
                        if impl.unsupported_reason(layer, params):
                            unsupported += 1
                            continue
                        jobs.append(Job(impl.name, layer, target, params, label=(
                            f"{impl.name} {set_name}/{layer.name} b{layer.batch} {target}")))
    return jobs, unsupported


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
        jobs, unsupported = plan(args)
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    from convbench import cache, toolchain
    from convbench.progress import Progress
    cachedir = args.cachedir or str(toolchain.default_cachedir())
    print(f"{len(jobs)} build(s) into {cachedir} with {args.jobs} process(es)"
          f"{f'; {unsupported} unsupported layer(s) skipped' if unsupported else ''}", flush=True)
    if args.dry_run:
        print("\n".join(j.describe() for j in jobs))
        return 0
    counts = {"built": 0, "cached": 0, "failed": 0}
    failures = []
    t0 = time.perf_counter()
    with Progress(len(jobs), label="precompile", lines=True) as bar:
        builds = cache.fill(jobs, cachedir, args.jobs, force=args.force)
        try:
            for job, outcome, seconds, message in builds:
                counts[outcome] += 1
                if outcome == "failed":
                    failures.append((job.describe(), message))
                bar.update(note=f"{job.describe()}: {outcome} {seconds:.1f}s"
                           + (f" ({message})" if message else ""))
        except KeyboardInterrupt:
            builds.close()
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
    print(f"done in {time.perf_counter() - t0:.0f}s: {counts['built']} built, "
          f"{counts['cached']} already cached, {counts['failed']} failed")
    for desc, message in failures:
        print(f"  FAILED {desc}: {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
