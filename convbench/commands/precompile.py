"""Fill the build cache: implementations x layers x batches x targets, in parallel.

docs/build-cache.md describes the cache and how the
profiler loads these builds.  Parameters are the tuned ones updated by ``--param``,
exactly as every other entry point builds them (:meth:`Experiment.params
<convbench.experiment.pipeline.Experiment.params>`), so the entries are the ones they look up.
Valid entries are skipped unless ``--force``; unsupported layers are counted and
skipped.  Workers build under the cache's locks, so several runs can share a folder.
"""

import os
import time

from convbench.commands import flags
from convbench.base.errors import (ArgumentParser, UsageError, check_at_least, check_choice,
                                   run_main)

PROG = "precompile.py"
DEFAULT_SETS = ("cosmoflow_mlperf", "cosmoflow")
TARGETS = ("cpu", "gpu")


def build_parser(prog: str = PROG) -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_implementation_flag(p, "to build; default: all", many=True)
    p.add_argument("--paramscsv", action="append", default=None, metavar="SET",
                   help="layer set: a name in convparams/ or a CSV path (repeatable; default: "
                   f"{' and '.join(DEFAULT_SETS)})")
    p.add_argument("--batch", action="append", type=int, default=None, metavar="N",
                   help="batch size (repeatable; default: the CSV's)")
    p.add_argument("--target", action="append", default=None, metavar="cpu|gpu",
                   help="target (repeatable; default: cpu)")
    flags.add_param_flag(p)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="J",
                   help="parallel build processes (default: one per core)")
    flags.add_cachedir_flag(p)
    p.add_argument("--force", action="store_true", help="rebuild valid entries too")
    p.add_argument("--dry-run", action="store_true", help="list the builds and stop")
    return p


def plan(args):
    """The builds to make (:class:`convbench.build.cache.Job`), and how many layers were skipped
    as unsupported."""
    from .. import registry
    from convbench.build.cache import Job
    from convbench.experiment.pipeline import Experiment, resolve_implementations
    from convbench.layersets.sets import load_layers
    check_at_least(("--jobs", args.jobs, 1), *(("--batch", b, 1) for b in args.batch or []))
    impls = resolve_implementations(flags.implementation_names(args.implementation))
    overrides = registry.parse_param_overrides(args.param)
    if overrides and len(impls) != 1:
        raise UsageError("--param: give exactly one --implementation with it")
    targets = args.target or ["cpu"]
    for t in targets:
        check_choice("--target", t, TARGETS, "target")
    # The parameters every other entry point builds with: one experiment per target.
    experiments = {t: Experiment(impls, [], t, overrides=overrides, verify=False)
                   for t in targets}
    jobs, unsupported = [], 0
    for set_name in args.paramscsv or DEFAULT_SETS:
        layers = load_layers(set_name)
        for batch in args.batch or [None]:
            for layer in layers:
                layer = layer if batch is None else layer.with_batch(batch)
                for impl in impls:
                    for target in targets:
                        if target not in impl.targets:
                            continue
                        params = experiments[target].params(impl, layer)
                        if impl.unsupported_reason(layer, params):
                            unsupported += 1
                            continue
                        jobs.append(Job(impl.name, layer, target, params, label=(
                            f"{impl.name} {set_name}/{layer.name} b{layer.batch} {target}")))
    return jobs, unsupported


def _main(argv, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    jobs, unsupported = plan(args)
    from convbench.build import cache, toolchain
    from convbench.base.progress import Progress
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
        finally:  # on Ctrl-C: cancel the builds not started (run_main reports it, 130)
            builds.close()
    print(f"done in {time.perf_counter() - t0:.0f}s: {counts['built']} built, "
          f"{counts['cached']} already cached, {counts['failed']} failed")
    for desc, message in failures:
        print(f"  FAILED {desc}: {message}")
    return 1 if failures else 0


def main(argv=None, prog: str = PROG) -> int:
    """Fill the cache as ``argv`` asks; the exit status (1: a build failed, 2: bad input)."""
    return run_main(prog, lambda a: _main(a, prog), argv)
