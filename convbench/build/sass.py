"""The machine code of a GPU kernel (SASS), and what its main loop says, read on a host
without a GPU.

``cuobjdump -sass`` (PyPI: ``nvidia-cuda-cuobjdump``, with ``nvidia-cuda-nvdisasm``,
which it calls) disassembles the object file that nvcc writes for sm_90.  This module
finds those tools, parses the listing into functions and instructions, finds each
function's loops (a branch to an address before its own closes a loop whose body runs
from the target to the branch) and reads the **main loop**: the loop whose body
holds the most FMA-class instructions (FFMA, HFMA2, DFMA, HMMA and the other matrix
instructions), the innermost of those that tie.  A kernel with loops but no FMA in any is
read over its largest loop; one without a loop, over its whole body.

:class:`Reading` is what the loop says: its static instruction count, the share of FMAs,
shared-memory loads per FMA by width, global loads and ``LDGSTS`` (cp.async), integer and
predicate instructions per FMA, 64-bit multiplies (``IMAD.WIDE``), local-memory accesses
and barriers.  ``docs/sass.md`` says what each means and how to read a loop.  Counts are
of instructions in the listing, each once, whether it runs once per iteration or in a
branch that rarely runs: a static reading, not a profile.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from convbench.base.errors import UsageError

#: The PyPI packages that carry the disassembler (``make setup`` installs them).
PACKAGES = ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm")


# ---------------------------------------------------------------------------------------------
# The tools
# ---------------------------------------------------------------------------------------------

def _package_dirs() -> List[Path]:
    """The ``bin`` folders of NVIDIA's PyPI packages, where the tools are installed."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or ()) if spec else []
    return [Path(r) / sub / "bin" for r in roots
            for sub in ("cu13", "cuda_cuobjdump", "cuda_nvdisasm")]


@functools.lru_cache(maxsize=None)
def tool_dir() -> Optional[Path]:
    """A folder holding both ``cuobjdump`` and ``nvdisasm`` (cuobjdump runs nvdisasm to
    disassemble), or None: the PyPI packages first, then ``PATH``."""
    candidates = _package_dirs()
    found = shutil.which("cuobjdump")
    if found:
        candidates.append(Path(found).resolve().parent)
    for folder in candidates:
        if all(os.access(folder / t, os.X_OK) for t in ("cuobjdump", "nvdisasm")):
            return folder
    return None


def require_tools() -> Path:
    """:func:`tool_dir`, or a one-line error that says how to install the tools."""
    folder = tool_dir()
    if folder is None:
        raise UsageError("cuobjdump and nvdisasm are not installed: `make setup` installs "
                         f"them (PyPI: {', '.join(PACKAGES)})")
    return folder


