"""The host CPU as the register-blocked kernels see it: its widest vector ISA, the floats
in one vector and the number of vector registers.

The CPU kernels (``convkernels/cpu/direct/blocking.py`` and the ``directConvNDHWC*``
implementations) size their micro-tiles from these: a channel vector is one vector of the
host (16 floats with AVX-512, 8 with AVX2), and a tile holds at most
:func:`accumulator_budget` accumulator vectors (the registers less a few for the loads).
Nothing here assumes a vector width: it is read from ``/proc/cpuinfo`` (the kernels are
compiled with ``-march=native`` for the same CPU).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Dict, Iterable, List

#: Vector ISAs, widest first, as /proc/cpuinfo names them.
ISAS = ("avx512f", "avx2", "avx", "sse4_2", "asimd", "neon")
#: Bits of one vector register per ISA ("scalar": none of them).
VECTOR_BITS = {"avx512f": 512, "avx2": 256, "avx": 256, "sse4_2": 128, "asimd": 128,
               "neon": 128, "scalar": 32}
#: Vector registers per ISA (x86-64 has 16 below AVX-512; AArch64 has 32).
VECTOR_REGISTERS = {"avx512f": 32, "asimd": 32}
#: Registers a micro-tile leaves for its operand loads and broadcasts.
LOAD_REGISTERS = 4


@functools.lru_cache(maxsize=None)
def cpuinfo() -> Dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    info: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def widest_of(flags: Iterable[str]) -> str:
    """The widest vector ISA among CPU ``flags`` ("scalar" for none)."""
    flags = set(flags)
    return next((isa for isa in ISAS if isa in flags), "scalar")


#: Caps the vector ISA the CPU kernels are built for below the host's widest (``avx2`` on
#: an AVX-512 host): the flags of wider ISAs are left out of :func:`cpu_flags`, so the
#: kernels' vector width, the machine's tuning key and the compiler's target all follow
#: (the builds get ``-mno-avx512f``).  To compare with torch on the same terms, cap it
#: too: ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``.
ISA_ENV = "CONVBENCH_ISA"


class IsaCapError(ValueError):
    """``$CONVBENCH_ISA`` names no ISA (the command line prints it on one line, status 2)."""

    exit_status = 2


def isa_cap() -> str:
    """The ISA ``$CONVBENCH_ISA`` caps this CPU at ("" for none); a name outside
    :data:`ISAS` raises :class:`IsaCapError`."""
    cap = os.environ.get(ISA_ENV, "").strip()
    if cap and cap not in ISAS:
        raise IsaCapError(f"${ISA_ENV}: unknown ISA {cap!r} (known: {', '.join(ISAS)})")
    return cap


def cpu_flags() -> List[str]:
    """This CPU's feature flags as ``/proc/cpuinfo`` names them (x86 ``flags``, Arm
    ``Features``), less those above :func:`isa_cap`."""
    info = cpuinfo()
    flags = (info.get("flags") or info.get("Features") or "").split()
    cap = isa_cap()
    if cap:
        wider = set(ISAS[:ISAS.index(cap)])
        flags = [f for f in flags if f not in wider
                 and not (f.startswith("avx512") and "avx512f" in wider)]
    return flags


def widest_isa() -> str:
    """This CPU's widest vector ISA (``avx512f``, ``avx2``, ... or ``scalar``)."""
    return widest_of(cpu_flags())


def has_feature(flag: str) -> bool:
    """Whether this CPU reports ``flag`` (``/proc/cpuinfo``'s name, e.g. ``avx512_bf16``)."""
    return flag in cpu_flags()


def vector_floats(isa: str = "") -> int:
    """float32 lanes of one vector of ``isa`` (default: this CPU's widest)."""
    return VECTOR_BITS[isa or widest_isa()] // 32


def vector_registers(isa: str = "") -> int:
    """Vector registers of ``isa`` (default: this CPU's widest)."""
    return VECTOR_REGISTERS.get(isa or widest_isa(), 16)


def accumulator_budget(isa: str = "") -> int:
    """How many accumulator vectors a micro-tile may hold without spilling: the
    registers less :data:`LOAD_REGISTERS` (28 with AVX-512, 12 with AVX2)."""
    return vector_registers(isa) - LOAD_REGISTERS


def registers_per_vector(width: int, isa: str = "") -> int:
    """Registers that a channel vector of ``width`` floats takes on ``isa``."""
    return math.ceil(width / vector_floats(isa))


def fit_pixels(pixels: int, vectors: int, isa: str = "") -> int:
    """The largest of ``pixels``, ``pixels / 2``, ... (at least 1) for which a tile of that
    many pixels x ``vectors`` one-register vectors stays within the budget: the default
    pixels per tile of the register-blocked kernels, which keep two channel vectors per
    broadcast (AVX-512: 8 x 2; AVX2: 4 x 2)."""
    while pixels > 1 and pixels * vectors > accumulator_budget(isa):
        pixels //= 2
    return pixels


def fit_tile(pixels: int, vectors: int, isa: str = "") -> int:
    """The largest of ``vectors``, ``vectors / 2``, ... (at least 1) for which a tile of
    ``pixels`` x that many one-register vectors stays within the budget: the default
    number of channel vectors per tile on this CPU (:func:`fit_pixels` with the roles
    swapped)."""
    return fit_pixels(vectors, pixels, isa)
