"""The timed part of an end-to-end run in fresh processes, one after the other: each runs
the same command with ``--timing-worker``, loads the builds the first process put in the
cache, times every model, and hands its samples back in a file.  Several processes show
the spread that one process cannot: campaigns saw DaCe medians move by up to 10% between
processes, vendors' by 2%."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence


def time_in_processes(argv: Sequence[str], count: int, outdir: Path,
                      phases: Sequence[str]) -> Dict[str, Dict[str, Dict[str, List[List[float]]]]]:
    """``samples[backend][phase][part]``: one list of milliseconds per process, from
    ``count`` processes of ``cosmoflow_end2end.py argv --timing-worker``."""
    out: Dict[str, Dict[str, Dict[str, List[List[float]]]]] = {}
    folder = Path(outdir) / ".processes"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"timing in {count} fresh processes, one after the other", flush=True)
    for k in range(count):
        path = folder / f"process_{k}.json"
        cmd = [sys.executable, "-m", "convbench.network.end2end", *argv,
               "--processes", "1", "--timing-worker", str(path)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
        if proc.returncode != 0 or not path.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"timing process {k + 1} failed (exit {proc.returncode}): "
                               + " | ".join(tail))
        run = json.loads(path.read_text())
        path.unlink()
        for backend, per in run.items():
            for phase, parts in per.items():
                for part, ms in parts.items():
                    out.setdefault(backend, {}).setdefault(phase, {}).setdefault(
                        part, []).append(ms)
        steps = ", ".join(f"{b} {statistics.median(run[b][phases[-1]]['total']):.1f}"
                          for b in run)
        print(f"  process {k + 1}/{count}: {phases[-1]} ms {steps} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    folder.rmdir()
    return out
