#!/usr/bin/env python3
"""Parameter search for a CPU implementation: the fastest tile sizes per layer.

The tool is :mod:`convbench.commands.tune` (also ``convbench tune``); see ``--help``.
"""

import sys

from convbench.commands.tune import main

if __name__ == "__main__":
    sys.exit(main())
