"""``winogradF2BwdDataAdjoint``: dL/dx of a stride-1 3x3x3 layer as the adjoint of the
forward Winograd F(2^3, 3^3): per forward tile, dL/dy's 2^3 values through ``A``, one GEMM
per transform point with the transformed filter, and ``B`` into a 4^3 patch added into
dL/dx where the patches overlap (:mod:`impls._winograd_adjoint`).  It does the forward's
products where ``winogradF2BwdData`` tiles the larger dL/dx of an unpadded layer."""

from convbench.registry import Implementation, Layout, Pass, register
from impls import _winograd, _winograd_adjoint, _winograd_fields
from impls._blocked import cpu_schedule
from impls._common import layer_constants


def _algorithm(layer, dtype, params):
    return _winograd_adjoint.program(layer, layer_constants(layer, Layout.NDHWC), params)


register(Implementation(
    name="winogradF2BwdDataAdjoint",
    summary="backward data as the adjoint of the forward Winograd F(2^3, 3^3) (stride 1): "
            "per forward tile A on dL/dy, one GEMM per point, B into overlapping 4^3 patches",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=_algorithm,
    schedules={"cpu": cpu_schedule},
    params=_winograd_adjoint.params(),
    search_space=_winograd_adjoint.SEARCH_SPACE,
    registers=_winograd_adjoint.registers,
    supports=lambda layer, params=None: _winograd.refusal(layer) or None,
    error_bound=lambda layer, inputs, tol_factor=None, random_inputs=False: _winograd_adjoint.bound(
        layer, inputs["y"], inputs["w"], tol_factor, random_inputs),
    constraints=_winograd_fields.CONSTRAINTS,
    anisotropic_pad=True,
    handles=("asymmetric padding",),  # only the output size depends on it
))
