"""The pipelined program every fast GPU kernel of the library runs on: a block map whose
threads keep their gather state in registers (``st``, ``sb``), ``stages`` K tiles in flight
in shared memory (``As``, ``Bs``) through ``cp.async``, and three tasklets, the prologue, one
step of the K loop and the epilogue, whose C++ a main loop supplies
(:func:`convkernels.gpu.pipeline.tasklets.set_code`).  The SIMT main loop
(:mod:`convkernels.gpu.simt`) and the tensor-core one (:mod:`convkernels.gpu.mma`) fill it.

On the CPU the same tasklet code runs thread by thread: ``cp.async`` is a copy (or a
zero fill), the waits do nothing, and a stage is never written while another thread of
the step reads it (steps run in order, and a step writes the stage the previous step
read).  So the CPU check covers the gather, the staging layout, the fragments and the
epilogue; only the asynchronous copies and the barrier are the GPU's own.
"""

import dace
import numpy as np

from convkernels.gpu import tiling as T
from convkernels.gpu.pipeline.tasklets import set_code
from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, stored_shape
from convkernels.programs import stable_program


#: The per-thread state, in registers across the K loop.  ``st`` (int32): the staged
#: pixel's window origin; the next K tile to stage (its tap ``kd, kh, kw`` and first
#: channel ``c0``; ``kd`` reaches the filter depth past the last tile); the stage it goes
#: to and the stage the next step computes from.  ``sb`` (int64): the staged pixel's image
#: offset (-1 past the GEMM's rows) and the staged filter row's (-1 past the channels).
ST = ("d0", "h0", "w0", "kd", "kh", "kw", "c0", "sslot", "cslot")

SB = ("abase", "bbase")


def program(layer: Layer, layout: Layout, dtype, params, flip: bool = False,
            w_shape=None, *, s, code) -> dace.SDFG:
    """The pipelined implicit GEMM of ``layer`` in ``layout`` (the GEMM of
    :mod:`convkernels.gpu.simt.forward`, the program of the module docstring) for the
    main loop whose constants are ``s`` (its tiles' ``Shape``) and whose tasklet code by
    role is ``code`` (``role -> f(s, gpu)``: :func:`convkernels.gpu.simt.forward.code`,
    :func:`convkernels.gpu.mma.program.code`); the tasklets hold the CPU's C++ until a
    schedule sets its target's.  ``flip``: ``layer`` is a data gradient's
    ``transposed_layer`` and the program takes the forward filter, of shape ``w_shape``.
    The accumulators are ``dtype``'s sums, the stages 4-byte words."""
    L = layer_constants(layer, layout)
    x_shape = unpadded(layer, layout)
    w_shape = tuple(w_shape or L.w_shape)
    XS, WS, YS = int(np.prod(x_shape)), int(np.prod(w_shape)), int(np.prod(L.y_shape))
    dt, at = dtype.dace, dtype.acc_dace
    NT, RR, KT = s.NT, s.RR, s.KT
    NSI, NSB = len(ST), len(SB)
    AS, BS = s.AS, s.BS

    @stable_program
    def igemm_pipelined(x: dt[x_shape], w: dt[w_shape], y: dt[L.y_shape]):
        xf = np.reshape(x, [XS])
        wf = np.reshape(w, [WS])
        yf = np.reshape(y, [YS])
        for blk_n, blk_m in dace.map[0:s.GNp:s.TN, 0:s.GMp:s.TM]:  # blk_m: grid x
            acc = np.ndarray([NT, RR], at)
            st = np.ndarray([NT, NSI], dace.int32)
            sb = np.ndarray([NT, NSB], dace.int64)
            As = np.ndarray([AS], dace.float32)
            Bs = np.ndarray([BS], dace.float32)
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the prologue: its C++ is set below
                    xa << xf(1)[:]
                    wb << wf(1)[:]
                    acco >> acc(-1)[:, :]
                    sto >> st(-1)[:, :]
                    sbo >> sb(-1)[:, :]
                    ao >> As(-1)[:]
                    bo >> Bs(-1)[:]
                    acco[0, 0] = xa[0] + wb[0]
                    sto[0, 0] = 0
                    sbo[0, 0] = 0
                    ao[0] = 0
                    bo[0] = 0
            for kt in dace.map[0:KT]:
                for t in dace.map[0:NT]:
                    with dace.tasklet:  # one step of the K loop
                        xa << xf(1)[:]
                        wb << wf(1)[:]
                        sti << st(1)[:, :]
                        sbi << sb(1)[:, :]
                        ai << As(1)[:]
                        bi << Bs(1)[:]
                        acci << acc(1)[:, :]
                        acco >> acc(-1)[:, :]
                        sto >> st(-1)[:, :]
                        ao >> As(-1)[:]
                        bo >> Bs(-1)[:]
                        acco[0, 0] = acci[0, 0] + ai[0] * bi[0] + xa[0] + wb[0] + sbi[0, 0]
                        sto[0, 0] = sti[0, 0]
                        ao[0] = 0
                        bo[0] = 0
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the epilogue
                    acci << acc(1)[:, :]
                    yo >> yf(-1)[:]
                    yo[0] = acci[0, 0]

    sdfg = igemm_pipelined.to_sdfg(simplify=True)
    set_code(sdfg, s, gpu=False, code=code)
    return sdfg


