"""The SIMT main loop (FFMA, float32), in the shape of CUTLASS's SIMT kernels: per K step,
issue the next K tile's copies, compute the tile in the current stage from 128-bit shared
loads into each thread's register tile, and wait for the tile after it.

* **Stages.**  Step ``kt`` issues tile ``kt + stages - 1`` into the stage that step
  ``kt - 1`` computed from, computes tile ``kt`` from its stage, and waits until at most
  ``stages - 2`` groups of its copies are pending, so that tile ``kt + 1`` is complete;
  the block's barrier at the end of the step makes every thread's copies visible.
* **The FMA loop.**  For each 4 reduction values a thread loads its ``threadTileM`` rows
  of A and ``threadTileN`` columns of B as 128-bit vectors (``LDS.128``) and issues
  ``4 * threadTileM * threadTileN`` FMAs into its accumulators.  Its rows are ``ti + r *
  NTM`` and its columns ``tj + s * NTN``: a quarter warp reads 8 different rows (the
  padding puts them in different banks) and one column (a broadcast).

The filter gradient runs the same FMA loop on its own gathers
(:mod:`convkernels.gpu.simt.filter_gradient`).
"""

from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import gather
from convkernels.gpu.simt.tiles import Shape


def fma_loop(s: Shape) -> str:
    """C++ of the main loop's arithmetic, the part every pass shares: from stage ``cslot``
    of ``As_`` (rows of A, m-major) and ``Bs_`` (rows of B, n-major), per 4 reduction
    values this thread's ``threadTileM`` rows and ``threadTileN`` columns as 128-bit
    loads, then their FMAs into ``acc``.  A pass differs in its gathers (what it stages)
    and its epilogue (where it stores), not here."""
    body = []
    for r in range(s.RM):
        for c in range(s.RN):
            body.append(f"acc[{r * s.RN + c}] += av[{r}].{{q}} * bv[{c}].{{q}};")
    fmas = "\n        ".join(line.format(q=q) for q in "xyzw" for line in body)
    return f"""const float* a = As_ + cslot * {s.TM * s.TKP} + ti * {s.TKP};
const float* b = Bs_ + cslot * {s.TN * s.TKP} + tj * {s.TKP};
#pragma unroll
for (int k4 = 0; k4 < {s.TK}; k4 += 4) {{
    cb_f4 av[{s.RM}], bv[{s.RN}];
    #pragma unroll
    for (int r = 0; r < {s.RM}; ++r) av[r] = cb_ld4(a + r * {s.NTM * s.TKP} + k4);
    #pragma unroll
    for (int c = 0; c < {s.RN}; ++c) bv[c] = cb_ld4(b + c * {s.NTN * s.TKP} + k4);
    {{
        {fmas}
    }}
}}"""


def step_code(s: Shape, gpu: bool) -> str:
    """Step ``kt`` of the K loop: issue the next K tile, compute the K tile in stage
    ``cslot``, wait for the tile after it."""
    # split-K: step kt stages the slice's tile kt + stages - 1 (zeros past the slice)
    live = f"(int)kt + {s.S - 1} < tiles" if s.split else ""
    tiles = gather.slice_tiles(s) + "\n" if s.split else ""
    return f"""{gather.thread_code(s, gpu)}
{gather.load_state(s, writable=True)}
{tiles}{gather.stage_code(s, live)}
{{
    float* acc = acco + tp * {s.RM * s.RN};
{indent(fma_loop(s), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{gather.store_state(("kd", "kh", "kw", "c0", "sslot", "cslot"))}
cb_cp_wait<{s.S - 2}>();
"""
