"""Index expressions of generated programs, folded before DaCe parses them.

The register-blocked generators write each index as the sum of its parts, for example
``x[b, (odb * 1 + 0) * 1 + kd - 1, ...]`` or ``w[0 * 32 + j, ...]``: readable next to
the code that made it, but DaCe 1.0.2's frontend turns every index into a symbolic
expression and matches it against its memlet patterns once per enclosing loop, and the
unfolded form costs it more there.  :func:`fold_indices` rewrites each subscript index
that is an integer-linear expression of names (``+``, ``-``, ``*`` by an integer
constant, unary minus) as its shortest form, ``odb + kd - 1`` and ``j``; anything
else (a call, ``//``, ``%``, a nested subscript) is left as it is.  The rewrite is
exact: integer arithmetic, the same value for every value of the names.

Measured on the generated forward kernel of MLPerf CosmoFlow conv1 at 32^3 and batch 2
(AMD EPYC f25m17): DaCe's parse and simplification 11.4 s unfolded, 8.1 s folded; the
C++ it generates is the same but for the order of two reads inside a few tasklets.
Lines keep their numbers (DaCe names tasklets after them), so the generated code's
names do not change either.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

#: A linear form: coefficient per name, in order of first appearance; the constant at "".
Linear = Dict[str, int]


def fold_indices(source: str) -> str:
    """``source`` (Python text) with every subscript index that is an integer-linear
    expression of names written in its shortest form (see the module's description)."""
    edits: Dict[int, List[Tuple[int, int, str]]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Subscript):
            continue
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            if not isinstance(part, (ast.BinOp, ast.UnaryOp)) or part.lineno != part.end_lineno:
                continue
            form = _linear(part)
            if form is not None:
                edits.setdefault(part.lineno, []).append(
                    (part.col_offset, part.end_col_offset, _format(form)))
    if not edits:
        return source
    lines = source.split("\n")
    for lineno, spans in edits.items():
        line = lines[lineno - 1].encode()  # ast's columns count bytes
        for start, end, text in sorted(spans, reverse=True):
            line = line[:start] + text.encode() + line[end:]
        lines[lineno - 1] = line.decode()
    return "\n".join(lines)


def _linear(node: ast.AST) -> Optional[Linear]:
    """The linear form of ``node``, or None where it is not integer-linear in names."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {"": node.value}
    if isinstance(node, ast.Name):
        return {node.id: 1}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        form = _linear(node.operand)
        return None if form is None else _scaled(form, -1 if isinstance(node.op, ast.USub) else 1)
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _linear(node.left), _linear(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, (ast.Add, ast.Sub)):
        sign = 1 if isinstance(node.op, ast.Add) else -1
        out = dict(left)
        for name, coeff in right.items():
            out[name] = out.get(name, 0) + sign * coeff
        return out
    if isinstance(node.op, ast.Mult):
        for a, b in ((left, right), (right, left)):
            if set(b) <= {""}:  # a constant factor
                return _scaled(a, b.get("", 0))
    return None


def _scaled(form: Linear, factor: int) -> Linear:
    return {name: coeff * factor for name, coeff in form.items()}


def _format(form: Linear) -> str:
    """``form`` as Python text: the names in order of first appearance, then the constant."""
    terms = [(name, coeff) for name, coeff in form.items() if name and coeff]
    text = ""
    for name, coeff in terms:
        size = abs(coeff)
        term = name if size == 1 else f"{size} * {name}"
        text = (f"-{term}" if coeff < 0 else term) if not text else \
            f"{text} {'-' if coeff < 0 else '+'} {term}"
    const = form.get("", 0)
    if not text:
        return str(const)
    return f"{text} {'-' if const < 0 else '+'} {abs(const)}" if const else text
