"""``implicitGemmNCDHWinplace``: the warp-tiled NCDHW implicit GEMM without copies in
front of it.  It reads the input and the filter where they are.

The kernel: :mod:`convkernels.gpu.igemm_inplace`.
"""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.gpu import igemm_inplace, igemm, tiling as T

register(Implementation(
    name="implicitGemmNCDHWinplace",
    summary="warp-tiled implicit GEMM on NCDHW that reads input and filter in place: "
            "borders by predicated loads, no padded copy, no filter matrix, no per-pixel tables",
    layout=Layout.NCDHW, pass_=Pass.FWD,
    algorithm=lambda layer, dtype, values: igemm_inplace.inplace(layer, dtype, values),
    schedules=igemm_inplace.SCHEDULES, params=igemm.TILE_PARAMS, check_params=igemm_inplace.check_tiles,
    supports=igemm_inplace.supports,
    constraints=T.INT32_CONSTRAINT + "; input extent plus padding at most 768 and padding at "
                "most 256 per dimension (packed coordinates)",
    default_for=("best-of",)))
