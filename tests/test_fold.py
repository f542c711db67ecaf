"""The folding of generated programs' index expressions (convkernels/fold.py): exact, and
only where it is integer-linear."""

import ast
import random

import pytest

from convkernels.fold import fold_indices


@pytest.mark.parametrize("before, after", [
    ("y = x[b, (odb * 1 + 0) * 1 + kd - 1, c]", "y = x[b, odb + kd - 1, c]"),
    ("wp[0, td, j] = w[0 * 32 + j, td]", "wp[0, td, j] = w[j, td]"),
    ("a[-(i - 2) * 3] = 0", "a[-3 * i + 6] = 0"),
    ("a[i - i + 4] = a[2 * (i + 1) - 2]", "a[4] = a[2 * i]"),
    ("acc[1, j] += x[(owb * 8 + 1) * 2 + 0, c] * wv0", "acc[1, j] += x[16 * owb + 2, c] * wv0"),
    # not integer-linear: left alone (an inner subscript is folded on its own)
    ("a[i // 2, i % 3, f(i + 0), i * j, b[i + 0] + 1]", "a[i // 2, i % 3, f(i + 0), i * j, b[i] + 1]"),
    ("a[i * 1.5, i + 0.0]", "a[i * 1.5, i + 0.0]"),
    ("for j in range(0 * 4 + 8):\n    y[j] = x[j * 1]", "for j in range(0 * 4 + 8):\n    y[j] = x[j]"),
])
def test_folds_exactly_what_is_linear(before, after):
    assert fold_indices(before) == after


def _expr(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(["i", "j", "k", str(rng.randint(-5, 9))])
    op = rng.choice(["+", "-", "*", "neg"])
    if op == "neg":
        return f"-({_expr(rng, depth - 1)})"
    if op == "*":  # a constant factor on one side: linear
        a, b = _expr(rng, depth - 1), str(rng.randint(-4, 4))
        return f"({a}) * {b}" if rng.random() < 0.5 else f"{b} * ({a})"
    return f"({_expr(rng, depth - 1)}) {op} ({_expr(rng, depth - 1)})"


def test_folded_indices_have_the_same_values():
    rng = random.Random(7)
    for _ in range(300):
        index = _expr(rng, 4)
        folded = fold_indices(f"a[{index}, 1]")
        inner = ast.parse(folded).body[0].value.slice.elts[0]
        for _ in range(5):
            env = {n: rng.randint(-20, 20) for n in "ijk"}
            assert eval(ast.unparse(inner), {}, env) == eval(index, {}, env), (index, folded)  # noqa: S307


def test_a_generated_kernel_keeps_its_lines_and_folds_once():
    """DaCe names tasklets after line numbers: folding keeps every line where it was."""
    from convkernels.layouts import Layout
    from convbench.registry import Layer
    from convkernels.cpu.direct.blocking import blocked_source
    from convkernels.layer import layer_constants
    layer = Layer("fold", 2, 5, 16, 5, 6, 7, 3, 3, 3, stride=2, pad=2)
    source = blocked_source(layer_constants(layer, Layout.NDHWC), "float32", 1, 1, 5, 8, False,
                            nv=2)
    folded = fold_indices(source)
    assert folded != source and folded.count("\n") == source.count("\n")
    assert fold_indices(folded) == folded
    assert "y[b, odb * 1 + 0, " in source and "y[b, odb, " in folded