def sliced_program(shapes, dtype, *, s, code, state) -> dace.SDFG:
    """The pipelined program with its reduction cut into ``s.Z`` slices of ``s.TPS`` K
    tiles (split-K): block ``(blk_z, blk_n, blk_m)`` sums slice ``blk_z`` of its output tile
    into the float32 partial ``ws[blk_z]`` (``s.PS`` values each), and a second kernel adds
    each value's partials in slice order (the ``reduce`` tasklet), so the result does not
    depend on the order the blocks run in.  ``shapes``: those of the arguments ``x``,
    ``y`` and ``w``, in the filter gradient's roles: the tasklets read A from ``y`` (as
    ``xa``) and B from ``x`` (as ``wb``), and the sum goes to ``w`` (the forward renames
    them, :func:`convkernels.gpu.simt.forward.program`).  ``s``: the tiles' constants
    (``GMp``, ``GNp``: the GEMM's rows and columns in whole tiles); ``code``: the tasklet
    code by role; ``state``: the int32 and int64 values of each thread's state."""
    x_shape, y_shape, w_shape = (tuple(v) for v in shapes)
    XS, YS, WS = int(np.prod(x_shape)), int(np.prod(y_shape)), s.PS
    dt, at = dtype.dace, dtype.acc_dace
    NT, RR, Z = s.NT, s.RR, s.Z
    GMp, GNp = s.GMp, s.GNp
    NSI, NSB = state
    AS, BS = s.AS, s.BS

    @stable_program
    def wgrad_pipelined(x: dt[x_shape], y: dt[y_shape], w: dt[w_shape]):
        xf = np.reshape(x, [XS])
        yf = np.reshape(y, [YS])
        wf = np.reshape(w, [WS])
        ws = np.ndarray([Z * WS], dace.float32)
        for blk_z, blk_n, blk_m in dace.map[0:Z, 0:GNp:s.TN, 0:GMp:s.TM]:
            acc = np.ndarray([NT, RR], at)
            st = np.ndarray([NT, NSI], dace.int32)
            sb = np.ndarray([NT, NSB], dace.int64)
            As = np.ndarray([AS], dace.float32)
            Bs = np.ndarray([BS], dace.float32)
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the prologue: its C++ is set by the schedule
                    xa << yf(1)[:]
                    wb << xf(1)[:]
                    acco >> acc(-1)[:, :]
                    sto >> st(-1)[:, :]
                    sbo >> sb(-1)[:, :]
                    ao >> As(-1)[:]
                    bo >> Bs(-1)[:]
                    acco[0, 0] = xa[0] + wb[0]
                    sto[0, 0] = 0
                    sbo[0, 0] = 0
                    ao[0] = 0
                    bo[0] = 0
            for kt in dace.map[0:s.TPS]:
                for t in dace.map[0:NT]:
                    with dace.tasklet:  # one step of the slice's K loop
                        xa << yf(1)[:]
                        wb << xf(1)[:]
                        sti << st(1)[:, :]
                        sbi << sb(1)[:, :]
                        ai << As(1)[:]
                        bi << Bs(1)[:]
                        acci << acc(1)[:, :]
                        acco >> acc(-1)[:, :]
                        sto >> st(-1)[:, :]
                        sbs >> sb(-1)[:, :]
                        ao >> As(-1)[:]
                        bo >> Bs(-1)[:]
                        acco[0, 0] = acci[0, 0] + ai[0] * bi[0] + xa[0] + wb[0] + sbi[0, 0]
                        sto[0, 0] = sti[0, 0]
                        sbs[0, 0] = sbi[0, 0]
                        ao[0] = 0
                        bo[0] = 0
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the epilogue: into slice blk_z's partial
                    acci << acc(1)[:, :]
                    yo >> ws(-1)[:]
                    yo[0] = acci[0, 0]
        for i in dace.map[0:WS]:
            with dace.tasklet:  # the slices added in order
                wsi << ws(1)[:]
                wo >> wf(-1)[:]
                wo = wsi[0]

    sdfg = wgrad_pipelined.to_sdfg(simplify=True)
    set_code(sdfg, s, gpu=False, code=code)
    return sdfg


def unpadded(layer: Layer, layout: Layout):
    """The unpadded input as ``layout`` stores it (what the program takes)."""
    return stored_shape(layout, "x", layer.input_shape)


def schedule(target: str, layout: Layout, kernel):
    """The tiled schedule (:func:`convkernels.gpu.tiling.tiled_schedule`: block map on the
    grid or the CPU's cores, the thread map on a block's threads or a loop, the stages in
    shared memory, the accumulators and the staging state in registers), then the target's
    C++.  ``kernel(layer, params) -> (shape, code)``: what :func:`set_code` gets.  On the
    GPU a transient between kernels (the filter gradient's partials) is allocated once,
    with the program."""
    base = T.tiled_schedule(target, threads=("t",), sequential=("kt",), shared=("As", "Bs"),
                            private={"acc": 1, "st": 1, "sb": 1})

    def apply(sdfg, layer, params):
        base(sdfg, layer, params)
        gpu = target == "gpu"
        s, code = kernel(layer, params)
        set_code(sdfg, s, gpu, code)
        if gpu:
            T.vector_shared(sdfg, ("As", "Bs"), ("ai", "ao", "bi", "bo"))
            T.const_inputs(sdfg, ("xa", "wb"))
            for desc in sdfg.arrays.values():
                if (desc.transient and desc.storage == dace.StorageType.GPU_Global
                        and not isinstance(desc, dace.data.View)):
                    desc.lifetime = dace.AllocationLifetime.Persistent

    return apply
