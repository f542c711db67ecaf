"""Tables as text: markdown for result files, aligned columns for the terminal."""

from typing import Iterable, Sequence


def markdown(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table; ``align`` has one letter per column, ``l`` or ``r`` (default:
    the first column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def aligned(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, the first left-aligned, a rule under the header."""
    rows = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    cells = [[r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
             for r in rows]
    cells.insert(1, ["-" * w for w in widths])
    return "\n".join("  ".join(r) for r in cells)
