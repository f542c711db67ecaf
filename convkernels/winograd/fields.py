"""What every Winograd kernel (CPU and GPU) registers with: the forward error bound the
checks use, and the fields of the forward and the data-gradient registrations
(:func:`pass_fields`)."""

from convkernels.winograd import algebra
from convkernels.winograd.tiles import M_OUT, refusal


def tile_padded(layer, x, m: int = M_OUT):
    """``(x padded, extra)``: ``x`` (NCDHW) in float64 with the layer's padding at both
    ends, and ``extra`` = the zero planes past a cut-short last tile of ``m`` outputs
    (which the kernels read as zeros) added at the back of each dimension."""
    import torch
    (pd, ph, pw), (ed, eh, ew) = layer.pads, layer.pads_end
    od, oh, ow = extra = (-layer.out_d % m, -layer.out_h % m, -layer.out_w % m)
    return torch.nn.functional.pad(x.double(), (pw, ew + ow, ph, eh + oh, pd, ed + od)), extra


def forward_bound(layer, x, w, m: int = M_OUT, tol_factor: float = 0.0,
                  random_inputs: bool = False):
    """The bound of :func:`convkernels.winograd.algebra.error_bound` for the forward ``layer`` on
    ``x`` (unpadded, NCDHW) and ``w`` (K, C, 3, 3, 3), as a float64 tensor shaped like the
    output: the statistical one on random inputs (with ``tol_factor``), else the rigorous
    one.  Where ``m`` does not divide an output size, the kernel's last tile reads zeros
    past the input: the bound pads as many zero planes and crops."""
    import numpy as np
    import torch
    xp, _ = tile_padded(layer, x, m)
    bound = algebra.error_bound(xp.numpy(), w.double().numpy(), m, tol_factor=tol_factor or 0.0,
                                 random_inputs=random_inputs)
    bound = bound[:, :, :layer.out_d, :layer.out_h, :layer.out_w]
    return torch.from_numpy(np.ascontiguousarray(bound))


def pass_fields(pass_, program) -> dict:
    """The :class:`~convbench.registry.Implementation` fields that a Winograd kernel of
    ``pass_`` shares with the others: ``algorithm`` (``program(layer, L, params, flip=...,
    w_shape=...)`` on the layer, or for the data gradient on the transposed layer, the
    forward convolution of dL/dy with the filter flipped and its channels swapped where
    the filter transform reads it), ``supports``, ``constraints`` and ``error_bound``."""
    from convkernels.layouts import Pass
    fields = _forward_fields if Pass(pass_) == Pass.FWD else _data_gradient_fields
    return dict(fields(program), anisotropic_pad=True)


CONSTRAINTS = "3x3x3 kernels, stride 1, dilation 1, groups 1"


def ndhwc_algorithm(program):
    """A Winograd kernel's ``program(layer, L, params)`` as the registry's ``algorithm(layer,
    dtype, params)``: ``L`` the layer's sizes in NDHWC (the kernels compute in float32)."""
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants

    def algorithm(layer, dtype, params):
        return program(layer, layer_constants(layer, Layout.NDHWC), params)
    return algorithm


def _forward_fields(program) -> dict:
    algorithm = ndhwc_algorithm(program)

    def supports(layer, params=None):
        return refusal(layer) or None

    def error_bound(layer, inputs, tol_factor=None, random_inputs=False):
        return forward_bound(layer, inputs["x"], inputs["w"], tol_factor=tol_factor,
                             random_inputs=random_inputs)

    # the kernel reads zeros outside the input and tiles the output it is given, so
    # the padding at the back only sets the output size
    return dict(algorithm=algorithm, supports=supports, error_bound=error_bound,
                constraints=CONSTRAINTS, handles=("asymmetric padding",))


def _data_gradient_fields(program) -> dict:
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants
    from convkernels.transposed import supports as flipped_supports
    from convkernels.transposed import swap_roles, transposed_layer

    def algorithm(layer, dtype, params):
        t = transposed_layer(layer)
        w_shape = (layer.out_channels, layer.k_d, layer.k_h, layer.k_w, layer.in_channels)
        return swap_roles(program(t, layer_constants(t, Layout.NDHWC), params, flip=True,
                                  w_shape=w_shape))

    def supports(layer, params=None):
        return flipped_supports(layer, params) or refusal(layer) or None

    def error_bound(layer, inputs, tol_factor=None, random_inputs=False):
        w = inputs["w"].flip(2, 3, 4).transpose(0, 1)
        return forward_bound(transposed_layer(layer), inputs["y"], w, tol_factor=tol_factor,
                             random_inputs=random_inputs)

    return dict(algorithm=algorithm, supports=supports, error_bound=error_bound,
                constraints=CONSTRAINTS + ", padding at most 2")
