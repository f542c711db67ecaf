"""``implicitGemmTiledonly``: the implicit GEMM tiled into thread-block tiles.

Each thread block owns a CTAtileM x CTAtileN tile of the output (pixels x output
channels), each thread one output element, and each thread runs the whole reduction
as a sequential loop that reads the input and filter from global memory: no staging
buffers, no register tiles.  The baseline for the staged variants.  NDHWC layout; the
GEMM mapping and the tables are described in :mod:`convkernels.gpu.igemm`.
"""

from convbench.registry import ALL_PRECISIONS, Implementation, Layout, Pass, register
from convkernels.gpu import igemm, tiling

register(Implementation(
    name="implicitGemmTiledonly",
    summary="implicit GEMM on NDHWC, CTA tiles of M x N, one output per thread, "
            "sequential K loop from global memory",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=lambda layer, dtype, params: igemm.tiled_only(layer, Layout.NDHWC, dtype, params),
    schedules={t: igemm.tiled_only_schedule(t) for t in ("cpu", "gpu")},
    params=igemm.TILED_ONLY_PARAMS,
    check_params=igemm.check_tiled_only,
    supports=tiling.int32_offsets,
    constraints=tiling.INT32_CONSTRAINT,
    precisions=ALL_PRECISIONS,
))
