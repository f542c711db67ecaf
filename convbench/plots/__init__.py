"""Plots of run folders, drawn from their result files (:mod:`convbench.results.schema`) only.

:mod:`.reader` reads a run (no matplotlib there); each other module draws one PNG
(docs/profiling.md, "Result files"; :mod:`.breakdown` draws an end-to-end run's
``runtimebreakdown.png``), and :mod:`._style` holds what they share.  :func:`plot_run`
draws the three plots of a profiler run.  The plot functions are imported on first
use, so reading a run does not load matplotlib.
"""

import importlib
import warnings
from pathlib import Path
from typing import List, Union

# DaCe's CPU libraries are built with -ffast-math, whose start-up code turns on
# flush-to-zero for the whole process once one is loaded; numpy then warns, while
# matplotlib imports, that float32's smallest subnormal is zero.  Harmless here.
warnings.filterwarnings("ignore", message="The value of the smallest subnormal")

from convbench.base.files import make_folder  # noqa: E402
from convbench.results.schema import SAMPLE_COLUMNS  # noqa: E402
from .reader import RunData, Stats, load_run, read_breakdown, read_metadata  # noqa: E402

_PLOTS = {"plot_violin": "violin", "plot_medians": "medians", "plot_roofline": "roofline",
          "plot_breakdown": "breakdown"}
__all__ = ["SAMPLE_COLUMNS", "RunData", "Stats", "load_run", "plot_run", "read_breakdown",
           "read_metadata", *_PLOTS]


def __getattr__(name: str):
    if name not in _PLOTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PLOTS[name]}", __name__), name)
    globals()[name] = value
    return value


def plot_run(run_dir: Union[str, Path, RunData],
             outdir: Union[str, Path, None] = None) -> List[Path]:
    """Write ``violin.png``, ``medians.png`` and ``roofline.png`` of a run into ``outdir``
    (default: the run directory); returns their paths.  ``run_dir`` may be a loaded run."""
    from .medians import plot_medians
    from .roofline import plot_roofline
    from .violin import plot_violin
    run = run_dir if isinstance(run_dir, RunData) else load_run(run_dir)
    out = Path(outdir) if outdir is not None else run.run_dir
    make_folder(out)
    return [plot_violin(run, out / "violin.png"),
            plot_medians(run, out / "medians.png"),
            plot_roofline(run, out / "roofline.png")]
