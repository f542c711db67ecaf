"""The SIMT data gradient (stride 1; ``implicitGemmPipelinedBwdData``,
``implicitGemmPipelinedNCDHWBwdData``): dL/dx is the forward convolution of dL/dy with the
filter flipped in space and its channel dimensions swapped (:mod:`convkernels.transposed`):
the forward program on ``transposed_layer``, whose filter gather reads the forward filter
where it is (``Shape.flip``)."""

from typing import Optional

import dace

from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.simt import forward, tiles
from convkernels.layer import Layer
from convkernels.layouts import Layout, Pass, stored_shape
from convkernels.transposed import supports as flipped_supports
from convkernels.transposed import swap_roles, transposed_layer


def filter_shape(layer: Layer, layout: Layout):
    """The forward filter as ``layout`` stores it (what a data gradient takes)."""
    return stored_shape(layout, "w", layer.filter_shape)


def program(layer: Layer, layout: Layout, dtype, params) -> dace.SDFG:
    """dL/dx of a stride-1 ``layer``: the pipelined forward program on
    ``transposed_layer(layer)`` reading dL/dy, with the filter flipped and its channels
    swapped as it is staged; x and y swap roles for the harness."""
    sdfg = forward.program(transposed_layer(layer), layout, dtype, params, flip=True,
                           w_shape=filter_shape(layer, layout))
    return swap_roles(sdfg)


def supports(layer: Layer, params) -> Optional[str]:
    """Why the data gradient does not handle ``layer``, or None."""
    return flipped_supports(layer, params) or tiles.supports(transposed_layer(layer), params)


def fields(**given):
    """What a pipelined data-gradient kernel (stride 1) registers with: ``given`` and the
    rest of the registry's ``Implementation`` fields."""
    layout = given["layout"]

    def kernel(layer, params):
        s = tiles.shape(transposed_layer(layer), layout, params, flip=True)
        return s, forward.code(s.split)
    return dict(
        pass_=Pass.BWD_DATA,
        algorithm=lambda layer, dtype, values: program(layer, layout, dtype, values),
        schedules={t: skeleton.schedule(t, layout, kernel) for t in ("cpu", "gpu")},
        params=forward.FORWARD_PARAMS, check_params=tiles.check_params, supports=supports,
        constraints="stride 1, padding at most kernel - 1; one image of dL/dy below 2^31 "
                    "elements", **given)
