#!/usr/bin/env python3
"""Validate the profiler's timer against DaCe's own instrumentation, and measure the
spread of medians across repeated rounds.

The tool is :mod:`convbench.commands.validate_timing` (also ``convbench validate-timing``);
see ``--help``.
"""

import sys

from convbench.commands.validate_timing import main

if __name__ == "__main__":
    sys.exit(main())
