#!/usr/bin/env python3
"""Fill the build cache: implementations x layers x batches x targets, in parallel.

    python scripts/precompile.py [--implementation NAME ...] [--paramscsv SET ...]
                                 [--batch N ...] [--target cpu|gpu ...] [--jobs J]
                                 [--cachedir DIR] [--force] [--dry-run]
                                 [--param NAME=VALUE ...]

See :mod:`convbench.commands.precompile` (and ``--help``).  Exit status 1 if any build
failed, 2 on bad input.
"""

import sys

from convbench.commands.precompile import main

if __name__ == "__main__":
    sys.exit(main())
