#!/usr/bin/env python3
"""CPU benchmark: torch's conv3d against every DaCe forward implementation, per layer.

    python scripts/bench_cpu.py --paramscsv cosmoflow_mlperf --paramscsv cosmoflow --batch 2
                                [--impls NAME,...] [--warmup 2] [--samples 7] [--threads 2]
                                [--skip-slower 20] [--no-flush] [--outdir DIR] [--cachedir DIR]

The tool is :mod:`convbench.commands.bench` (also ``convbench bench``).
"""

import sys

from convbench.commands.bench import main

if __name__ == "__main__":
    sys.exit(main())
