"""``winogradF2``: 3D Winograd F(2^3, 3^3) on NDHWC for the CPU (see ``_winograd.py``):
64 element-wise products per 2 x 2 x 2 output tile instead of 216, at the price of a
larger rounding error, which its check bounds with :func:`convbench.winograd.error_bound`
instead of the direct sums' tolerance (docs/winograd.md)."""

from convbench.registry import Implementation, Layout, Pass, Param, register
from impls import _winograd
from impls._blocked import cpu_schedule
from impls._common import layer_constants


def algorithm(layer, dtype, params):
    return _winograd.program(layer, layer_constants(layer, Layout.NDHWC), params["TB"])


def supports(layer, params=None):
    return _winograd.refusal(layer) or None


def error_bound(layer, inputs):
    """The rigorous bound of F(2^3, 3^3) on these inputs (logical NCDHW), per output
    element, as a float64 tensor."""
    import numpy as np
    import torch
    from convbench import winograd
    pd, ph, pw = layer.pads
    # an odd output size: one more zero plane (what the kernel's last tile reads), cropped
    od, oh, ow = (layer.out_d % 2, layer.out_h % 2, layer.out_w % 2)
    x = torch.nn.functional.pad(inputs["x"].double(), (pw, pw + ow, ph, ph + oh, pd, pd + od))
    bound = winograd.error_bound(x.numpy(), inputs["w"].double().numpy(), _winograd.M_OUT)
    bound = bound[:, :, :layer.out_d, :layer.out_h, :layer.out_w]
    return torch.from_numpy(np.ascontiguousarray(bound))


register(Implementation(
    name="winogradF2",
    summary="3D Winograd F(2^3, 3^3) on NDHWC for the CPU: filter transform per call, "
            "blocks of output tiles (input transform, 64 register-blocked GEMMs, output "
            "transform) in a thread's scratch; checked against its own rigorous bound",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("TB", 4, "output tiles per block along the width (a divisor of the "
                           "tile count up to TB)"),),
    supports=supports,
    constraints="3x3x3 kernels, stride 1",
    anisotropic_pad=True,
    error_bound=error_bound,
))
