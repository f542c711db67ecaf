#!/usr/bin/env python3
"""The float32 error of 3D Winograd F(m^3, 3^3) against the direct sum, per channel count.

The tool is :mod:`convbench.commands.winograd_error` (also ``convbench winograd-error``);
see ``--help``.
"""

import sys

from convbench.commands.winograd_error import main

if __name__ == "__main__":
    sys.exit(main())
