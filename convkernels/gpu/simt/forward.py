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
from convkernels.gpu.simt import epilogue, gather, mainloop
from convkernels.gpu.simt.tiles import PARAMS, check_params, shape, supports
from convkernels.layer import Layer
from convkernels.layouts import Layout, Pass


def code():
    """The forward's tasklet code, by role (looked up when called, so that a test can
    plant a bug in one of the functions)."""
    return {"prologue": gather.prologue_code, "step": mainloop.step_code,
            "epilogue": epilogue.epilogue_code}


def program(layer: Layer, layout: Layout, dtype, params, flip: bool = False,
            w_shape=None) -> dace.SDFG:
    """The SIMT kernel's program for ``layer`` in ``layout`` (``flip``, ``w_shape``: a data
    gradient's, :func:`convkernels.gpu.pipeline.skeleton.program`)."""
    return skeleton.program(layer, layout, dtype, params, flip, w_shape,
                            s=shape(layer, layout, params, flip), code=code())


def schedule(target: str, layout: Layout):
    """The forward's schedule for ``target``: the skeleton's, with this kernel's C++."""
    return skeleton.schedule(target, layout,
                             lambda layer, params: (shape(layer, layout, params), code()))


def fields(**given):
    """What a pipelined forward kernel registers with (the registry's ``Implementation``
    fields): ``given`` (name, summary, layout, ...) and what both layouts share."""
    layout = given["layout"]
    return dict(
        pass_=Pass.FWD, algorithm=lambda layer, dtype, values: program(layer, layout, dtype,
                                                                         values),
        schedules={t: schedule(t, layout) for t in ("cpu", "gpu")}, params=PARAMS,
        check_params=check_params, supports=supports,
        constraints="one image of the input below 2^31 elements",
        **dict({"default_for": ("best-of",)}, **given))
