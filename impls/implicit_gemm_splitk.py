"""``implicitGemmsplitK``: the warp-tiled NCDHW implicit GEMM with the reduction split
over ``nsplitK`` blocks.

K (= C * kd * kh * kw) is zero-padded to ``nsplitK`` equal chunks of whole CTAtileK
steps.  Block (s, m, n) reduces chunk s of its tile and stores the partial tile in a
buffer ``part[s]``; a second kernel sums the ``nsplitK`` partials of every output
element.  Every chunk is written on every call, so nothing depends on the buffer's
previous contents, and every reduction index lands in exactly one chunk (the original
work's split-K skipped or double-counted terms at K tails).  Splitting raises the
number of blocks for layers with few output pixels (the deep CosmoFlow layers).
"""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu import igemm

register(Implementation(**igemm.warp_fields(
    name="implicitGemmsplitK",
    summary="warp-tiled implicit GEMM on NCDHW, K split over nsplitK blocks into partial "
            "sums, then a reduction kernel",
    layout=Layout.NCDHW, split_k=True)))
