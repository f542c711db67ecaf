"""``directConvNDHWCdotBwdData``: dL/dx on NDHWC with the dot-product kernel of
``directConvNDHWCdot``, for stride 1.

Like ``directConvNDHWCblockedBwdData`` it runs the forward kernel on the transposed layer
(dL/dy padded by ``k - 1 - p``, the filter flipped in space with its channels swapped),
but vectorised over the reduction channels (the layer's output channels ``K``) instead
of over the channels it writes.  That suits layers with few input channels, where a
vector of ``C`` channels would be mostly empty: CosmoFlow's first layers (C = 1 or 4)
reduce over K = 16 or 32 channels, one or two full vectors.  The filter is first copied
into the transposed layer's KTRSC order, so the kernel reads it as the forward one does.
"""

from convbench.registry import Implementation, Layout, Pass, register
from impls._blocked import channel_tiles_outer, cpu_schedule, generated_program
from impls._common import layer_constants
from impls._transposed import supports, swap_roles, transposed_layer
from impls.direct_conv_ndhwc_dot import check_params_dot, dot_source, registers, tile_sizes
from impls.direct_conv_ndhwc_dot import PARAMS


def algorithm(layer, dtype, params):
    t = transposed_layer(layer)
    L = layer_constants(t, Layout.NDHWC)
    db, hb, wb, kt, cv = tile_sizes(t, params)
    k_outer = channel_tiles_outer(t, params["KOUTER"])
    source = dot_source(L, dtype.name, db, hb, wb, kt, cv, k_outer, flip=True)
    sdfg = generated_program(t, source,
                             "direct_dot", f"bwdd_{db}x{hb}x{wb}x{kt}x{cv}_{int(k_outer)}")
    return swap_roles(sdfg)


register(Implementation(
    name="directConvNDHWCdotBwdData",
    search_space="PIX=4,6;KT=1,4",
    summary="backward data on NDHWC for the CPU (stride 1): the dot-product forward kernel "
            "(vectorised over the reduction channels K) on dL/dy, filter flipped and "
            "transposed first; for layers with few input channels",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=algorithm,
    schedules={"cpu": cpu_schedule},
    params=PARAMS,
    check_params=check_params_dot,
    supports=supports,
    constraints="stride 1, padding at most kernel - 1",
    anisotropic_pad=True,
    registers=lambda layer, params: registers(transposed_layer(layer), params),
))
