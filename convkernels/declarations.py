"""What a kernel declares about itself for the harness to read: the targets it schedules
for, the storage precisions it builds in, its tunable parameters (:class:`Param`) and
where it should win without a measurement (:class:`Rule`).

The harness's registry (``convbench.registry``) re-exports these and checks parameter
values against them; the kernel library only declares.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

#: The targets a kernel has schedules for.
TARGETS = ("cpu", "gpu")
#: Every storage precision, for kernels that widen their operands and sum in float32.
ALL_PRECISIONS = ("float32", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Param:
    """A tunable integer parameter of an implementation (a tile size, a split factor)."""

    name: str
    default: int
    help: str = ""
    #: ``check(value) -> None or a message`` for values outside the valid range.
    check: Optional[Callable[[int], Optional[str]]] = None
    minimum: int = 1


@dataclasses.dataclass(frozen=True)
class Rule:
    """Where an implementation should be the fastest of its pass on a target, without a
    measurement on the machine at hand: the harness's choice by rule where nothing was
    measured here.  ``applies(layer) -> bool`` on the layer (the forward geometry of every
    pass); of the implementations whose rule applies and which support the layer, the
    highest ``rank`` is chosen (a tie goes to the first registered).  ``name`` is printed
    with the choice, ``text`` says in words where it applies (``convbench list``)."""

    name: str
    text: str
    applies: Callable[[Any], bool]
    target: str = "cpu"
    rank: int = 1

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"rule {self.name}: unknown target {self.target!r}; known: {TARGETS}")
