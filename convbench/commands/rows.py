"""What the int8, sparse and tensor-core commands write besides their tables: a run's
metadata and rows as a CSV file (``convbench int8``, ``convbench sparse``,
:mod:`convbench.commands.tensorcore`)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List


def metadata(args, extra) -> Dict[str, object]:
    """The run's metadata (:func:`convbench.results.writer.run_metadata` for the CPU and
    ``args.threads``, the machine's id) with ``extra``."""
    from convbench.build.toolchain import PROJECT_ROOT
    from convbench.build.tuned import machine_id
    from convbench.results.writer import run_metadata
    return dict(run_metadata(PROJECT_ROOT, "cpu", args.threads), machine=machine_id("cpu"),
                **extra)


def write_csv(path: Path, rows: List[dict]) -> None:
    """``rows`` as a CSV file (every key a column, in order of first appearance), written
    as the result writer writes its tables (:func:`convbench.results.writer.csv_text`)."""
    from convbench.base.files import write_atomic
    from convbench.results.writer import csv_text
    if rows:
        write_atomic(path, csv_text(list(dict.fromkeys(k for row in rows for k in row)), rows))
