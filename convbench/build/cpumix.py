"""The instruction mix of a CPU build's main loop, read from its machine code (``objdump``):
what ``convbench sass`` is for the GPU kernels, for the CPU kernels.

The main loop is the innermost loop (a backward jump with no other backward jump inside)
that holds the most instructions of the kind asked for (``vpdpbusd`` for the int8 kernel,
``vfmadd`` for the float32 ones).  Its instructions are counted by class: the products,
broadcasts, other loads (an instruction whose source is memory), stores, register moves
and the rest (address arithmetic, the loop's own compare and jump).  A product that reads
its operand from memory counts as a product and as a load.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Tuple

_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(?:\{[a-z0-9]+\}\s+)?(\S+)\s*(.*)$")  # {vex}: AVX-VNNI
_JUMP = re.compile(r"^j[a-z]*$")


def disassemble(library: Path) -> List[Tuple[int, str, str]]:
    """``(address, mnemonic, operands)`` of every instruction of ``library``."""
    if shutil.which("objdump") is None:
        raise RuntimeError("objdump is not on PATH (binutils)")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], check=True,
                          capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3).split("#")[0].strip()))
    return out


def _target(operands: str) -> Optional[int]:
    m = re.match(r"^([0-9a-f]+)\b", operands)
    return int(m.group(1), 16) if m else None


def loops(code: List[Tuple[int, str, str]]) -> List[Tuple[int, int]]:
    """The innermost loops, as ``(first, last)`` indices into ``code``."""
    index = {addr: i for i, (addr, _, _) in enumerate(code)}
    back = []
    for i, (addr, mnemonic, operands) in enumerate(code):
        target = _target(operands) if _JUMP.match(mnemonic) else None
        if target is not None and target <= addr and target in index:
            back.append((index[target], i))
    return [(a, b) for a, b in back
            if not any(a <= c and d < b and (c, d) != (a, b) for c, d in back)]


def classify(mnemonic: str, operands: str, product: str) -> List[str]:
    """The classes of one instruction (AT&T syntax: the destination is last)."""
    if mnemonic.startswith(("lea", "nop", "prefetch")):  # no access: address arithmetic
        return ["other"]
    memory = "(" in operands
    source_memory = memory and not operands.rstrip().endswith(")")
    if mnemonic.startswith(product):
        return ["product"] + (["load"] if memory else [])
    if "broadcast" in mnemonic:
        return ["broadcast"]
    if memory and not source_memory:
        return ["store"]
    if source_memory:
        return ["load"]
    if mnemonic.startswith(("vmov", "mov")):
        return ["move"]
    return ["other"]


def main_loop_mix(library: Path, product: str) -> Dict[str, int]:
    """The class counts of the main loop of ``library`` for products named ``product``
    (a mnemonic prefix), with ``instructions`` their total; empty where no loop has one."""
    code = disassemble(library)
    best: Dict[str, int] = {}
    for first, last in loops(code):
        counts: Dict[str, int] = {}
        for _, mnemonic, operands in code[first:last + 1]:
            for cls in classify(mnemonic, operands, product):
                counts[cls] = counts.get(cls, 0) + 1
        if counts.get("product", 0) > best.get("product", 0):
            best = dict(counts, instructions=last - first + 1)
    return best


def library_of(build) -> Path:
    """The shared library of a loaded or stored CPU build."""
    if build.library is not None:
        return Path(build.library)
    folder = Path(build.folder) / "build"
    found = sorted(p for p in folder.glob("lib*.so") if not p.name.startswith("libdacestub"))
    if not found:
        raise FileNotFoundError(f"no shared library in {folder}")
    return found[0]
