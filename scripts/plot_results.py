#!/usr/bin/env python3
"""Regenerate the plots of profiler run directories from their files.

The tool is :mod:`convbench.commands.plot` (also ``convbench plot``); see ``--help``.
With ``--outdir DIR`` and several run directories, each one's plots go to
DIR/<name of RUN_DIR>.  All run directories are read before anything is drawn, so bad
input writes no plot.
"""

import sys

from convbench.commands.plot import main

if __name__ == "__main__":
    sys.exit(main())
