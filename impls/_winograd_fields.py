"""What every Winograd CPU kernel registers with (``winograd_f2*.py``): its tunable
parameters and their search space, the register count the tuner screens by, the forward
error bound the checks use, and the fields of the forward and the data-gradient
registrations (:func:`pass_fields`)."""

from convbench import winograd
from impls._blocked import auto_switch
from impls._winograd import M_OUT, blocking, refusal


#: What ``convbench tune`` tries by default.
SEARCH_SPACE = "T=0,24,48;NV=0,2;FUSE=2,1"


def params():
    """The tunable parameters of the Winograd kernels (0: chosen by :func:`blocking`)."""
    from convbench.registry import Param
    return (
        Param("T", 0, "output tiles per block (0: as many as keep the block's transformed "
                      "input and output within a thread's scratch budget)", minimum=0),
        Param("KG", 0, "output channels per work item, a multiple of KB (0: all, split "
                       "until the block fits and every thread has two items)", minimum=0),
        Param("CB", 0, "input channels per chunk of the input transform and the GEMMs "
                       "(0: all, unless the block would not fit)", minimum=0),
        Param("NV", 0, "vectors of output channels per register block (0: 4 with 32 "
                       "vector registers, 2 with 16)", minimum=0),
        Param("RT", 0, "tiles per register block (0: as many as the registers hold)",
              minimum=0),
        Param("SHARE", 2, "1: one pass transforms the whole input first and the work items "
                          "of a tile block share it; 0: each item transforms its block's "
                          "input; 2: shared where there is one block, split among items by "
                          "output channels, and its transformed input fits SHARED_BYTES", minimum=0,
              check=auto_switch),
        Param("FUSE", 2, "1: each work item transforms the filter chunks it uses; 0: one "
                         "pass transforms the whole filter first; 2: fused where there are "
                         "at most two tile blocks", minimum=0,
              check=auto_switch),
    )


def registers_of(pass_):
    """``registers(layer, params)`` for the tuner: the register block's accumulators (for
    the data gradient, on the transposed layer, whose output channels are ``layer``'s
    input channels)."""
    from convbench.registry import Layout, Pass
    from impls._common import layer_constants
    from impls._transposed import transposed_layer

    def registers(layer, params):
        t = layer if Pass(pass_) == Pass.FWD else transposed_layer(layer)
        b = blocking(layer_constants(t, Layout.NDHWC), params)
        return b.RT * b.NV

    return registers


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
    """The bound of :func:`convbench.winograd.error_bound` for the forward ``layer`` on
    ``x`` (unpadded, NCDHW) and ``w`` (K, C, 3, 3, 3), as a float64 tensor shaped like the
    output: the statistical one on random inputs (with ``tol_factor``), else the rigorous
    one.  Where ``m`` does not divide an output size, the kernel's last tile reads zeros
    past the input: the bound pads as many zero planes and crops."""
    import numpy as np
    import torch
    xp, _ = tile_padded(layer, x, m)
    bound = winograd.error_bound(xp.numpy(), w.double().numpy(), m, tol_factor=tol_factor or 0.0,
                                 random_inputs=random_inputs)
    bound = bound[:, :, :layer.out_d, :layer.out_h, :layer.out_w]
    return torch.from_numpy(np.ascontiguousarray(bound))


def pass_fields(pass_, program) -> dict:
    """The :class:`~convbench.registry.Implementation` fields that a Winograd kernel of
    ``pass_`` shares with the others: ``algorithm`` (``program(layer, L, params, flip=...,
    w_shape=...)`` on the layer, or for the data gradient on the transposed layer, the
    forward convolution of dL/dy with the filter flipped and its channels swapped where
    the filter transform reads it), ``supports``, ``constraints`` and ``error_bound``."""
    from convbench.registry import Pass
    fields = _forward_fields if Pass(pass_) == Pass.FWD else _data_gradient_fields
    return dict(fields(program), anisotropic_pad=True)


CONSTRAINTS = "3x3x3 kernels, stride 1, dilation 1, groups 1"


def _forward_fields(program) -> dict:
    from convbench.registry import Layout
    from impls._common import layer_constants

    def algorithm(layer, dtype, params):
        return program(layer, layer_constants(layer, Layout.NDHWC), params)

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
    from convbench.registry import Layout
    from impls._common import layer_constants
    from impls._transposed import supports as flipped_supports
    from impls._transposed import swap_roles, transposed_layer

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
