"""``implicitGemmPipelinedBwdData``: dL/dx on the pipelined main loop, NDHWC, stride 1.

dL/dx of a stride-1 layer is the forward convolution of dL/dy with the filter flipped in
space and its channel dimensions swapped (``transposed_layer``).  This is
``implicitGemmPipelined``'s program on that layer
(:mod:`convkernels.gpu.simt.data_gradient`); the flip and the swap happen in the filter's
gather, which reads the forward filter where it is (one
4-byte ``cp.async`` per value: its reduction channels are a whole filter apart)."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import data_gradient

register(Implementation(**data_gradient.fields(
    name="implicitGemmPipelinedBwdData",
    summary="backward data (stride 1) on the pipelined main loop, NDHWC: dL/dy through the "
            "forward's cp.async stages and LDS.128 fragments, the filter flipped as staged",
    layout=Layout.NDHWC, default_for=("network", "best-of"))))
