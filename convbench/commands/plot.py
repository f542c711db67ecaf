"""Redraw the plots of profiler result folders from their files (``convbench plot``,
``scripts/plot_results.py``)."""

import argparse
import sys
from pathlib import Path

from .. import plots

PROG = "plot_results.py"


def main(argv=None, prog: str = PROG) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
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
        print(f"{prog}: error: {' '.join(str(err).split()) or type(err).__name__}",
              file=sys.stderr)
        return 2
    return 0
