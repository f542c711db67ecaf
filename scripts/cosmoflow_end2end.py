#!/usr/bin/env python3
"""CosmoFlow end to end with DaCe convolutions: forward pass and training step against
torch, checked (``--check``) and timed per layer (``runtimebreakdown.png``).

The tool is :mod:`convbench.network.end2end` (also ``convbench end2end``); see ``--help`` and
docs/end2end.md.
"""

import sys


from convbench.network.end2end import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
