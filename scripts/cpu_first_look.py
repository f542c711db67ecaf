#!/usr/bin/env python3
"""A first look at CPU speed: wall time per implementation per layer, and torch's conv3d
on the same inputs for scale.

    python scripts/cpu_first_look.py [--paramscsv cosmoflow] [--batch 1] [--repeat 3]
                                     [--implementation NAME ...] [--out results/cpu/x.json]
    python scripts/cpu_first_look.py --table results/cpu/x.json [...]   # markdown, ms

The tool is :mod:`convbench.commands.first_look` (also ``convbench first-look``).
"""

import sys

from convbench.commands.first_look import main

if __name__ == "__main__":
    sys.exit(main())
