#!/usr/bin/env python3
"""The verification's power per layer and pass (see docs/verification.md).

The tool is :mod:`convbench.commands.check_power` (also ``convbench check-power``); see
``--help``.  Exit status 1 when a verdict is wrong (a correct result fails, or a planted
one passes).
"""

import sys

from convbench.commands.check_power import main

if __name__ == "__main__":
    sys.exit(main())
