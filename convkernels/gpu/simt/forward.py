"""The SIMT forward kernel (``implicitGemmPipelined``, ``implicitGemmPipelinedNCDHW``): the
pipelined program (:mod:`convkernels.gpu.pipeline.skeleton`) with the SIMT gather, main
loop and epilogue, one program for NDHWC and NCDHW.

The GEMM is the implicit GEMM of :mod:`convkernels.gpu.igemm` (M = output pixels, N =
output channels, K = filter taps x input channels), with the reduction ordered
**tap-major**: K tile ``j`` is tap ``j / CB`` (``kd, kh, kw``) and channel block ``j % CB``
of ``CTAtileK`` channels, ``CB`` = channels / CTAtileK rounded up.  Per block of ``NT``
threads (``t``; ``ti = t % NTM`` along M, ``tj = t / NTM`` along N) the gather
(:mod:`~convkernels.gpu.simt.gather`) stages each K tile, the main loop
(:mod:`~convkernels.gpu.simt.mainloop`) computes it, and the epilogue
(:mod:`~convkernels.gpu.simt.epilogue`) stores each thread's register tile.
"""

import dace

from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.pipeline.skeleton import SB, ST
from convkernels.gpu.simt import epilogue, gather, mainloop
from convkernels.gpu.simt.filter_gradient import wgrad_reduce
from convkernels.gpu.simt.tiles import PARAMS, SPLIT_K, check_params, shape, supports
from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, Pass

#: The tiles' parameters and the split of the reduction.
FORWARD_PARAMS = PARAMS + (SPLIT_K,)


def code(split: bool = False):
    """The forward's tasklet code, by role (looked up when called, so that a test can
    plant a bug in one of the functions); with split-K, the sum of the slices."""
    roles = {"prologue": gather.prologue_code, "step": mainloop.step_code,
             "epilogue": epilogue.epilogue_code}
    return {**roles, "reduce": wgrad_reduce} if split else roles


def program(layer: Layer, layout: Layout, dtype, params, flip: bool = False,
            w_shape=None) -> dace.SDFG:
    """The SIMT kernel's program for ``layer`` in ``layout`` (``flip``, ``w_shape``: a data
    gradient's, :func:`convkernels.gpu.pipeline.skeleton.program`); with split-K the
    sliced program (:func:`convkernels.gpu.pipeline.skeleton.sliced_program`)."""
    s = shape(layer, layout, params, flip)
    if not s.split:
        sdfg = skeleton.program(layer, layout, dtype, params, flip, w_shape, s=s, code=code())
        return _with_tap_table(sdfg, s, "cpu")
    L = layer_constants(layer, layout)
    shapes = (tuple(w_shape or L.w_shape), skeleton.unpadded(layer, layout), L.y_shape)
    sdfg = skeleton.sliced_program(shapes, dtype, s=s, code=code(True),
                                   state=(len(ST), len(SB)))
    # the sliced program's roles: A (the input) is "y", B (the filter) "x", the sum "w"
    for old, new in (("x", "__w"), ("y", "x"), ("w", "y"), ("__w", "w")):
        sdfg.replace(old, new)
    sdfg.arg_names = ["x", "w", "y"]
    return _with_tap_table(sdfg, s, "cpu")


def _with_tap_table(sdfg, s, target: str):
    """``sdfg`` with the packed gather's table of tap offsets for ``target``, where it
    has one (``Shape.tap_table``)."""
    if s.tap_table:
        gpu = target == "gpu"
        sdfg.append_global_code(gather.tap_table_code(s, gpu), "cuda" if gpu else "frame")
    return sdfg


def schedule(target: str, layout: Layout):
    """The forward's schedule for ``target``: the skeleton's, with this kernel's C++."""
    def apply(sdfg, layer, params):
        s = shape(layer, layout, params)
        skeleton.schedule(target, layout, lambda *_: (s, code(s.split)))(sdfg, layer, params)
        _with_tap_table(sdfg, s, target)
    return apply


def fields(**given):
    """What a pipelined forward kernel registers with (the registry's ``Implementation``
    fields): ``given`` (name, summary, layout, ...) and what both layouts share."""
    layout = given["layout"]
    return dict(
        pass_=Pass.FWD, algorithm=lambda layer, dtype, values: program(layer, layout, dtype,
                                                                         values),
        schedules={t: schedule(t, layout) for t in ("cpu", "gpu")}, params=FORWARD_PARAMS,
        check_params=check_params, supports=supports,
        constraints="one image of the input below 2^31 elements",
        **dict({"default_for": ("best-of",)}, **given))
