#!/usr/bin/env python3
"""Verify and profile DaCe 3D-convolution implementations layer by layer.

A thin wrapper: the logic lives in :mod:`convbench.commands.profile_conv3d`.  Run with ``--help``.
"""

import sys


from convbench.commands.profile_conv3d import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
