"""``implicitGemmMMABwdData``: dL/dx on tensor cores, for stride 1.

dL/dx of a stride-1 layer is the forward convolution of dL/dy with the filter flipped in
space and its channel dimensions swapped (``transposed_layer``, as
``directConvNDHWCblockedBwdData`` computes it).  This is ``implicitGemmMMA``'s program
(``_mma.py``) on that layer: the flip and the swap happen while the filter is copied
into the GEMM operand ``Bp``, which the forward program makes anyway, so they cost
nothing.  The CPU schedule emulates the MMAs on the fragment layout, as the forward's
does.
"""

import functools

from convbench.registry import Layout, Pass, register
from impls import _mma
from impls import _tiling as T
from impls._transposed import supports as flipped_supports
from impls._transposed import swap_roles, transposed_layer


def algorithm(layer, dtype, params):
    t = transposed_layer(layer)
    w_shape = (layer.out_channels, layer.k_d, layer.k_h, layer.k_w, layer.in_channels)
    sdfg = _mma.program(t, Layout.NDHWC, dtype, params, w_shape=w_shape,
                        filter_matrix=functools.partial(T.add_filter_matrix, flipped=True))
    return swap_roles(sdfg)


def supports(layer, params=None):
    return flipped_supports(layer, params) or T.int32_offsets(transposed_layer(layer))


register(_mma.implementation(
    name="implicitGemmMMABwdData",
    summary="backward data on tensor cores (stride 1): implicitGemmMMA on dL/dy with the "
            "filter flipped and its channels swapped while it is copied into the GEMM "
            "operand (CPU: the MMA emulated on the fragment layout)",
    pass_=Pass.BWD_DATA,
    algorithm=algorithm,
    supports=supports,
    constraints="stride 1, padding at most kernel - 1; " + T.INT32_CONSTRAINT,
))
