"""The CPU heap of a timed process: where torch's and DaCe's fresh outputs come from.

torch's CPU convolution allocates its output on every call, and so does a DaCe program
called from a network (:class:`convbench.network.cosmoflow.DaceConv`).  With glibc's defaults a
block of more than 32 MiB is always a fresh ``mmap``, given back with ``munmap`` when
freed, so every call of a large layer page-faults its whole output in again, which can
cost more than the convolution itself (docs/benchmarking.md has the measurement).  Such
a cost belongs to the allocator, not to either kernel, and it hits whichever side
allocates.

``warm`` (the default of every timed command on the CPU) keeps freed memory in the
process: no ``mmap`` for large blocks (``M_MMAP_MAX`` 0) and no trimming of the heap's
top (``M_TRIM_THRESHOLD`` 2 GiB, the largest it takes), so a block freed by one call
is reused, already mapped, by the next, as a caching allocator does (torch's on the
GPU; jemalloc or tcmalloc, which PyTorch's CPU tuning guide recommends).  ``system`` leaves the C
library's policy alone.  The policy holds inside timed sections (:func:`timed`) only:
between them, large temporaries (float64 ground truths) are mapped and unmapped as
usual and the heap is trimmed, so the process does not keep its high-water mark.
"""

import contextlib
import ctypes
import ctypes.util
from typing import Dict

WARM, SYSTEM = "warm", "system"
POLICIES = (WARM, SYSTEM)

# glibc's mallopt parameters (malloc.h) and their defaults.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_NO_TRIM = (1 << 31) - 1  # mallopt takes a C int: 2 GiB of free top is kept

_state: Dict[str, object] = {"policy": SYSTEM, "allocator": "", "reserved_bytes": 0,
                             "depth": 0}


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not all(hasattr(lib, f) for f in ("mallopt", "malloc_trim", "gnu_get_libc_version")):
        return None
    lib.gnu_get_libc_version.restype = ctypes.c_char_p
    return lib


def apply(policy: str = WARM) -> Dict[str, object]:
    """Choose the heap policy of this process's timed sections (:func:`timed`); return
    :func:`settings`.  ``warm`` without glibc records why it is unavailable."""
    if policy not in POLICIES:
        raise ValueError(f"heap policy {policy!r}: choose from {', '.join(POLICIES)}")
    if policy == WARM:
        lib = _libc()
        if lib is None:
            _state.update(policy=SYSTEM, allocator="not glibc: warm heap unavailable")
        else:
            _state.update(policy=WARM,
                          allocator=f"glibc {lib.gnu_get_libc_version().decode()}")
    else:
        _state["policy"] = SYSTEM
    return settings()


@contextlib.contextmanager
def timed():
    """A timed section: with the warm policy, freed memory stays in the heap inside it.
    On leaving the outermost one the C library's policy comes back and the free memory
    goes back to the system (``malloc_trim``), so that the untimed work between
    sections (ground truths, verification) does not pile up in the heap."""
    lib = _libc() if _state["policy"] == WARM else None
    if lib is None:
        yield
        return
    if _state["depth"] == 0 and not (lib.mallopt(_M_MMAP_MAX, 0) == 1 and
                                     lib.mallopt(_M_TRIM_THRESHOLD, _NO_TRIM) == 1):
        raise RuntimeError("mallopt refused the warm heap's settings")
    _state["depth"] = int(_state["depth"]) + 1
    try:
        yield
    finally:
        _state["depth"] = int(_state["depth"]) - 1
        if _state["depth"] == 0:
            lib.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
            lib.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
            lib.malloc_trim(0)
            _state["reserved_bytes"] = 0


def section(device: str):
    """:func:`timed` on the CPU; nothing on the GPU (device memory has torch's cache)."""
    return timed() if device == "cpu" else contextlib.nullcontext()


def reserve(nbytes: int) -> None:
    """Inside a warm timed section, map and touch ``nbytes`` once (then free them into
    the heap), so that the first timed calls do not pay the page faults of its growth."""
    if not _state["depth"] or _state["policy"] != WARM or \
            nbytes <= int(_state["reserved_bytes"]):
        return
    import torch
    block = torch.empty(nbytes // 4, dtype=torch.float32)
    block.fill_(0.0)
    del block
    _state["reserved_bytes"] = nbytes


def metadata(device: str) -> Dict[str, object]:
    """The ``heap`` entry of a timed run's metadata: :func:`settings` on the CPU, nothing
    on the GPU (device memory comes from torch's caching allocator)."""
    return {"heap": settings()} if device == "cpu" else {}


def settings() -> Dict[str, object]:
    """What the result metadata records: the policy of the timed sections, the allocator."""
    return {"policy": _state["policy"], "allocator": _state["allocator"] or "the C library's",
            "scope": "timed sections; the C library's policy, then malloc_trim, between them"}


def describe() -> str:
    """One line for the output of a timed command."""
    if _state["policy"] == WARM:
        return "warm heap (freed memory stays mapped and is reused: no page faults per call)"
    note = _state["allocator"]
    return "C library's heap (large blocks mapped anew on every call" + \
        (f"; {note}" if note else "") + ")"
