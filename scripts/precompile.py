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
import concurrent.futures as cf
import multiprocessing
import os
import sys
import time
import traceback
import warnings
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
    """The builds to make: (description, impl name, layer, target, params)."""
    from convbench import registry, tuning
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
                        jobs.append((f"{impl.name} {set_name}/{layer.name} b{layer.batch} {target}",
                                     impl.name, layer, target, params))
    return jobs, unsupported


def _build_one(job, cachedir, force):
    """Worker: returns (description, outcome, seconds, message)."""
    desc, name, layer, target, params = job
    t0 = time.perf_counter()
    warnings.simplefilter("ignore")  # DaCe's codegen warnings would garble the progress
    try:
        from convbench import registry, toolchain
        from convbench.cache import BuildCache
        spec = toolchain.make_spec(registry.get(name), layer, "float32", target, params)
        cache = BuildCache(cachedir)
        if not force and cache.inspect(spec).valid:
            return desc, "cached", time.perf_counter() - t0, ""
        build = cache.get(spec, policy="rebuild" if force else "reuse", load=False)
        return desc, build.origin, time.perf_counter() - t0, ""
    except Exception as err:  # noqa: BLE001 - reported per build
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return desc, "failed", time.perf_counter() - t0, last.splitlines()[0][:300]


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
        jobs, unsupported = plan(args)
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    from convbench import toolchain
    from convbench.progress import Progress
    cachedir = args.cachedir or str(toolchain.default_cachedir())
    print(f"{len(jobs)} build(s) into {cachedir} with {args.jobs} process(es)"
          f"{f'; {unsupported} unsupported layer(s) skipped' if unsupported else ''}", flush=True)
    if args.dry_run:
        print("\n".join(j[0] for j in jobs))
        return 0
    counts = {"built": 0, "cached": 0, "loaded": 0, "failed": 0}
    failures = []
    ctx = multiprocessing.get_context("spawn")  # DaCe and torch do not like fork
    t0 = time.perf_counter()
    with Progress(len(jobs), label="precompile", lines=True) as bar, \
            cf.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_build_one, job, cachedir, args.force) for job in jobs]
        try:
            for fut in cf.as_completed(futures):
                desc, outcome, seconds, message = fut.result()
                counts[outcome] += 1
                if outcome == "failed":
                    failures.append((desc, message))
                bar.update(note=f"{desc}: {outcome} {seconds:.1f}s"
                           + (f" ({message})" if message else ""))
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
    # A worker that found the entry valid after waiting for another builder's lock says
    # "loaded": nothing was compiled for it either.
    counts["cached"] += counts.pop("loaded")
    print(f"done in {time.perf_counter() - t0:.0f}s: {counts['built']} built, "
          f"{counts['cached']} already cached, {counts['failed']} failed")
    for desc, message in failures:
        print(f"  FAILED {desc}: {message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
