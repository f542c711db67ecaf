#!/usr/bin/env python3
"""Measure build times: CPU (g++/OpenMP) and GPU (nvcc, sm_90, compile only), per
implementation, for one layer of a layer set.

The tool is :mod:`convbench.commands.measure_builds` (also ``convbench measure-builds``);
see ``--help``.
"""

import sys

from convbench.commands.measure_builds import main

if __name__ == "__main__":
    sys.exit(main())
