"""The command line of ``scripts/gpu_campaign.py``: pack, run (and its dry run), unpack."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import List, Optional

from convbench import campaign
from convbench.tuning import gpuspace
from convbench.base.errors import ArgumentParser, UsageError, run_main
from convbench.commands.flags import add_cachedir_flag

PROG = "gpu_campaign.py"
#: The carry folder (ignored by .gitignore) and the device tool's limit on what travels.
CARRY = ".carry"
CARRY_LIMIT = 64 << 20
DEFAULT_WHEELS = Path("../shared/wheels/py312")
#: On the host: the wheels into /tmp/site, found first on PYTHONPATH, and the project
#: importable from the working tree.
HOST_SETUP = ("python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "
              f"{CARRY}/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1")


def build_parser():
    p = ArgumentParser(prog=PROG, description="A GPU campaign in one command: pack what the "
                       "offline host lacks, run identity, ceilings, builds, cases, GPU tests, "
                       "roofline and table into a results folder, rehearse it on the CPU.")
    p.add_argument("--dry-run", dest="top_dry_run", action="store_true",
                   help="print the plan of `run` (cases, builds, estimated host minutes per "
                   "phase and per call, the device-time budget) and exit")
    _run_flags(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="pack|run|unpack|space")

    pk = sub.add_parser("pack", help="fill .carry/ for the host and print the command to run")
    pk.add_argument("--wheels", default=str(DEFAULT_WHEELS), metavar="DIR",
                    help=f"the Python 3.12 wheels to carry (default {DEFAULT_WHEELS})")
    pk.add_argument("--tier", default="core", choices=campaign.TIERS,
                    help="the tier the printed command runs (default core)")
    pk.add_argument("--out", metavar="DIR",
                    help="the campaign folder the printed command writes (default "
                    "results/gpu/<date>_<device> on the host)")

    r = sub.add_parser("run", help="run (or --resume) a campaign")
    r.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    _run_flags(r, top=False)

    sp = sub.add_parser("space", help="here, without a GPU: compile every configuration of the "
                        "GPU tune space with nvcc, write its resource table and verdicts")
    sp.add_argument("--implementation", default=",".join(gpuspace.SPACES), metavar="NAME,...",
                    help=f"whose spaces (default: all, {', '.join(gpuspace.SPACES)})")
    sp.add_argument("--jobs", type=int, default=0, metavar="N",
                    help="nvcc processes at a time (default: one per core)")
    sp.add_argument("--out", default=str(gpuspace.DEFAULT_OUT), metavar="DIR",
                    help="where the table goes (default results/gpu/tune-space)")

    u = sub.add_parser("unpack", help="extract a campaign archive into results/gpu/")
    u.add_argument("archive", metavar="FILE.tar.gz")
    u.add_argument("--into", default="results/gpu", metavar="DIR",
                   help="where the campaign folder goes (default results/gpu)")
    return p


def _run_flags(p, top: bool) -> None:
    """``run``'s flags; at the top level (``--dry-run --tier T``) only those the dry run
    passes on to ``run``, without defaults."""
    p.add_argument("--tier", dest="top_tier" if top else "tier", default=None,
                   choices=campaign.TIERS,
                   help="smoke: one layer per implementation; core: every implementation on "
                   "representative layers plus the best-of set on all 12 CosmoFlow layers; "
                   "full: everything; tune: the GPU search spaces' best-ranked configurations "
                   "that passed `space` on all 12 layers, winners to tuned.json; precision: "
                   "the tensor-core kernels in their precisions; steps: the training step "
                   "alone in FP32 (with torch.compile), FP16 and BF16 (default smoke)")
    space_help = ("the tune tier's resource verdicts (space.json; default "
                  "results/gpu/tune-space/, from `space`)")
    if top:
        p.add_argument("--target", dest="top_target", help=argparse.SUPPRESS)
        p.add_argument("--space", dest="top_space", metavar="DIR", help=space_help)
        return
    p.add_argument("--target", default=None, metavar="gpu|cpu",
                   help="gpu (default), or cpu: the rehearsal, with CPU builds and torch as "
                   "the reference, and three planted failures")
    p.add_argument("--out", metavar="DIR",
                   help="campaign folder (default results/gpu/<date>_<device>; on the CPU "
                   "outputs/campaign/<date>_<cpu>)")
    p.add_argument("--resume", action="store_true",
                   help="go on with the campaign in --out: skip recorded cases and phases")
    add_cachedir_flag(p)
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="build processes (default: one per core)")
    p.add_argument("--iterations", type=int, default=None, metavar="N",
                   help="timed calls per backend and case (default 50; tune tier 20)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="untimed calls first (default 5; tune tier 3)")
    p.add_argument("--space", metavar="DIR", help=space_help)
    p.add_argument("--time-limit", type=float, default=2.0, metavar="S",
                   help="seconds of timing per backend and case, warm-up included (default 2)")
    p.add_argument("--case-timeout", type=float, default=0.0, metavar="S",
                   help="a case's limit, verification and timing (default 90 on the GPU, "
                   "120 on the CPU)")
    p.add_argument("--time-budget", type=float, metavar="S",
                   help="start no case or phase after S seconds; what is left waits for "
                   "--resume (exit status 3)")
    p.add_argument("--archive", metavar="FILE.tar.gz",
                   help="after every case, write the campaign folder as FILE.tar.gz (on the "
                   "device machine: $OUT/campaign.tar.gz, which comes back)")
    p.add_argument("--planted", dest="planted", action="store_true", default=None,
                   help="add the three planted cases (default on the CPU only)")
    p.add_argument("--no-planted", dest="planted", action="store_false")
    p.add_argument("--isolate", action="store_true",
                   help="a fresh worker process for every case (default: one worker until a "
                   "case does not verify)")
    p.add_argument("--events", default="auto", metavar="auto|cupy|torch",
                   help="CUDA events and DaCe's device arrays through CuPy or torch "
                   "(default auto: CuPy where it runs)")
    p.add_argument("--skip", default="", metavar="PHASE,...",
                   help=f"phases to leave out ({', '.join(campaign.PHASES)})")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads for DaCe and torch in the case workers")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def main(argv: Optional[List[str]] = None, prog: str = PROG) -> int:
    return run_main(prog, _main, argv)


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    top = {"--dry-run": args.top_dry_run or None, "--tier": args.top_tier,
           "--target": args.top_target, "--space": args.top_space}
    given = [flag for flag, value in top.items() if value is not None]
    if args.command is None:
        if not args.top_dry_run:
            raise UsageError("give a command: pack, run or unpack (or --dry-run --tier T)")
        # `--dry-run --tier core` at the top level: the plan of `run` with its defaults.
        args = parser.parse_args(["run", "--dry-run"] + [
            part for flag in ("--tier", "--target", "--space") if top[flag]
            for part in (flag, top[flag])])
    elif given and args.command != "run":
        raise UsageError(f"{', '.join(given)} before `{args.command}`: these are `run`'s "
                         f"options (give them after the command)")
    elif args.command == "run":
        # before `run` they mean what they mean after it (a subcommand's defaults would
        # otherwise replace them: `--dry-run --tier tune run` ran the smoke tier for real)
        args.dry_run = args.dry_run or args.top_dry_run
        for flag, dest in (("--tier", "tier"), ("--target", "target"), ("--space", "space")):
            if top[flag] is not None and getattr(args, dest) not in (None, top[flag]):
                raise UsageError(f"{flag} given twice, {top[flag]} before `run` and "
                                 f"{getattr(args, dest)} after it")
            if top[flag] is not None:
                setattr(args, dest, top[flag])
    if args.command == "run":
        args.tier = args.tier or "smoke"
        args.target = args.target or "gpu"
    if args.command == "pack":
        return pack(Path(args.wheels), args.tier, args.out)
    if args.command == "unpack":
        return unpack(Path(args.archive), Path(args.into))
    if args.command == "space":
        return compile_space(args.implementation, args.jobs, Path(args.out))
    options = campaign.Options(**{f.name: getattr(args, f.name)
                                  for f in dataclasses.fields(campaign.Options)})
    options.skip = tuple(s for s in args.skip.split(",") if s)
    campaign.check_options(options)
    if args.dry_run:
        print(campaign.format_plan(options, campaign.plan_cases(
            options.tier, options.target,
            options.target == "cpu" if options.planted is None else options.planted,
            options.space)))
        print("\n" + host_commands(options.tier, options.out))
        return 0
    return campaign.run_campaign(options)


def compile_space(names: str, jobs: int, out: Path) -> int:
    from convbench import registry
    from convbench.build import toolchain
    from convbench.base.errors import check_at_least
    check_at_least(("--jobs", jobs, 0))
    impls = [n.strip() for n in names.split(",") if n.strip()]
    for name in impls:
        registry.get(name)  # a usage error for an unknown name
        if name not in gpuspace.SPACES:
            raise UsageError(f"--implementation {name}: no GPU search space (those with one: "
                             f"{', '.join(gpuspace.SPACES)})")
    if shutil.which("nvcc") is None:
        raise UsageError("space: nvcc is not on PATH")
    from convbench.build import sass
    sass.require_tools()
    probes = gpuspace.compile_space(impls, jobs or (os.cpu_count() or 1), say=print)
    versions = toolchain.toolchain_versions("gpu")
    import dace
    info = {"nvcc": str(versions.get("nvcc", "?")), "DaCe": dace.__version__,
            "cuobjdump": sass.tool_version()}
    path = gpuspace.write_space(out, probes, info)
    refused = sum(1 for p in probes if p.reason)
    print(f"{len(probes)} compiled, {refused} refused; table in {path}")
    return 0


def host_commands(tier: str, out: Optional[str]) -> str:
    """The device-tool calls: the same command every time (``--resume`` makes the later
    ones go on), and the local step after each."""
    where = f" --out {shlex.quote(out)}" if out else ""
    run = (f"{HOST_SETUP} && python3 scripts/gpu_campaign.py run --tier {tier}{where} "
           "--resume --time-budget 500 --archive $OUT/campaign.tar.gz")
    into = Path(out).parent if out else Path("results/gpu")
    return "\n".join([
        "On the GPU host (device tool: run, carry [\".carry\"], timeout_s 600), as often as "
        "the plan has calls:",
        f"  {run}",
        "Here, after each call (the archive lands under the reply's files_at):",
        f"  python scripts/gpu_campaign.py unpack <files_at>/campaign.tar.gz --into {into}",
        "  (the unpacked folder travels with the next call; --resume skips what it holds)"])


def _tree_bytes(root: Path) -> int:
    """Bytes of what the device tool sends: tracked and untracked-not-ignored files."""
    try:
        names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], cwd=root, capture_output=True,
                               check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        raise UsageError("pack: run it inside the project's git checkout") from None
    files = (root / os.fsdecode(name) for name in names if name)
    return (sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())
            + _bytes_under(root / "shared"))


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def pack(wheels: Path, tier: str, out: Optional[str]) -> int:
    from convbench.build.toolchain import PROJECT_ROOT
    root = PROJECT_ROOT
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        raise UsageError(f"--wheels {wheels}: no .whl files there")
    names = {w.name.split("-")[0].lower() for w in found}
    missing = [n for n in ("dace", "numpy", "networkx") if n not in names]
    if missing:
        raise UsageError(f"--wheels {wheels}: no wheel of {', '.join(missing)}")
    dest = root / CARRY / "wheels"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for w in found:
        shutil.copy2(w, dest / w.name)
    if subprocess.run(["git", "check-ignore", "-q", CARRY], cwd=root).returncode != 0:
        raise UsageError(f"{CARRY}/ is not ignored by git here: add it to .gitignore")
    carried, tree = _bytes_under(root / CARRY), _tree_bytes(root)
    total = tree + carried
    print(f"packed {len(found)} wheels into {CARRY}/wheels ({carried / 2 ** 20:.1f} MiB); "
          f"working tree {tree / 2 ** 20:.1f} MiB; together {total / 2 ** 20:.1f} MiB of "
          f"{CARRY_LIMIT >> 20} MiB")
    if total > CARRY_LIMIT:
        print(f"{PROG}: error: {total / 2 ** 20:.1f} MiB is over the {CARRY_LIMIT >> 20} MiB "
              "limit of what travels; remove untracked files or carry fewer wheels")
        return 1
    print("\n" + host_commands(tier, out))
    return 0


def unpack(archive: Path, into: Path) -> int:
    if not archive.is_file():
        raise UsageError(f"unpack: no file {archive}")
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            tops = {Path(m.name).parts[0] for m in members if m.name}
            if len(tops) != 1 or any(Path(m.name).is_absolute() or ".." in Path(m.name).parts
                                     for m in members):
                raise UsageError(f"unpack: {archive} is not one campaign folder")
            into.mkdir(parents=True, exist_ok=True)
            tar.extractall(into, filter="data")
    except tarfile.TarError as err:
        raise UsageError(f"unpack: {archive}: {err}") from None
    folder = into / tops.pop()
    if into.name == "gpu":
        campaign.update_index(into)
    print(f"unpacked {folder}/ ({len(members)} entries); see {folder}/README.md")
    if (folder / "tuned.json").is_file():
        file_tuning(folder / "tuned.json")
    return 0


def _filed(data: dict) -> Optional[str]:
    """Why a campaign's ``tuned.json`` is not filed in ``tuning/gpu.json``, or None."""
    if data.get("target", "gpu") != "gpu":
        return f"a {data.get('target')} rehearsal's winners are not a GPU's"
    if not data.get("device"):
        return "no device named"
    return None


def file_tuning(path: Path) -> None:
    """The winners of a tune campaign into ``tuning/gpu.json``, under its device's name."""
    import json
    from convbench.build import tuned
    data = json.loads(path.read_text())
    why = _filed(data)
    if why:
        print(f"{path}: not filed in tuning/gpu.json ({why})")
        return
    device = data["device"]
    machine = {"gpu": device, "campaign": path.parent.name,
               "commit": str(data.get("git", {}).get("commit", ""))[:10]}
    count = 0
    for impl, layers in data.get("entries", {}).items():
        for layer_key, params in layers.items():
            target_file = tuned.store("gpu", impl, layer_key, params, machine, key=device)
            count += 1
    if count:
        print(f"filed {count} tuned entries of {device} in {target_file}")
