"""The case worker's entry point: ``python -m convbench.campaign worker DIR OPTIONS_JSON``."""

import sys

from .worker import worker_main

if len(sys.argv) == 4 and sys.argv[1] == "worker":
    sys.exit(worker_main(sys.argv[2], sys.argv[3]))
sys.exit("usage: python -m convbench.campaign worker DIR OPTIONS_JSON")
