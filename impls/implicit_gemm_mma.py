"""``implicitGemmMMA``: the tiled implicit GEMM on NDHWC with its inner product on tensor
cores, ``mma.sync`` with float32 sums: m16n8k16 on float16 or bfloat16 operands, m16n8k8
on TF32 operands (``--dtype float32 --math tf32``; see ``_mma.py``).  Its CPU schedule
keeps the warps, the lanes and the fragment layout and emulates each MMA from the
fragments, so CI verifies the indexing that runs on the GPU.
"""

from convbench.registry import Layout, Pass, register
from impls import _mma
from impls import _tiling as T


def algorithm(layer, dtype, params):
    return _mma.program(layer, Layout.NDHWC, dtype, params)


register(_mma.implementation(
    name="implicitGemmMMA",
    summary="implicit GEMM on NDHWC on tensor cores: mma.sync m16n8k16 (16-bit) or "
            "m16n8k8 (TF32) per warp tile, A and B staged in shared memory (CPU: the MMA "
            "emulated on the fragment layout)",
    pass_=Pass.FWD,
    algorithm=algorithm,
    supports=T.int32_offsets,
    constraints=T.INT32_CONSTRAINT,
))
