#!/usr/bin/env python3
"""Validate the profiler's timer against DaCe's own instrumentation, and measure the
spread of medians across repeated rounds.

    python scripts/validate_timing.py [--implementation NAME] [--paramscsv SET]
                                      [--layer NAME ...] [--batch N] [--device cpu|gpu]
                                      [--rounds R] [--warmupiter W] [--totaliter T]
                                      [--out results/cpu/timing_validation.json]

The tool is :mod:`convbench.commands.validate_timing` (also ``convbench validate-timing``).
"""

import sys

from convbench.commands.validate_timing import main

if __name__ == "__main__":
    sys.exit(main())
