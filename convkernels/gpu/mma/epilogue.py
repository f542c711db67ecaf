"""The tensor-core kernels' epilogue: each lane's accumulators stored to their elements (the
forward's and the data gradient's output; the filter gradient's partials)."""

from convkernels.gpu.mma import gather
from convkernels.gpu.mma.tiles import Shape


def store_code(s, rows: int, cols: int, target: str) -> str:
    """C++ storing each accumulator of this lane to ``target`` (the C++ of its element,
    given its GEMM row ``m`` and column ``n``) where ``m < rows`` and ``n < cols``: lane
    ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and the next, of
    each MMA tile."""
    return f"""const {s.acc_t}* acc = acci + tp * {s.RR};
const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
for (int fm = 0; fm < {s.FM}; ++fm)
    #pragma unroll
    for (int i2 = 0; i2 < 2; ++i2) {{
        const int64_t m = (int64_t)blk_m + wm * {s.WM} + fm * 16 + g + 8 * i2;
        #pragma unroll
        for (int fn = 0; fn < {s.FN}; ++fn)
            #pragma unroll
            for (int i1 = 0; i1 < 2; ++i1) {{
                const int64_t n = (int64_t)blk_n + wn * {s.WN} + fn * 8 + 2 * t4 + i1;
                if (m < {rows} && n < {cols})
                    {target} = acc[(fm * {s.FN} + fn) * 4 + i2 * 2 + i1];
            }}
    }}
"""


def epilogue_code(s: Shape, gpu: bool) -> str:
    """Store each accumulator to its output element."""
    return f"{gather.thread_code(s, gpu)}\n" + store_code(s, s.GM, s.K, f"yo[m * {s.K} + n]")
