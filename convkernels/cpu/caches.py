"""The CPU's caches and cores, read from the machine: what the CPU kernels' blockings are
derived from (the Winograd kernels' scratch and shared budgets, the int8 kernels'
blocks), recorded in every run's metadata.

**Where from.**  Linux's sysfs (``/sys/devices/system/cpu/cpu0/cache/index*/``: each
cache's level, type, size and the CPUs that share it) and the count of online CPUs.  Where
sysfs says nothing (another OS, a container that hides it), :data:`REFERENCE`: the caches
the blockings were first written for (a 2 MiB L2 per core, a 32 MiB last-level cache), and
``source`` says so.

**Overridden** by ``$CONVBENCH_CACHES`` (``l1d=48K,l2=2M,l3=105M``, any of them; K, M or G),
which pins the blockings of a build to a machine other than this one: the committed
codegen digests are generated with :data:`REFERENCE` (:func:`convbench.build.codegen.pinned`),
and the tests pin it too, so that neither depends on the machine they run on.
"""

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Dict, Optional

#: The caches the blockings were written for before they were read (bytes).
REFERENCE = {"l1d": 32 << 10, "l2": 2 << 20, "l3": 32 << 20}
ENV = "CONVBENCH_CACHES"
SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class CachesError(ValueError):
    """``$CONVBENCH_CACHES`` is not a list of sizes (the command line prints it on one
    line, status 2)."""

    exit_status = 2


@dataclasses.dataclass(frozen=True)
class Caches:
    """Bytes of the L1 data cache and the L2 of one core, the last-level cache (``l3``:
    the whole of it, however many cores share it), the cores that share it, and where the
    numbers came from (``sysfs``, ``$CONVBENCH_CACHES``, ``reference``)."""

    l1d: int
    l2: int
    l3: int
    l3_sharing: int
    source: str

    def describe(self) -> Dict[str, object]:
        """The metadata record (sizes in KiB)."""
        return {"l1d_kib": self.l1d >> 10, "l2_kib": self.l2 >> 10, "l3_kib": self.l3 >> 10,
                "l3_shared_by": self.l3_sharing, "source": self.source}


def parse_size(text: str) -> int:
    """Bytes of ``"48K"``, ``"2M"``, ``"1048576"`` (sysfs and ``$CONVBENCH_CACHES``)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise CachesError(f"not a size: {text!r} (a number with K, M or G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _cpu_count(text: str) -> int:
    """CPUs in a sysfs list such as ``0-3,8``."""
    n = 0
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return n


def read_sysfs(root: Path = SYSFS) -> Optional[Dict[str, int]]:
    """``{"l1d", "l2", "l3", "l3_sharing"}`` from a sysfs cache folder, or None where it
    lacks an L2 (the blockings need that one at least)."""
    found: Dict[str, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        name = "l1d" if level == 1 else f"l{min(level, 3)}"
        found[name] = size
        if level >= 3:
            try:
                found["l3_sharing"] = _cpu_count((index / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                pass
    return found if "l2" in found else None


def _override(text: str) -> Dict[str, int]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, _, value = item.partition("=")
        if key.strip() not in REFERENCE:
            raise CachesError(f"${ENV}: unknown cache {key.strip()!r} (known: l1d, l2, l3)")
        try:
            out[key.strip()] = parse_size(value)
        except CachesError as err:
            raise CachesError(f"${ENV}: {err}") from None
    return out


@functools.lru_cache(maxsize=None)
def _caches(env: Optional[str]) -> Caches:
    if env:
        given = _override(env)
        return Caches(given.get("l1d", REFERENCE["l1d"]), given.get("l2", REFERENCE["l2"]),
                      given.get("l3", REFERENCE["l3"]), 0, f"${ENV}")
    found = read_sysfs()
    if found is None:
        return Caches(REFERENCE["l1d"], REFERENCE["l2"], REFERENCE["l3"], 0, "reference")
    return Caches(found.get("l1d", REFERENCE["l1d"]), found["l2"],
                  found.get("l3", found["l2"]), found.get("l3_sharing", 0), "sysfs")


def caches() -> Caches:
    """This machine's caches (``$CONVBENCH_CACHES`` first; read once per value)."""
    return _caches(os.environ.get(ENV) or None)


def reference_setting() -> str:
    """``$CONVBENCH_CACHES`` for :data:`REFERENCE`."""
    return ",".join(f"{k}={v >> 10}K" for k, v in REFERENCE.items())
