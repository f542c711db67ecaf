"""``winogradF2BwdFilter``: dL/dw of a stride-1 3x3x3 layer with Winograd F(3^3, 2^3).

Per output tile of 2^3 pixels, the filter gradient is the correlation of the tile's 4^3
input patch with its 2^3 values of dL/dy: the forward F(2, 3)'s matrices in other roles,
``dw = G^T [(A dy) * (B^T x)]``, with one GEMM per transform point that sums over the
tiles (:mod:`convkernels.cpu.winograd.filter_gradient`; the error bound in docs/winograd.md)."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.winograd import filter_gradient
from convkernels.winograd import fields
from convkernels.winograd.tiles import refusal
from convkernels.cpu.rules import WINOGRAD_FILTER
from convkernels.cpu.direct.blocking import cpu_schedule

register(Implementation(
    name="winogradF2BwdFilter",
    summary="backward filter with 3D Winograd F(3^3, 2^3) (stride 1): per transform point "
            "one GEMM over the tiles, dL/dy's 2^3 tiles as the filter",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=fields.ndhwc_algorithm(filter_gradient.program),
    schedules={"cpu": cpu_schedule},
    params=filter_gradient.params(),
    search_space=filter_gradient.SEARCH_SPACE,
    registers=filter_gradient.registers,
    supports=lambda layer, params=None: refusal(layer, algorithm="F(3^3, 2^3)") or None,
    error_bound=lambda layer, inputs, tol_factor, random_inputs=False: filter_gradient.bound(
        layer, inputs["x"], inputs["y"], tol_factor, random_inputs),
    constraints=fields.CONSTRAINTS,
    anisotropic_pad=True,
    handles=("asymmetric padding",),  # only the output size depends on it
    wins=(WINOGRAD_FILTER,),
))
