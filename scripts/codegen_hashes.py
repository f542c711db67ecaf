#!/usr/bin/env python3
"""The digests of every implementation's generated code against the committed ones.

The tool is :mod:`convbench.commands.codegen_hashes` (also ``convbench codegen-hashes``);
see ``--help``.
"""

import sys

from convbench.commands.codegen_hashes import main

if __name__ == "__main__":
    sys.exit(main())
