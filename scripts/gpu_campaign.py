#!/usr/bin/env python3
"""The GPU campaign in one command (see README, "Running on an offline GPU node").

The tool is :mod:`convbench.campaign.cli` (also ``convbench campaign``): ``pack``,
``run`` (and its ``--dry-run``) and ``unpack``; see ``--help``.  Exit status: 0 when
every phase ran (failed cases are results, recorded in the table), 3 when the time
budget left work for ``--resume``, 2 for bad input.
"""

import sys


from convbench.campaign.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
