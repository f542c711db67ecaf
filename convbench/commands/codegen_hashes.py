"""The digests of the code DaCe generates for every implementation on a named set of layers
(:mod:`convbench.build.codegen`), against the committed ones or written anew.

    convbench codegen-hashes --check            # exit 1 and list what changed
    convbench codegen-hashes --write            # after a change meant to change code
    convbench codegen-hashes --check --dump DIR # the code itself too, to diff

Each CPU ISA has its own digests (``results/codegen/hashes_<isa>.json``); the default is
every ISA of this CPU that a file is committed for.  A change meant to leave the
kernels as they were (a move, a rename, a refactoring) must pass ``--check``; one meant to
change them is followed by ``--write`` in the same commit.
"""

import os
import subprocess
import sys
from pathlib import Path

from convbench.base.errors import ArgumentParser, UsageError, run_main
from convbench.build import codegen

PROG = "codegen_hashes.py"
#: Where the committed digests are.
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "results" / "codegen"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true",
                      help="compare with the committed digests; exit 1 if any differ")
    mode.add_argument("--write", action="store_true", help="write the digests anew")
    p.add_argument("--isa", default="", metavar="ISA,...",
                   help="CPU ISAs to generate for (default: those of this CPU with "
                        "committed digests; with --write, this CPU's widest and avx2)")
    p.add_argument("--implementation", default="", metavar="NAME,...",
                   help="only these implementations (default: all)")
    p.add_argument("--target", default="cpu,gpu", metavar="T,...",
                   help="only these targets (default: cpu,gpu)")
    p.add_argument("--first-precision", action="store_true",
                   help="only each implementation's first precision")
    p.add_argument("--layer", default="", metavar="NAME,...",
                   help="only these layers of the set (conv1_small, deep_s2, deep_noncubic, "
                        "conv1, conv5)")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help=f"the digests' folder (default {DEFAULT_DIR})")
    p.add_argument("--dump", default="", metavar="DIR",
                   help="also write the generated files, one folder per case")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes (default: one per core)")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _isas(args) -> list:
    from convkernels.cpu import isa
    info = isa.cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    mine = [i for i in isa.ISAS if i in flags]  # widest first
    if args.isa:
        chosen = [i.strip() for i in args.isa.split(",") if i.strip()]
        bad = [i for i in chosen if i not in mine]
        if bad:
            raise UsageError(f"--isa: this CPU cannot generate for {', '.join(bad)} "
                             f"(it has: {', '.join(mine) or 'none'})")
        return chosen
    if args.write:
        return sorted({mine[0], "avx2"} & set(mine)) if mine else []
    return [i for i in mine if codegen.hashes_file(args.dir, i).is_file()]


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    isas = _isas(args)
    if not isas:
        raise UsageError(f"no CPU ISA to generate for (committed: "
                         f"{', '.join(p.name for p in args.dir.glob('hashes_*.json')) or 'none'})")
    if len(isas) > 1 or not codegen.is_pinned(isas[0]):
        # the digests need a process that starts with the pinned environment, one per ISA
        status = 0
        for one in isas:
            rest = [a for a in (argv if argv is not None else sys.argv[1:])]
            cmd = [sys.executable, "-m", "convbench.commands.codegen_hashes", *rest,
                   "--isa", one]
            status |= subprocess.run(cmd, env=dict(os.environ, **codegen.pinned(one))).returncode
        return status
    return _one_isa(args, isas[0])


def _one_isa(args, isa: str) -> int:
    names = [n.strip() for n in args.implementation.split(",") if n.strip()] or None
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    layer_names = [n.strip() for n in args.layer.split(",") if n.strip()] or None
    todo = codegen.cases(names, targets, args.first_precision, layer_names)
    path = codegen.hashes_file(args.dir, isa)
    print(f"{len(todo)} cases, CPU ISA {isa}, {args.jobs} processes", flush=True)
    got = codegen.run(todo, isa, args.jobs, args.dump or None,
                      say=lambda line: print(line, flush=True))
    if args.write:
        whole = names is None and targets == ["cpu", "gpu"] and not args.first_precision \
            and layer_names is None
        if not whole and path.is_file():  # a partial run updates its cases only
            import json
            merged = json.loads(path.read_text())["cases"]
            merged.update(got)
            got = merged
        codegen.write(path, got, isa)
        print(f"wrote {path} ({len(got)} cases)")
        return 0
    if not path.is_file():
        raise UsageError(f"no committed digests for {isa}: {path}")
    import json
    expected = json.loads(path.read_text())["cases"]
    diff = codegen.compare(expected, got)
    for line in diff:
        print(line)
    print(f"{isa}: {len(got) - len(diff)} of {len(got)} cases as committed ({path.name})")
    if diff:
        print("the generated code changed; if that is meant, commit the output of "
              "`convbench codegen-hashes --write`")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
