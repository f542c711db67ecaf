#!/usr/bin/env python3
"""Parameter search for a CPU implementation: the fastest tile sizes per layer.

    python scripts/tune_cpu.py [--implementation directConvNDHWCblocked]
                               [--paramscsv SET ...] [--batch 2] [--threads 2]
                               [--space "PIX=8,12,16,24;KOUTER=0,1"] [--samples 5]
                               [--store] [--out results/cpu/tuning_<impl>_b<B>.json]

The tool is :mod:`convbench.commands.tune` (also ``convbench tune``).
"""

import sys

from convbench.commands.tune import main

if __name__ == "__main__":
    sys.exit(main())
