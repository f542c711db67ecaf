#!/usr/bin/env python3
"""Measure build times: CPU (g++/OpenMP) and GPU (nvcc, sm_90, compile only), per
implementation, for one layer of a layer set.

    python scripts/measure_builds.py [--paramscsv cosmoflow] [--layer 1] [--batch 1]
                                     [--targets cpu,gpu] [--repeat 1]

The tool is :mod:`convbench.commands.measure_builds` (also ``convbench measure-builds``).
"""

import sys

from convbench.commands.measure_builds import main

if __name__ == "__main__":
    sys.exit(main())
