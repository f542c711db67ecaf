#!/usr/bin/env python3
"""Fill the build cache: implementations x layers x batches x targets, in parallel.

The tool is :mod:`convbench.commands.precompile` (also ``convbench precompile``); see
``--help``.
"""

import sys

from convbench.commands.precompile import main

if __name__ == "__main__":
    sys.exit(main())
