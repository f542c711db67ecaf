"""The result files of a run folder, declared once for their writer
(:mod:`convbench.results`) and their readers (:mod:`convbench.plots`).

docs/profiling.md, "Result files", describes the files and their columns.  ``backend`` is
:data:`DACE` for the implementation under test (named in ``implementation``) and the
reference's name otherwise.  End-to-end runs name their rows ``<phase>.<part>`` in the
``layer`` column (``train.conv2.bwd``, ``forward.total``).

This module imports nothing: both sides can use it without pulling in the other.
"""

SAMPLES = "samples.csv"
SUMMARY = "summary.csv"
METADATA = "metadata.json"

DACE = "dace"
#: The backend of torch's automatic mixed precision in end-to-end runs (16-bit types).
TORCH_AMP = "torch-amp"

# Lists, as the writer has always exported them; treat them as read-only.
SAMPLE_COLUMNS = ["layer_index", "layer", "implementation", "backend", "iteration", "time_ms"]
SUMMARY_COLUMNS = ["layer_index", "layer", "geometry", "batch", "implementation", "backend",
                   "samples", "median_ms", "q1_ms", "q3_ms", "iqr_ms", "iqr_over_median",
                   "noisy", "min_ms", "mean_ms", "gflop", "gflops", "mbytes", "bandwidth_gbs",
                   "intensity"]
#: The summary columns a reader needs; the others may be missing or empty.
SUMMARY_REQUIRED = ("layer_index", "layer", "backend", "median_ms")
#: Summary columns holding text; ``noisy`` is boolean, ``layer_index`` an integer and
#: every other column a number.
SUMMARY_TEXT = frozenset({"layer", "geometry", "implementation", "backend"})
_RATIO = "ratio_vs_"

#: ``metadata.json`` ``status``: while the run goes on, after it ended, after it stopped.
RUNNING, COMPLETE, INTERRUPTED = "running", "complete", "interrupted"


def ratio_column(reference: str) -> str:
    """The summary column of the median ratio to ``reference``."""
    return _RATIO + reference
