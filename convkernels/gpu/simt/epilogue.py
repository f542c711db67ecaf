"""The SIMT kernels' epilogue for the forward and the data gradient: each accumulator
stored to its output element, bounds-checked."""

from convkernels.gpu.simt import gather
from convkernels.gpu.simt.tiles import Shape
from convkernels.layouts import Layout


def epilogue_code(s: Shape, gpu: bool) -> str:
    """Store each accumulator to its output element."""
    plane = s.OD * s.OH * s.OW
    # split-K: into slice blk_z's partial, laid out as the output
    at = f"(int64_t)blk_z * {s.PS} + " if s.split else ""
    if s.layout == Layout.NDHWC:
        store = f"yo[{at}m * {s.K} + n] = acc[r * {s.RN} + c];"
    else:
        store = (f"{{ const int64_t b = m / {plane}; "
                 f"yo[{at}(b * {s.K} + n) * {plane} + (m - b * {plane})] = acc[r * {s.RN} + c]; }}")
    return f"""{gather.thread_code(s, gpu)}
const float* acc = acci + tp * {s.RM * s.RN};
#pragma unroll
for (int r = 0; r < {s.RM}; ++r) {{
    const int64_t m = (int64_t)blk_m + ti + r * {s.NTM};
    #pragma unroll
    for (int c = 0; c < {s.RN}; ++c) {{
        const int64_t n = (int64_t)blk_n + tj + c * {s.NTN};
        if (m < {s.GM} && n < {s.K}) {store}
    }}
}}
"""
