#!/usr/bin/env python3
"""CPU benchmark: torch's conv3d against every DaCe forward implementation, per layer.

The tool is :mod:`convbench.commands.bench` (also ``convbench bench``); see ``--help``.
"""

import sys

from convbench.commands.bench import main

if __name__ == "__main__":
    sys.exit(main())
