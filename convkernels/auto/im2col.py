"""``im2colGemm``: explicit im2col into a buffer, then a BLAS GEMM, on NCDHW.

Per batch image ``b`` the convolution is the GEMM

    Y_b[K, P] = W[K, GK] @ col_b[GK, P],    GK = C * KD * KH * KW,  P = OD * OH * OW,

where ``W`` is the KCTRS filter viewed as ``[K, GK]`` (row ``k``, column the tap
``kk = ((c * KD + kd) * KH + kh) * KW + kw``), ``Y_b`` is output image ``b`` viewed as
``[K, P]`` (NCDHW stores it exactly so: the GEMM writes the output in place), and
``col_b[kk, p]`` is the (padded) input pixel that tap ``kk`` of output pixel ``p``
reads.  One ``[GK, P]`` buffer is filled and multiplied per image, in a sequential
loop over the batch, which bounds its size (CosmoFlow conv1 at batch 16 would need
16 x 27 x 128^3 floats for the whole batch at once).

The GEMM is DaCe's ``MatMul`` library node (``A @ B``).  The schedules specialize it to a
``Gemm`` node and pick the vendor BLAS: Intel MKL on the CPU, cuBLAS on the GPU, through the
project's DaCe environments, which take them from their pip wheels where nothing else
provides them (see :mod:`convkernels.blas`).  There is no fallback to DaCe's pure (loop
nest) GEMM: without MKL a CPU build fails.  Only GEMMs with a dimension of 1 (K, GK or P ==
1, never in CosmoFlow) are plain maps, see :func:`forward`.

The im2col map runs over the decoded index space (c, kd, kh, kw, od, oh, ow) and
composes the flat row and column indices from it: decoding a flat index with ``%``
and ``//`` folds to a sympy zero when a size is 1, which DaCe 1.0.2's frontend
cannot parse.
"""

import dace
from dace.libraries.blas.nodes.gemm import Gemm
from dace.libraries.blas.nodes.matmul import MatMul

from convkernels.blas import GEMM_CUBLAS, GEMM_MKL, mkl_problem
from convkernels.layer import layer_constants
from convkernels.padding import pad_input
from convkernels.programs import stable_program
from convkernels.layouts import Layout


def forward(layer, dtype, params):
    L = layer_constants(layer, Layout.NCDHW)
    dt, zero = dtype.dace, dtype.zero
    N, C, K, KD, KH, KW, S = L.N, L.C, L.K, L.KD, L.KH, L.KW, L.S
    OD, OH, OW = L.OD, L.OH, L.OW
    GK, P = C * KD * KH * KW, OD * OH * OW
    # DaCe 1.0.2 drops size-1 dimensions from a library node's operands and then mishandles
    # the product (GK == 1 becomes a Dot, P == 1 breaks the reshaped view of y, K == 1
    # becomes a Gemv).  Such a "GEMM" is an outer or a matrix-vector product: a map does it.
    BLAS = min(K, GK, P) > 1

    @stable_program
    def im2col_gemm(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape]):
        col = dace.define_local((GK, P), dt)
        if BLAS:  # resolved while parsing: BLAS is a Python constant
            w2 = w.reshape((K, GK))
            y3 = y.reshape((N, K, P))
        for b in range(N):
            for c, kd, kh, kw, od, oh, ow in dace.map[0:C, 0:KD, 0:KH, 0:KW, 0:OD, 0:OH, 0:OW]:
                col[((c * KD + kd) * KH + kh) * KW + kw, (od * OH + oh) * OW + ow] = \
                    x[b, c, od * S + kd, oh * S + kh, ow * S + kw]
            if BLAS:
                y3[b] = w2 @ col
            elif GK == 1:  # C == 1 and a 1x1x1 kernel: an outer product
                for k, od, oh, ow in dace.map[0:K, 0:OD, 0:OH, 0:OW]:
                    y[b, k, od, oh, ow] = w[k, 0, 0, 0, 0] * col[0, (od * OH + oh) * OW + ow]
            else:  # K == 1 or P == 1: matrix-vector products
                for k, od, oh, ow in dace.map[0:K, 0:OD, 0:OH, 0:OW]:
                    acc = zero
                    for c in range(C):
                        for kd in range(KD):
                            for kh in range(KH):
                                for kw in range(KW):
                                    acc += w[k, c, kd, kh, kw] * \
                                        col[((c * KD + kd) * KH + kh) * KW + kw, (od * OH + oh) * OW + ow]
                    y[b, k, od, oh, ow] = acc

    return pad_input(im2col_gemm, layer, Layout.NCDHW)


