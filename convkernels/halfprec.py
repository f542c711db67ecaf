"""The C++ storage types of the 16-bit precisions that generated kernels compute with
(``cb_half``, ``cb_bfloat16``: :data:`CTYPES`), and the header that defines them
(:data:`HEADER`), which the compilers include first in every 16-bit build."""

from pathlib import Path

#: The header of the 16-bit storage types.
HEADER = Path(__file__).resolve().parent / "include" / "halfprec.h"

#: The C++ type of each 16-bit storage format in generated code.
CTYPES = {"float16": "cb_half", "bfloat16": "cb_bfloat16"}
