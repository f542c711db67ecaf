"""``winogradF2BwdDataAdjoint``: dL/dx of a stride-1 3x3x3 layer as the adjoint of the
forward Winograd F(2^3, 3^3): per forward tile, dL/dy's 2^3 values through ``A``, one GEMM
per transform point with the transformed filter, and ``B`` into a 4^3 patch added into
dL/dx where the patches overlap (:mod:`convkernels.cpu.winograd.adjoint`).  It does the forward's
products where ``winogradF2BwdData`` tiles the larger dL/dx of an unpadded layer."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.winograd import adjoint
from convkernels.winograd import fields
from convkernels.winograd.tiles import refusal
from convkernels.cpu.direct.blocking import cpu_schedule

register(Implementation(
    name="winogradF2BwdDataAdjoint",
    summary="backward data as the adjoint of the forward Winograd F(2^3, 3^3) (stride 1): "
            "per forward tile A on dL/dy, one GEMM per point, B into overlapping 4^3 patches",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=fields.ndhwc_algorithm(adjoint.program),
    schedules={"cpu": cpu_schedule},
    params=adjoint.params(),
    search_space=adjoint.SEARCH_SPACE,
    registers=adjoint.registers,
    supports=lambda layer, params=None: refusal(layer) or None,
    error_bound=lambda layer, inputs, tol_factor=None, random_inputs=False: adjoint.bound(
        layer, inputs["y"], inputs["w"], tol_factor, random_inputs),
    constraints=fields.CONSTRAINTS,
    anisotropic_pad=True,
    handles=("asymmetric padding",),  # only the output size depends on it
))
