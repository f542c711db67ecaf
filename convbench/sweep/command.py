"""A verify or profile selection (implementations x layer sets x precisions) as jobs through
submitit, merged into one run folder (docs/sweep.md).

    convbench sweep profile --implementation implicitGemm,directConvNCDHW --pass fwd \\
        --paramscsv cosmoflow --executor local --outdir outputs/sweep1 --totaliter 20
    convbench sweep verify --pass fwd,bwd_data --executor slurm --partition gpu \\
        --gpus-per-node 1 --device gpu --outdir /scratch/me/sweep2 --no-wait
    convbench sweep --merge outputs/sweep1          # merge (and list) again by hand

Every other flag of ``convbench verify|profile`` (``--device``, ``--batch``,
``--currlayer``, timing flags, ``--cachedir``, ...) is given to every part.  Running the
same sweep into the same ``--outdir`` resumes it: finished parts are kept, the others run
again.  Exit status: 0 every part finished and passed, 1 a part failed or a check failed,
2 bad input or a result that cannot be written, 130 interrupted.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Dict, List

from convbench.commands import flags
from convbench.base.errors import (ArgumentParser, UsageError, check_at_least, check_choice,
                                   run_main)

PROG = "convbench sweep"


def build_parser(prog: str = PROG) -> ArgumentParser:
    from convbench.sweep.parts import EXECUTORS, MODES
    p = ArgumentParser(prog=prog, description=" ".join(__doc__.split("\n\n")[0].split()),
                       epilog="Any other "
                       "flag of convbench verify|profile is given to every part.")
    p.add_argument("mode", nargs="?", default=None, metavar="verify|profile",
                   help=f"what each part runs (one of {', '.join(MODES)}; not with --merge "
                   "or --campaign)")
    g = p.add_argument_group("selection (the cross product)")
    flags.add_implementation_flag(g, "default: every one of --pass with a schedule for "
                                  "--device", many=True)
    g.add_argument("--pass", dest="passes", action="append", default=None,
                   metavar="PASS,...", help="fwd, bwd_data, bwd_filter (repeatable, comma "
                   "lists; with --implementation: the implementations must compute one)")
    g.add_argument("--paramscsv", action="append", default=None, metavar="SET",
                   help="layer sets (repeatable; default cosmoflow)")
    g.add_argument("--dtype", action="append", default=None, metavar="DTYPE,...",
                   help="precisions (repeatable, comma lists; default float32)")
    g.add_argument("--campaign", default=None, metavar="TIER",
                   help="instead: the GPU campaign of this tier as one job (convbench "
                   "campaign run; its flags after --)")

    g = p.add_argument_group("jobs")
    g.add_argument("--executor", default="local", metavar="|".join(EXECUTORS),
                   help="local: processes on this machine; slurm: a job array through "
                   "sbatch; debug: in this process (default local)")
    g.add_argument("--array-parallelism", type=int, default=1, metavar="N",
                   help="jobs at a time (default 1: profile parts on one machine would time "
                   "each other)")
    g.add_argument("--time", type=int, default=240, metavar="MIN",
                   help="minutes a job may run before it is stopped (default 240)")
    g.add_argument("--partition", default=None, help="slurm partition")
    g.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                   help="GPUs per job (slurm; local: CUDA_VISIBLE_DEVICES)")
    g.add_argument("--cpus-per-task", type=int, default=None, metavar="N",
                   help="CPU cores per job (slurm)")
    g.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra #SBATCH --KEY=VALUE line (repeatable), e.g. account=proj1")
    g.add_argument("--setup", action="append", default=[], metavar="COMMAND",
                   help="a shell command each slurm job runs first (repeatable), e.g. "
                   "'module load cuda'")
    g.add_argument("--build-first", action="store_true",
                   help="a first job array fills the build cache; the second loads from it "
                   "(--require-precompiled)")
    g.add_argument("--no-wait", action="store_true",
                   help="slurm: submit and exit; a last job merges when the others end")

    g = p.add_argument_group("results")
    flags.add_outdir_flag(g, "outputs/sweep_<date>_<time>")
    g.add_argument("--merge", default=None, metavar="RUN",
                   help="merge the finished parts of the sweep in RUN again and list them")
    g.add_argument("--enableplots", action="store_true",
                   help="draw the plots of each merged profile folder")
    g.add_argument("--dry-run", action="store_true", help="list the parts and exit")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _split(values) -> List[str]:
    return [v.strip() for value in values or () for v in value.split(",") if v.strip()]


def _options(args):
    from convbench.sweep.parts import EXECUTORS
    from convbench.sweep.jobs import ExecutorOptions
    check_choice("--executor", args.executor, EXECUTORS, "executor")
    check_at_least(("--array-parallelism", args.array_parallelism, 1), ("--time", args.time, 1),
                   ("--gpus-per-node", args.gpus_per_node, 0),
                   ("--cpus-per-task", args.cpus_per_task, 1))
    extra: Dict[str, str] = {}
    for item in args.slurm:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--slurm: expected KEY=VALUE, got '{item}'")
        extra[key.strip()] = value
    slurm_only = [f for f, v in (("--partition", args.partition), ("--slurm", args.slurm),
                                 ("--setup", args.setup), ("--no-wait", args.no_wait),
                                 ("--cpus-per-task", args.cpus_per_task)) if v]
    if args.executor != "slurm" and slurm_only:
        raise UsageError(f"{slurm_only[0]}: only with --executor slurm")
    if args.executor == "slurm" and shutil.which("srun") is None:
        raise UsageError("--executor slurm: no srun on PATH (run the sweep on a Slurm login "
                         "node, or use --executor local)")
    return ExecutorOptions(args.executor, args.partition, args.gpus_per_node,
                           args.cpus_per_task, args.time, args.array_parallelism, extra,
                           list(args.setup))


def _implementations(args, rest) -> List[str]:
    """The implementations the selection names, or every one of --pass (for --device)."""
    from convbench import registry
    from convbench.commands.profile_conv3d import resolve_pass
    from convbench.experiment.pipeline import resolve_implementations
    names = flags.implementation_names(args.implementation)
    passes = [resolve_pass(p) for p in _split(args.passes)] or None
    if names is None:
        if passes is None:
            raise UsageError("give --implementation and/or --pass (the selection)")
        device = _device_flag(rest)
        names = [i.name for p in passes for i in resolve_implementations(
            None, p, device if device in ("cpu", "gpu") else None)]
        if not names:
            raise UsageError(f"--pass: no implementation of {', '.join(map(str, passes))} "
                             f"for --device {device}")
    elif passes is not None:
        for name in names:
            impl = registry.get(name)
            if impl.pass_ not in passes:
                raise UsageError(f"--implementation: {name} computes {impl.pass_}, not "
                                 f"{' or '.join(map(str, passes))}")
    return names


def _device_flag(rest: List[str]) -> str:
    for i, arg in enumerate(rest):
        if arg == "--device" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return "auto"


def _main(argv, prog: str = PROG) -> int:
    from convbench.sweep import parts as sweep
    argv = list(argv if argv is not None else [])
    campaign_args: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, campaign_args = argv[:cut], argv[cut + 1:]
    args, rest = build_parser(prog).parse_known_args(argv)
    from convbench.base.errors import check_paths
    check_paths(args)
    if args.merge is not None:
        if args.mode or rest or args.implementation or args.passes or args.campaign:
            raise UsageError("--merge RUN: give no selection with it (it merges what RUN holds)")
        return _merge(sweep.Sweep(args.merge), args.enableplots)
    opts = _options(args)
    if args.campaign is not None:
        if args.mode or args.implementation or args.passes or rest:
            raise UsageError("--campaign: give the campaign's flags after -- (not a mode, "
                             "a selection or verify/profile flags)")
        parts = [sweep.campaign_part(args.campaign, campaign_args)]
    else:
        if campaign_args:
            raise UsageError("--: only --campaign takes flags after --")
        if args.mode not in sweep.MODES:
            raise UsageError("give a mode first: convbench sweep verify|profile ... (or "
                             "--merge RUN, --campaign TIER)" + (
                                 f"; got '{args.mode}'" if args.mode else ""))
        if not {"--loadprecompiled", "--require-precompiled"} & set(rest):
            rest.append("--loadprecompiled")  # the jobs share one build cache
        if args.build_first and "--require-precompiled" not in rest:
            rest = [a for a in rest if a != "--loadprecompiled"] + ["--require-precompiled"]
        parts = sweep.plan(args.mode, _implementations(args, rest),
                           args.paramscsv or ["cosmoflow"], _split(args.dtype) or ["float32"],
                           rest)
    root = sweep.Sweep(args.outdir or os.path.join(
        "outputs", time.strftime("sweep_%Y%m%d_%H%M%S")))
    if args.dry_run:
        for part in parts:
            print(f"{part.id}: convbench {part.mode} {' '.join(part.argv)}")
        print(f"{len(parts)} part(s) into {root.root}/ (executor {opts.executor})")
        return 0
    root.create(parts, {"executor": opts.executor, "build_first": args.build_first,
                        "plots": args.enableplots})
    todo, alone, ended = root.review()
    for part, how, state in alone:
        print(f"{part.id}: left alone, " + (
            f"it may still run ({how}); it runs again once its job has ended"
            if state == sweep.RUNNING else f"its job is submitted and has not started it "
            f"({how}); it is submitted again only if that job ends first"), flush=True)
    for part, how, state in ended:
        print(f"{part.id}: its job ended before the part " + (
            "finished" if state == sweep.RUNNING else "started") + f" ({how}); it runs again",
            flush=True)
    kept = len(parts) - len(todo) - len(alone)
    print(f"sweep {root.root}/: {len(parts)} part(s), {kept} finished already, {len(todo)} "
          f"to run (executor {opts.executor}, {opts.array_parallelism} at a time)", flush=True)
    if todo:
        _run(root, todo, opts, args)
        if args.no_wait:
            return 0
    return _merge(root, args.enableplots)


def _run(root, todo, opts, args) -> None:
    from convbench.sweep import parts as sweep, jobs as sweep_jobs
    dependency = ""
    if args.build_first:
        builds = [p for p in todo if p.mode != "campaign"]
        print(f"builds: {len(builds)} job(s)", flush=True)
        jobs = sweep_jobs.submit(root, builds, opts, phase="build")
        if args.no_wait:
            dependency = "afterany:" + ":".join(sorted({str(j.job.job_id).split("_")[0]
                                                        for j in jobs}))
        else:
            sweep_jobs.wait(root, jobs, opts, report=lambda line: print("  build " + line,
                                                                  flush=True))
    jobs = sweep_jobs.submit(root, todo, opts, dependency=dependency)
    if args.no_wait:
        ids = sorted({str(j.job.job_id).split("_")[0] for j in jobs})
        merge = sweep_jobs.make_executor(root.logs_dir, opts, "convbench-merge",
                                    "afterany:" + ":".join(ids), light=True)
        merge_job = merge.submit(sweep.merge, str(root.root), args.enableplots)
        print(f"submitted job{' array' if len(jobs) > 1 else ''} {', '.join(ids)} "
              f"({len(jobs)} part(s)) and merge job {merge_job.job_id}; when they end: "
              f"convbench sweep --merge {root.root}")
        return
    sweep_jobs.wait(root, jobs, opts, report=lambda line: print(line, flush=True))


def _merge(root, plots: bool) -> int:
    from convbench.sweep import parts as sweep
    out = sweep.merge(root.root, plots=plots)
    states = out["states"]
    by_state: Dict[str, List[str]] = {}
    for part_id, status in states.items():
        by_state.setdefault(status.get("state", "?"), []).append(part_id)
    for state in (sweep.FAILED, sweep.RUNNING, sweep.SUBMITTED, "pending", sweep.REFUSED):
        for part_id in by_state.get(state, []):
            status = states[part_id]
            print(f"{state}: {part_id}: {status.get('error', '')}".rstrip(": ") + (
                f" (job {status.get('job_id')}, not started)" if state == sweep.SUBMITTED
                else ""))
            for log in status.get("logs", []):
                print(f"    log: {log}")
    for group, folder in out["groups"].items():
        print(f"merged: {folder}/")
    failed_checks = sum((s.get("counts") or {}).get("failed", 0)
                        + bool((s.get("counts") or {}).get("strict_failed"))
                        for s in states.values())
    unfinished = len(states) - len(by_state.get(sweep.COMPLETE, [])) - len(
        by_state.get(sweep.REFUSED, []))
    print(f"{len(by_state.get(sweep.COMPLETE, []))} of {len(states)} part(s) complete, "
          f"{len(by_state.get(sweep.REFUSED, []))} refused, {unfinished} to run again; "
          f"{failed_checks} failed check(s)" + (
              " (run the same sweep again to resume)" if unfinished else ""))
    return 1 if unfinished or failed_checks else 0
