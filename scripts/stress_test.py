#!/usr/bin/env python3
"""Stress test: one very large convolution layer, a DaCe implementation against torch.

    python scripts/stress_test.py [--implementation implicitGemm] [--device cpu|gpu|auto]
                                  [--size 256] [--in-channels 16] [--out-channels 32]
                                  [--batch 1] [--kernel 3] [--stride 1] [--pad 1]
                                  [--warmup 0] [--iters 3] [--threads N] [--seed S]
                                  [--param NAME=VALUE ...] [--cachedir DIR] [--rebuild]
                                  [--check] [--check-planes P] [--memory-limit GIB]
                                  [--skip-torch] [--no-flush] [--out FILE.json]

See :mod:`convbench.commands.stress` (and ``--help``).  Exit status 2 on bad input or a
layer that does not fit in memory, 1 if ``--check`` fails.
"""

import sys

from convbench.commands.stress import main

if __name__ == "__main__":
    sys.exit(main())
