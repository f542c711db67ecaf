"""``winogradF2BwdFilter``: dL/dw of a stride-1 3x3x3 layer with Winograd F(3^3, 2^3).

Per output tile of 2^3 pixels, the filter gradient is the correlation of the tile's 4^3
input patch with its 2^3 values of dL/dy: the forward F(2, 3)'s matrices in other roles,
``dw = G^T [(A dy) * (B^T x)]``, with one GEMM per transform point that sums over the
tiles (:mod:`impls._winograd_filter`; the error bound in docs/winograd.md)."""

from convbench.registry import Implementation, Layout, Pass, register
from impls._rules import WINOGRAD_FILTER
from impls import _winograd, _winograd_fields, _winograd_filter
from impls._blocked import cpu_schedule
from impls._common import layer_constants


def _algorithm(layer, dtype, params):
    return _winograd_filter.program(layer, layer_constants(layer, Layout.NDHWC), params)


register(Implementation(
    name="winogradF2BwdFilter",
    summary="backward filter with 3D Winograd F(3^3, 2^3) (stride 1): per transform point "
            "one GEMM over the tiles, dL/dy's 2^3 tiles as the filter",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=_algorithm,
    schedules={"cpu": cpu_schedule},
    params=_winograd_filter.params(),
    search_space=_winograd_filter.SEARCH_SPACE,
    registers=_winograd_filter.registers,
    supports=lambda layer, params=None: _winograd.refusal(layer, algorithm="F(3^3, 2^3)") or None,
    error_bound=lambda layer, inputs, tol_factor, random_inputs=False: _winograd_filter.bound(
        layer, inputs["x"], inputs["y"], tol_factor, random_inputs),
    constraints=_winograd_fields.CONSTRAINTS,
    anisotropic_pad=True,
    handles=("asymmetric padding",),  # only the output size depends on it
    wins=(WINOGRAD_FILTER,),
))
