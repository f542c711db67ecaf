#!/usr/bin/env python3
"""The GPU campaign in one command (see README, "Running on an offline GPU node").

    python scripts/gpu_campaign.py pack [--tier core] [--wheels DIR]
    python scripts/gpu_campaign.py run --tier smoke|core|full [--out DIR] [--resume]
                                       [--target gpu|cpu] [--time-budget S] [--archive FILE]
    python scripts/gpu_campaign.py --dry-run --tier core        (or: run --dry-run ...)
    python scripts/gpu_campaign.py unpack FILE.tar.gz [--into results/gpu]

``pack`` fills the ignored folder ``.carry/`` with what the GPU host lacks (the Python
3.12 wheels of DaCe and numpy<2), checks that it fits the 64 MiB carry limit together
with the working tree, and prints the command to run there.  ``run`` runs the phases of
``convbench.campaign`` (identity, ceilings, builds, cases, tests, roofline, table) into
``--out``, writing each result as it comes; ``--target cpu`` rehearses the same
orchestration on the CPU, with three planted failures (a crash, a hang, a wrong result).
``unpack`` extracts a campaign archive brought back from the host into ``results/gpu/``.

Exit status: 0 when every phase ran (failed cases are results, recorded in the table),
3 when the time budget left work for ``--resume``, 2 for bad input.
"""

import sys


from convbench.campaign_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
