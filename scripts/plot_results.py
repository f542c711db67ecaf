#!/usr/bin/env python3
"""Regenerate the plots of profiler run directories from their files.

    python scripts/plot_results.py RUN_DIR [RUN_DIR ...] [--outdir DIR]

Each RUN_DIR holds ``samples.csv``, ``summary.csv`` and ``metadata.json``; the script
writes ``violin.png``, ``medians.png`` and ``roofline.png`` into RUN_DIR (or into DIR
with ``--outdir``; into DIR/<name of RUN_DIR> when several run directories are given)
and prints the paths written.  All run directories are read before anything is drawn:
bad input gets one line on stderr and exit status 2, and no plot is written.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convbench import plots

PROG = "plot_results.py"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directory with samples.csv, summary.csv and metadata.json")
    p.add_argument("--outdir", default=None, metavar="DIR",
                   help="write the plots here instead of into each run directory")
    args = p.parse_args(argv)
    try:
        runs = [plots.load_run(d) for d in args.run_dirs]
        if args.outdir is None:
            outdirs = [None] * len(runs)
        elif len(runs) == 1:
            outdirs = [Path(args.outdir)]
        else:
            names = [run.run_dir.resolve().name for run in runs]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"--outdir: several run directories are named "
                                 f"{', '.join(repr(n) for n in dups)}; plot them separately")
            outdirs = [Path(args.outdir) / n for n in names]
        for run, outdir in zip(runs, outdirs):
            for path in plots.plot_run(run, outdir):
                print(path)
    except (OSError, ValueError) as err:
        print(f"{PROG}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
