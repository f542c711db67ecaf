"""``implicitGemmNCDHW``: the warp-tiled implicit GEMM (``implicitGemmWarpTiled``) on the
NCDHW layout, the layout of PyTorch and of the CosmoFlow reference.  Only the index
tables differ from the NDHWC variant: neighbouring GEMM rows are neighbouring output
pixels, which are neighbouring input elements in NCDHW.  Default implementation of
``profile_conv3d.py``.
"""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu import igemm

register(Implementation(**igemm.warp_fields(
    name="implicitGemmNCDHW",
    summary="warp-tiled implicit GEMM (register tiles, shared-memory staging) on NCDHW",
    layout=Layout.NCDHW,
    default_for=("cli",))))