def _matmuls(sdfg):
    return [(node, state) for node, state in sdfg.all_nodes_recursive() if isinstance(node, MatMul)]


def _use_blas(sdfg, implementation):
    """Specialize every ``MatMul`` node to a ``Gemm`` node that expands to ``implementation``
    (MatMul's only implementation, "specialize", replaces it by a Gemm in place)."""
    for node, state in _matmuls(sdfg):
        node.expand(state.sdfg, state)
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.LibraryNode):
            if not isinstance(node, Gemm):  # the algorithm keeps every GEMM dimension > 1
                raise RuntimeError(f"im2colGemm: MatMul became a {type(node).__name__}, not a Gemm")
            node.implementation = implementation


def _persistent_buffers(sdfg):
    """Allocate the col buffer (and the padded input) once per loaded program rather than
    on every call (and, for col, every image): col is up to ~1 GB (CosmoFlow-MLPerf conv1),
    and fresh memory costs page faults on the CPU and a cudaMalloc on the GPU.  Both are
    overwritten completely on every call, so nothing carries over between calls."""
    for name in ("col", "xp"):  # xp exists with padding only (pad_input)
        if name in sdfg.arrays:
            sdfg.arrays[name].lifetime = dace.AllocationLifetime.Persistent


def _top_level_maps(sdfg):
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.MapEntry) and state.entry_node(node) is None:
            yield node


def _require_mkl():
    """Raise unless Intel MKL's header and runtime library can be found."""
    problem = mkl_problem()
    if problem:
        raise RuntimeError(f"im2colGemm needs Intel MKL for the CPU GEMM: {problem}")


def cpu_schedule(sdfg, layer, params):
    """OpenMP over the maps (im2col, padding), MKL for the GEMM."""
    if _matmuls(sdfg):
        _require_mkl()
    for entry in _top_level_maps(sdfg):
        entry.map.schedule = dace.ScheduleType.CPU_Multicore
        # Parallelize over all dimensions but the innermost one (contiguous in both the
        # input and the col buffer): the outer ones can be 1 (C == 1, 1x1x1 kernels).
        entry.map.collapse = max(1, len(entry.map.params) - 1)
    _persistent_buffers(sdfg)
    _use_blas(sdfg, GEMM_MKL)


#: CUDA's limit on a grid's y and z dimensions.
_GRID_YZ_LIMIT = 65535


def gpu_schedule(sdfg, layer, params):
    """Every map a GPU kernel, every array in GPU global memory, cuBLAS for the GEMM."""
    # The harness passes torch CUDA tensors: the arguments live in GPU memory already, so
    # GPUTransformSDFG adds no host<->device copies for them.
    for desc in sdfg.arrays.values():
        if not desc.transient:
            desc.storage = dace.StorageType.GPU_Global
    sdfg.apply_gpu_transformations()
    for entry in _top_level_maps(sdfg):
        # DaCe launches a map's last dimension on x, the one before on y and all others,
        # flattened, on z.  For im2col that is ow (coalesced reads and writes), oh, and
        # (c, kd, kh, kw, od), whose product must stay within the grid's z limit.
        sizes = [int(s) for s in entry.map.range.size()]
        flat = 1
        for size in sizes[:-2]:
            flat *= size
        if flat > _GRID_YZ_LIMIT:
            raise RuntimeError(
                f"im2colGemm: map {entry.map.label} needs a CUDA grid z of {flat} blocks "
                f"(product of {sizes[:-2]}), over the limit of {_GRID_YZ_LIMIT}")
        rows = sizes[-2] if len(sizes) > 1 else 1
        entry.map.gpu_block_size = [32, max(b for b in (1, 2, 4) if b <= rows), 1]
    _persistent_buffers(sdfg)
    _use_blas(sdfg, GEMM_CUBLAS)
