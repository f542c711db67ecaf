"""The tensor-core forward and data gradient (``implicitGemmMMA``, ``implicitGemmMMABwdData``)
on NDHWC: the pipelined program (:mod:`convkernels.gpu.pipeline.skeleton`) with the
tensor-core gather, main loop and epilogue, and the C++ helpers of its target
(:mod:`convkernels.gpu.mma.ptx`).

The tensor-core implicit GEMM is the pipelined skeleton (per-thread gather state, ``stages``
K tiles in flight through ``cp.async``, one barrier per step) with a warp-level main loop in
the shape of CUTLASS's sm80 kernels.  NDHWC; ``mma.sync`` with float32 sums: m16n8k16 on
float16 or bfloat16 operands, m16n8k8 on TF32 operands (float32 storage, ``--math tf32``).
Its tiles are :mod:`~convkernels.gpu.mma.tiles`, its shared-memory layouts
:mod:`~convkernels.gpu.mma.layout`, its gather, main loop and epilogue the modules of those
names.
"""

import dace

from convkernels.gpu.mma import epilogue, gather, mainloop
from convkernels.gpu.mma.ptx import helpers
from convkernels.gpu.mma.tiles import PARAMS, PRECISIONS, check_params, shape, supports
from convkernels.gpu.pipeline import skeleton
from convkernels.layer import Layer
from convkernels.layouts import Layout, stored_shape
from convkernels.transposed import supports as flipped_supports
from convkernels.transposed import swap_roles, transposed_layer


#: What the prologue and the steps call the stages, as bytes, before their code.
PREAMBLE = ("char* as = reinterpret_cast<char*>(ao);\n"
             "char* bs = reinterpret_cast<char*>(bo);\n")


def code():
    """The tasklet code by role, for :func:`convkernels.gpu.pipeline.tasklets.set_code`
    (looked up when called, so that a test can plant a bug in one of the functions)."""
    def staged(f):
        return lambda s, gpu: PREAMBLE + f(s, gpu)
    return {"prologue": staged(gather.prologue_code), "step": staged(mainloop.step_code),
            "epilogue": epilogue.epilogue_code}


def program(layer: Layer, dtype, params, flip: bool = False, w_shape=None) -> dace.SDFG:
    """The tensor-core implicit GEMM of ``layer`` (NDHWC).  ``flip``:
    ``layer`` is a data gradient's ``transposed_layer`` and the program takes the forward
    filter, of shape ``w_shape``."""
    s = shape(layer, dtype.dace.ctype, params, flip)
    sdfg = skeleton.program(layer, Layout.NDHWC, dtype, params, flip=flip, w_shape=w_shape,
                            s=s, code=code())
    sdfg.append_global_code(helpers(s, gpu=False), "frame")
    return sdfg


def int8_program(layer: Layer, dtype, params) -> dace.SDFG:
    """The forward on int8 operands (``dtype``: int8; symmetric, no zero point, so the
    zero-filled border is exact) with ``mma.sync`` m16n8k32 and int32 sums: the output
    ``y`` holds the int32 sums (:mod:`convbench.quant.int8` checks them bit for bit)."""
    return retype_output(program(layer, dtype, params), dace.int32)


def retype_output(sdfg: dace.SDFG, dtype) -> dace.SDFG:
    """``sdfg`` with its output ``y`` and the flat views of it in ``dtype`` (the
    accumulators' type: the epilogue then stores the sums as they are); every other array
    keeps its type."""
    outputs = ["y"] + [name for name, desc in sdfg.arrays.items()
                       if isinstance(desc, dace.data.View) and name.startswith("y_")]
    if len(outputs) < 2:
        raise ValueError(f"retype_output: no flat view of y among {sorted(sdfg.arrays)}")
    for name in outputs:
        sdfg.arrays[name].dtype = dtype
    return sdfg


def int8_supports(layer: Layer, params=None):
    """Why the int8 forward does not handle ``layer``, or None: every copy moves at least
    4 bytes (``cp.async``), so the channels come in fours."""
    if layer.in_channels % 4:
        return (f"C = {layer.in_channels}: the int8 copies move at least 4 bytes (cp.async), "
                "so C must be a multiple of 4")
    return supports(layer, params)


def schedule(target: str, flip: bool = False, layer_of=lambda layer: layer):
    """The pipelined skeleton's tiled schedule (block map on the grid, thread map on the block's
    threads, stages in shared memory, accumulators and state in registers) with the
    tensor-core code of the target.  ``layer_of``: the layer the program computes (the
    data gradient's transposed one)."""
    def apply(sdfg, layer, params):
        s = shape(layer_of(layer), sdfg.arrays["x"].dtype.ctype, params, flip)
        skeleton.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, code()))(sdfg, layer, params)
        sdfg.append_global_code(helpers(s, target == "gpu"), "cuda" if target == "gpu" else "frame")
    return apply


def fields(**given):
    """What a tensor-core kernel on NDHWC registers with: ``given`` (name, summary, pass,
    algorithm, supports, constraints, schedules) and what every one shares."""
    return dict(layout=Layout.NDHWC, params=PARAMS, check_params=check_params,
                precisions=PRECISIONS, **given)


def data_gradient(layer: Layer, dtype, params) -> dace.SDFG:
    """dL/dx of a stride-1 ``layer``: the program on ``transposed_layer(layer)`` reading
    dL/dy, with the forward filter flipped and its channels swapped as it is staged
    (N-major); x and y swap roles for the harness."""
    sdfg = program(transposed_layer(layer), dtype, params, flip=True,
                   w_shape=stored_shape(Layout.NDHWC, "w", layer.filter_shape))
    return swap_roles(sdfg)


def data_gradient_supports(layer: Layer, params=None):
    """Why the data gradient does not handle ``layer``, or None."""
    return flipped_supports(layer, params) or supports(transposed_layer(layer), params)
