#!/usr/bin/env python3
"""Per-layer DaCe/torch ratios of the CPU bench next to the network's (docs/benchmarking.md).

The tool is :mod:`convbench.commands.bench_vs_network` (also ``convbench
bench-vs-network``); see ``--help``.
"""

import sys

from convbench.commands.bench_vs_network import main

if __name__ == "__main__":
    sys.exit(main())
