"""Precisions: what a build stores, what it sums in, and how its products round.

A :class:`DType` is resolved once from ``--dtype`` and ``--math`` (:func:`get_dtype`) and
passed along the pipeline: the build (its storage type, in the cache key), the inputs
(rounded to the storage type before the float64 truth is computed, so the truth is
exact for the numbers the kernel sees), the tolerance (:meth:`DType.rounding`), the
references and the result files (:attr:`DType.label`).

* ``float32``: float32 storage and sums.
* ``float16``, ``bfloat16``: 16-bit storage, float32 sums.  The kernels widen each
  operand to float32 before multiplying (the product of two 16-bit numbers is exact in
  float32) and round once, to nearest even, when they store the result.  The C++ types
  are in ``convkernels/include/halfprec.h``.
* ``--math tf32`` (float32 only): the operands of each product are rounded to TF32
  (10 significand bits) first, as the GPU's tensor cores do.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, Dict, Optional

from convbench.base.errors import UsageError
# The C++ storage types of the 16-bit precisions (and their header) are the kernels'.
from convkernels.halfprec import CTYPES, HEADER  # noqa: F401


#: Unit roundoff (half the distance from 1 to the next number) per format.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                 "tf32": 2.0 ** -11}

#: Half the smallest positive (subnormal) number per storage format: the absolute error
#: of rounding a result that small.  float32's is far below what its sums round to.
SUBNORMAL_HALF_STEP = {"float32": 0.0, "float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}


MATH_MODES = ("ieee", "tf32")


@dataclasses.dataclass(frozen=True)
class Rounding:
    """What the verification's tolerance needs to know about a precision."""

    #: Unit roundoff of the sums (the ``sqrt(L) u`` term of :mod:`convbench.check.verify`).
    accumulate: float
    #: Unit roundoff of the final store, where it is coarser than the sums (else 0).
    output: float = 0.0
    #: Unit roundoff of each product's operands inside the kernel (TF32), else 0.
    operands: float = 0.0
    #: Absolute rounding error of a stored result in the subnormal range.
    tiny: float = 0.0


@dataclasses.dataclass(frozen=True)
class DType:
    """One precision: the storage type, the accumulation type and the math mode."""

    name: str
    math: str = "ieee"
    accumulate: str = "float32"

    @property
    def label(self) -> str:
        """How results and plots name the precision: ``float16``, ``float32-tf32``."""
        return self.name if self.math == "ieee" else f"{self.name}-{self.math}"

    @property
    def half(self) -> bool:
        """True for 16-bit storage (the types of ``halfprec.h``)."""
        return self.name in CTYPES

    @property
    def unit_roundoff(self) -> float:
        """Unit roundoff of the sums (float32 for every precision here)."""
        return UNIT_ROUNDOFF[self.accumulate]

    @property
    def rounding(self) -> Rounding:
        return Rounding(
            accumulate=self.unit_roundoff,
            output=UNIT_ROUNDOFF[self.name] if self.name != self.accumulate else 0.0,
            operands=UNIT_ROUNDOFF[self.math] if self.math != "ieee" else 0.0,
            tiny=SUBNORMAL_HALF_STEP[self.name])

    @property
    def dace(self):
        """The DaCe type of stored arrays: float32, or the 16-bit types of ``halfprec.h``
        (bit-compatible with torch's float16 and bfloat16 tensors; the compilers include
        ``halfprec.h`` first, see :func:`convbench.build.toolchain.dace_settings`)."""
        return _dace_storage(self.name)

    @property
    def acc_dace(self):
        """The DaCe type of accumulators."""
        import dace
        return getattr(dace, self.accumulate)

    @property
    def zero(self):
        """The accumulators' zero (a numpy scalar of the accumulation type)."""
        import numpy
        return getattr(numpy, self.accumulate)(0)

    @property
    def torch(self):
        """The torch dtype of the stored tensors."""
        import torch
        return getattr(torch, self.name)

    def describe(self) -> Dict[str, str]:
        """The precision as result metadata records it."""
        return {"dtype": self.name, "math": self.math, "accumulate": self.accumulate,
                "label": self.label}

    def key(self) -> Dict[str, Any]:
        """What the precision adds to a build's cache key: nothing for float32 (whose keys
        predate precisions), else the math mode and the header the build includes."""
        key: Dict[str, Any] = {}
        if self.math != "ieee":
            key["math"] = self.math
        if self.half:
            key["halfprec"] = header_digest()
        return key


@functools.lru_cache(maxsize=None)
def header_digest() -> str:
    return hashlib.sha256(HEADER.read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _dace_storage(name: str):
    import dace
    import numpy
    if name == "int8":  # DaCe's own is C's ``char``, which its CUDA code spells ``::char``
        t = dace.typeclass(numpy.int8)
        t.ctype = t.ctype_unaligned = "int8_t"
        return t
    if name not in CTYPES:
        return getattr(dace, name)
    # A 16-bit typeclass whose C++ type converts correctly.  numpy has no bfloat16, so
    # both wrap a 16-bit numpy type (ctypes and sizes follow it); DaCe compares
    # typeclasses by their C++ type, so neither is mistaken for DaCe's own.
    t = dace.typeclass(numpy.float16 if name == "float16" else numpy.uint16)
    t.ctype = t.ctype_unaligned = CTYPES[name]
    return t


DTYPES: Dict[str, DType] = {name: DType(name) for name in ("float32", "float16", "bfloat16")}
#: Int8 (:mod:`convbench.quant.int8`): uint8 activations and int8 filters with scales and
#: zero points, int32 sums.  Not a ``--dtype`` of the float pipeline, whose inputs,
#: tolerances and references are real numbers; the int8 builds are keyed by it.
INT8 = DType("int8", accumulate="int32")


def get_dtype(name, math: Optional[str] = None) -> DType:
    """The precision ``--dtype name --math math`` names, or a label such as
    ``float32-tf32`` (:attr:`DType.label`) names alone (a DType passes through)."""
    if isinstance(name, DType):
        if math not in (None, name.math):
            raise UsageError(f"--math: {math} conflicts with the precision {name.label}")
        return name
    if "-" in name and math is None:  # a label: "float32-tf32"
        name, math = name.split("-", 1)
    if name not in DTYPES:
        raise UsageError(f"--dtype: unknown precision '{name}' (known: {', '.join(DTYPES)})")
    math = math or "ieee"
    if math not in MATH_MODES:
        raise UsageError(f"--math: unknown mode '{math}' (known: {', '.join(MATH_MODES)})")
    if math == "tf32" and name != "float32":
        raise UsageError(f"--math tf32 applies to --dtype float32 only, not {name}")
    return DTYPES[name] if math == "ieee" else DType(name, math)


def check_device(dtype: DType, device: str) -> DType:
    """``dtype`` if ``device`` computes it, else a UsageError."""
    if dtype.math == "tf32" and device == "cpu":
        raise UsageError("--math tf32: the CPU has no TF32 arithmetic (use it with --device gpu)")
    return dtype


def from_args(args) -> DType:
    """The precision of ``--dtype`` and ``--math`` (:func:`convbench.commands.flags.add_precision_flags`)."""
    return get_dtype(getattr(args, "dtype", "float32"), getattr(args, "math", "ieee"))
