#!/usr/bin/env python3
"""Stress test: one very large convolution layer, a DaCe implementation against torch.

The tool is :mod:`convbench.commands.stress` (also ``convbench stress``); see ``--help``
and docs/end2end.md, "Stress test".
"""

import sys

from convbench.commands.stress import main

if __name__ == "__main__":
    sys.exit(main())
