#!/usr/bin/env python3
"""Regenerate the plots of profiler run directories from their files.

    python scripts/plot_results.py RUN_DIR [RUN_DIR ...] [--outdir DIR]

Each RUN_DIR holds ``samples.csv``, ``summary.csv`` and ``metadata.json``; the script
writes ``violin.png``, ``medians.png`` and ``roofline.png`` into RUN_DIR (or into DIR
with ``--outdir``; into DIR/<name of RUN_DIR> when several run directories are given)
and prints the paths written.  All run directories are read before anything is drawn:
bad input gets one line on stderr and exit status 2, and no plot is written.
The same as ``convbench plot``; the logic lives in :mod:`convbench.commands.plot`.
"""

import sys

from convbench.commands.plot import main

if __name__ == "__main__":
    sys.exit(main())
