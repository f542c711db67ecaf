"""``implicitGemmWarpTiled``: implicit GEMM on NDHWC with CTA tiles, per-thread register
tiles and shared-memory staging.

For each K step of CTAtileK taps, the block stages its CTAtileM x CTAtileK slice of the
(gathered) input and CTAtileK x CTAtileN slice of the filter in shared memory; then
every thread accumulates the outer products of its threadTileM x threadTileN register
tile.  The accumulators stay in registers across all K steps.  The kernel: :mod:`convkernels.gpu.igemm`.
"""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu import igemm

register(Implementation(**igemm.warp_fields(
    name="implicitGemmWarpTiled",
    summary="implicit GEMM on NDHWC: CTA tiles, per-thread register tiles, A/B tiles "
            "staged in shared memory per K step",
    layout=Layout.NDHWC)))
