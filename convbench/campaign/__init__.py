"""The GPU campaign: from "a GPU for a few minutes" to a committed results folder.

Its phases, tiers, files and CPU rehearsal are described in docs/gpu-campaign.md.  Every
result is written when it is known, so that a run cut off at its time limit loses only
what was in flight and ``--resume`` skips what is there.  A case worker that crashes,
overruns or does not verify its case is replaced, so that a corrupted CUDA context
cannot reach the next case.

The modules, by role: :mod:`.plan` (tiers, cases, the estimate), :mod:`.folder` (the
results folder and its state), :mod:`.phases` (identity, ceilings, builds, GPU tests,
roofline), :mod:`.worker` (the cases phase, parent and worker), :mod:`.report` (the
table and the index of results/gpu/), :mod:`.run` (options and the whole run), :mod:`.cli`
(the command line of ``scripts/gpu_campaign.py``) and :mod:`.ncu` (the roofline from Nsight
Compute's counters).
"""

from .folder import Folder
from .phases import identity
from .plan import (BUDGET_S, CALL_LIMIT_S, ORIGINAL_BATCH, PHASES, PLANTED, REPRESENTATIVE,
                   TIERS, Case, estimate, load_layers, measured_build_seconds, plan_cases)
from .report import INDEX_KEEP_MARKER, update_index
from .run import Options, check_options, format_plan, run_campaign

__all__ = ["BUDGET_S", "CALL_LIMIT_S", "Case", "Folder", "INDEX_KEEP_MARKER", "ORIGINAL_BATCH",
           "Options", "PHASES", "PLANTED", "REPRESENTATIVE", "TIERS", "check_options",
           "estimate", "format_plan", "identity", "load_layers", "measured_build_seconds",
           "plan_cases", "run_campaign", "update_index"]
