#!/usr/bin/env python3
"""CosmoFlow end to end with DaCe convolutions: forward pass and training step against
torch, checked (``--check``) and timed per layer (``runtimebreakdown.png``).

    python scripts/cosmoflow_end2end.py --device cpu --size 32 --batch 2 --iters 1 --train --check
    python scripts/cosmoflow_end2end.py --model v1 --size 64 --train --impl-map best.json

A thin wrapper: the logic lives in :mod:`convbench.end2end`.  Run with ``--help``.
"""

import sys


from convbench.end2end import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