def tool_version() -> str:
    """``cuobjdump``'s version line (``release 13.5, V13.5.37``), or ``unknown``."""
    folder = tool_dir()
    if folder is None:
        return "not installed"
    try:
        out = subprocess.run([str(folder / "cuobjdump"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    line = next((ln for ln in out.splitlines() if "release" in ln), "")
    return line.split(",", 1)[-1].strip() if line else "unknown"


def disassemble(obj: Path, timeout: float = 300.0) -> str:
    """The SASS listing of an object file, cubin or executable (``cuobjdump -sass``)."""
    folder = require_tools()
    env = dict(os.environ, NVDISASM_PATH=str(folder),
               PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([str(folder / "cuobjdump"), "-sass", str(obj)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {obj.name}: "
                           + (proc.stderr.strip().splitlines() or ["failed"])[0])
    return proc.stdout


# ---------------------------------------------------------------------------------------------
# The listing
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction: its address, guard predicate (``@!P0``, or empty), opcode with
    modifiers (``LDS.128``), and operands; ``target`` is a branch's destination."""

    address: int
    predicate: str
    opcode: str
    operands: str
    target: Optional[int] = None

    @property
    def base(self) -> str:
        """The opcode without modifiers (``LDS`` of ``LDS.U.128``)."""
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> Tuple[str, ...]:
        return tuple(self.opcode.split(".")[1:])


@dataclasses.dataclass
class Function:
    """One function of the listing: its C name (demangled) and its instructions."""

    name: str
    symbol: str
    instructions: List[Instruction]


def demangle(symbol: str) -> str:
    """The C name inside a mangled ``_Z<len><name>...`` symbol (DaCe's kernels are free
    functions), or the symbol as it is."""
    m = re.match(r"_Z(\d+)(\w+)", symbol)
    return m.group(2)[:int(m.group(1))] if m else symbol


_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+([^;/]*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L\w*):")
_NVDISASM_FUNCTION = re.compile(r"^\s*\.text\.(\S+):")
_BRANCH_TARGET = re.compile(r"(?:`\((\.L\w*)\)|(0x[0-9a-fA-F]+))")
#: Instructions that jump to an address given in their operands.
BRANCHES = frozenset({"BRA", "JMP", "BRX", "JMX", "CALL", "BSSY", "BREAK", "SSY", "PBK", "PCNT"})
_LOOPING = frozenset({"BRA", "JMP"})


def parse_listing(text: str) -> List[Function]:
    """The functions of a ``cuobjdump -sass`` listing (``nvdisasm``'s, with labels, too),
    in the order they appear."""
    functions: List[Function] = []
    labels: Dict[str, int] = {}
    pending: List[str] = []
    by_label: List[Tuple[int, str]] = []  # (index in the function, label) of branches

    def finish():
        if functions:
            fn = functions[-1]
            for i, label in by_label:
                if label in labels:
                    fn.instructions[i] = dataclasses.replace(fn.instructions[i],
                                                             target=labels[label])
    for line in text.splitlines():
        m = _FUNCTION.match(line) or _NVDISASM_FUNCTION.match(line)
        if m:
            finish()
            functions.append(Function(demangle(m.group(1)), m.group(1), []))
            labels, pending, by_label = {}, [], []
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTRUCTION.match(line)
        if not m or not functions:
            continue
        address = int(m.group(1), 16)
        labels.update((label, address) for label in pending)
        pending = []
        predicate, body = "", m.group(2).strip()
        if body.startswith("@"):
            predicate, _, body = body.partition(" ")
        opcode, _, operands = body.strip().partition(" ")
        if not opcode or opcode.startswith(".") or predicate == "@!PT":
            continue  # a directive, or an instruction that never runs (guarded by false)
        target = None
        if opcode.split(".", 1)[0] in BRANCHES:
            t = _BRANCH_TARGET.search(operands)
            if t and t.group(2):
                target = int(t.group(2), 16)
            elif t:
                by_label.append((len(functions[-1].instructions), t.group(1)))
        functions[-1].instructions.append(
            Instruction(address, predicate, opcode, operands.strip(), target))
    finish()
    return functions


@dataclasses.dataclass(frozen=True)
class Loop:
    """A loop: the instructions from a backward branch's target to the branch."""

    start: int
    end: int
    instructions: Tuple[Instruction, ...]


def loops(fn: Function) -> List[Loop]:
    """The loops of ``fn``, one per backward-branch target (several branches back to one
    target close one loop, up to the last of them), outermost first.  A branch to itself
    (the idle loop after ``EXIT``) is no loop."""
    ends: Dict[int, int] = {}
    for ins in fn.instructions:
        if ins.base in _LOOPING and ins.target is not None and ins.target < ins.address:
            ends[ins.target] = max(ends.get(ins.target, 0), ins.address)
    out = [Loop(start, end, tuple(i for i in fn.instructions
                                  if start <= i.address <= end and i.base != "NOP"))
           for start, end in ends.items()]
    out.sort(key=lambda lp: (lp.start, -lp.end))
    return out


# ---------------------------------------------------------------------------------------------
# What a loop says
# ---------------------------------------------------------------------------------------------

#: FMA-class instructions by the name the reading gives them: scalar FP32, packed FP16,
#: FP64, and the matrix (tensor-core) instructions.
FMA_KINDS: Mapping[str, frozenset] = {
    "FFMA": frozenset({"FFMA"}),
    "HFMA2": frozenset({"HFMA2"}),
    "DFMA": frozenset({"DFMA"}),
    "HMMA": frozenset({"HMMA", "HGMMA", "IMMA", "IGMMA", "DMMA", "QGMMA", "BMMA"}),
}
FMA_OPS = frozenset().union(*FMA_KINDS.values())
#: Integer arithmetic and logic (the U-prefixed uniform-datapath forms count too); moves
#: and selects do not.
INTEGER_OPS = frozenset({"IMAD", "IMUL", "IADD", "IADD3", "VIADD", "VIADDMNMX", "LOP", "LOP3",
                         "SHF", "SHL", "SHR", "LEA", "ISCADD", "IABS", "IMNMX", "VIMNMX",
                         "BMSK", "BREV", "FLO", "POPC", "PRMT", "SGXT", "IDP", "IMNMX"})
#: Instructions that compute or combine predicates.
PREDICATE_OPS = frozenset({"ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "PLOP3", "P2R", "R2P"})
#: Shared-memory load widths, as the reading names them: ``LDS`` is 32-bit, ``LDS.U16``
#: stands for every sub-word width (8 and 16 bits, signed or not), ``LDSM`` is ldmatrix.
LDS_WIDTHS = ("LDS", "LDS.64", "LDS.128", "LDSM", "LDS.U16")
_NARROW = {"U8", "S8", "U16", "S16"}


def is_move(ins: Instruction) -> bool:
    """Whether an instruction only moves a value: ``IMAD.MOV`` (a move on the integer
    pipe) and ``HFMA2.MMA Rd, -RZ, RZ, a, b`` (the compiler's way to load a constant)."""
    if ins.base == "IMAD" and "MOV" in ins.modifiers:
        return True
    return ins.base == "HFMA2" and re.match(r"\S+,\s*-RZ,\s*RZ\b", ins.operands) is not None


def _uniform(base: str) -> str:
    """``IADD3`` of ``UIADD3``: uniform-datapath instructions count as their kind."""
    if base.startswith("U") and base[1:] in INTEGER_OPS | PREDICATE_OPS:
        return base[1:]
    return base


def lds_width(ins: Instruction) -> Optional[str]:
    """Which of :data:`LDS_WIDTHS` a shared-memory load is, or None for anything else."""
    if ins.base == "LDSM":
        return "LDSM"
    if ins.base != "LDS":
        return None
    mods = set(ins.modifiers)
    if mods & _NARROW:
        return "LDS.U16"
    for width in ("128", "64"):
        if width in mods:
            return f"LDS.{width}"
    return "LDS"


@dataclasses.dataclass
class Reading:
    """What one kernel's main loop says (counts are static: instructions in the listing).

    ``loop`` names the loop read: ``0x0c00-0x2e70`` (its first and last address), or
    ``whole kernel`` where the kernel has no loop.  Ratios per FMA are None in a loop
    without FMA."""

    kernel: str
    loop: str = ""
    loops: int = 0
    instructions: int = 0
    fma: int = 0
    fma_kind: str = ""
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def fma_share(self) -> float:
        """FMA-class instructions over all the loop's instructions."""
        return self.fma / self.instructions if self.instructions else 0.0

    def per_fma(self, what: str) -> Optional[float]:
        return self.counts.get(what, 0) / self.fma if self.fma else None

    def row(self) -> Dict[str, object]:
        """The reading as the columns of :data:`COLUMNS`."""
        def ratio(what):
            v = self.per_fma(what)
            return "" if v is None else round(v, 3)
        return {"sass_loop": self.loop, "sass_loops": self.loops,
                "loop_instructions": self.instructions, "fma_kind": self.fma_kind,
                "fma": self.fma, "fma_share": round(self.fma_share, 3),
                **{_column(w): ratio(w) for w in LDS_WIDTHS},
                "sts": self.counts.get("STS", 0), "ldg": self.counts.get("LDG", 0),
                "ldgsts": self.counts.get("LDGSTS", 0), "int_per_fma": ratio("integer"),
                "pred_per_fma": ratio("predicate"), "imad_wide": self.counts.get("IMAD.WIDE", 0),
                "local": self.counts.get("local", 0), "barriers": self.counts.get("BAR", 0),
                "hgmma": self.counts.get("HGMMA", 0), "hgmma_ss": self.counts.get("HGMMA.ss", 0)}


def _column(width: str) -> str:
    return {"LDS": "lds32_per_fma", "LDS.64": "lds64_per_fma", "LDS.128": "lds128_per_fma",
            "LDSM": "ldsm_per_fma", "LDS.U16": "lds16_per_fma"}[width]


#: The columns of :meth:`Reading.row`, in order (the tune-space table and ``convbench
#: sass --csv`` carry them).
COLUMNS = ("sass_loop", "sass_loops", "loop_instructions", "fma_kind", "fma", "fma_share",
           *(_column(w) for w in LDS_WIDTHS), "sts", "ldg", "ldgsts", "int_per_fma",
           "pred_per_fma", "imad_wide", "local", "barriers", "hgmma", "hgmma_ss")


def count(instructions: Sequence[Instruction]) -> Dict[str, int]:
    """Per class, how many of ``instructions`` it holds: each FMA kind, each shared-load
    width, ``STS``, ``LDG`` (global and generic loads), ``LDGSTS``, ``integer``,
    ``predicate``, ``IMAD.WIDE``, ``local`` (``LDL``/``STL``), ``BAR``, ``HGMMA`` and
    ``HGMMA.ss`` (those reading A by descriptor too, not from registers) and ``move``
    (:func:`is_move`: counted there and nowhere else)."""
    out: Dict[str, int] = {}

    def add(key):
        out[key] = out.get(key, 0) + 1
    for ins in instructions:
        base = _uniform(ins.base)
        if is_move(ins):
            add("move")
            continue
        for kind, ops in FMA_KINDS.items():
            if ins.base in ops:
                add(kind)
        width = lds_width(ins)
        if width:
            add(width)
        if ins.base == "STS":
            add("STS")
        if ins.base in ("LDG", "LD"):
            add("LDG")
        if ins.base == "LDGSTS":
            add("LDGSTS")
        if base in INTEGER_OPS:
            add("integer")
            if base == "IMAD" and "WIDE" in ins.modifiers:
                add("IMAD.WIDE")
        if base in PREDICATE_OPS:
            add("predicate")
        if ins.base in ("LDL", "STL"):
            add("local")
        if ins.base == "BAR":
            add("BAR")
        if ins.base == "HGMMA":
            add("HGMMA")
            if re.match(r"\S+,\s*gdesc\[", ins.operands):  # A by descriptor too
                add("HGMMA.ss")
    return out


def main_loop(fn: Function) -> Tuple[Optional[Loop], int]:
    """``fn``'s main loop (None without a loop) and how many loops it has: the loop
    holding the most FMA-class instructions, the innermost (shortest) of those that tie;
    where no loop holds one, the largest loop."""
    found = loops(fn)
    if not found:
        return None, 0

    def fmas(lp):
        return sum(i.base in FMA_OPS and not is_move(i) for i in lp.instructions)
    return max(found, key=lambda lp: (fmas(lp), -len(lp.instructions) if fmas(lp)
                                      else len(lp.instructions))), len(found)


def read(fn: Function) -> Reading:
    """The :class:`Reading` of ``fn``'s main loop."""
    loop, n = main_loop(fn)
    body = loop.instructions if loop else tuple(i for i in fn.instructions if i.base != "NOP")
    counts = count(body)
    kinds = {k: counts.get(k, 0) for k in FMA_KINDS}
    fma = sum(kinds.values())
    kind = max(kinds, key=lambda k: kinds[k]) if fma else ""
    where = f"0x{loop.start:04x}-0x{loop.end:04x}" if loop else "whole kernel"
    return Reading(fn.name, where, n, len(body), fma, kind, counts)


def read_listing(text: str, names: Optional[Sequence[str]] = None) -> Dict[str, Reading]:
    """Per function of a listing (only ``names``, when given): its :class:`Reading`."""
    return {fn.name: read(fn) for fn in parse_listing(text)
            if names is None or fn.name in names}


def describe(r: Reading) -> str:
    """A reading as one line: ``loop 0x0c00-0x2e70 (1 of 1): 640 instructions, FFMA 46%,
    LDS 0.50/FMA, ...``."""
    if not r.instructions:
        return "no instructions"
    where = (f"loop {r.loop} ({r.loops} loop{'s' if r.loops != 1 else ''} in the kernel)"
             if r.loops else "no loop: the whole kernel")
    parts = [f"{where}: {r.instructions} instructions",
             f"{r.fma_kind or 'FMA'} {100 * r.fma_share:.0f}% ({r.fma})"]
    loads = [f"{w} {r.per_fma(w):.2f}" for w in LDS_WIDTHS if r.counts.get(w) and r.fma]
    loads += [f"{w} {r.counts[w]}" for w in LDS_WIDTHS if r.counts.get(w) and not r.fma]
    parts.append("shared loads per FMA: " + (", ".join(loads) if loads else "none")
                 if r.fma else "shared loads: " + (", ".join(loads) or "none"))
    return "; ".join(parts)


def weight(r: Reading) -> Tuple[int, int]:
    """How a kernel ranks as the one that does a build's work: the FMAs of its main loop
    where it has a loop, then the FMAs of its reading.  A kernel without a loop (a
    transform, a copy) is read over its whole body, which runs once per thread: it
    counts only where no kernel has a loop with FMAs."""
    return (r.fma if r.loops else 0, r.fma)


def main_reading(readings: Mapping[str, Reading]) -> Optional[Reading]:
    """Of several kernels' readings, the main kernel's (:func:`weight`), or None without
    any FMA."""
    best = max(readings.values(), key=weight, default=None)
    return best if best is not None and best.fma else None


def summary(reading: Optional[Reading]) -> Dict[str, object]:
    """What a campaign records of a build's main kernel (``builds.json``)."""
    if reading is None:
        return {"kernel": "", "fma_kind": "", "fma_share": 0.0, "loop_instructions": 0}
    return {"kernel": reading.kernel, "fma_kind": reading.fma_kind,
            "fma_share": round(reading.fma_share, 3),
            "loop_instructions": reading.instructions}
