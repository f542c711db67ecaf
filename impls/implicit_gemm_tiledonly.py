"""``implicitGemmTiledonly``: the implicit GEMM tiled into thread-block tiles.

Each thread block owns a CTAtileM x CTAtileN tile of the output (pixels x output
channels), each thread one output element, and each thread runs the whole reduction
as a sequential loop that reads the input and filter from global memory: no staging
buffers, no register tiles.  The baseline for the staged variants.  NDHWC layout; the
GEMM mapping and the tables are described in ``impls/_igemm.py``.
"""

from convbench.registry import ALL_PRECISIONS, Layout, Pass
from convbench.registry import Implementation, Param, register
from impls import _igemm, _tiling

LAYOUT = Layout.NDHWC


def algorithm(layer, dtype, params):
    return _igemm.tiled_only(layer, LAYOUT, dtype, params)


def _check(params):
    threads = params["CTAtileM"] * params["CTAtileN"]
    return _tiling.require((threads <= _tiling.MAX_THREADS,
                            f"CTAtileM*CTAtileN = {threads} threads > {_tiling.MAX_THREADS}"))


def _schedule(target):
    return _tiling.tiled_schedule(target, sequential=("kk",), private={"acc": 2})


register(Implementation(
    name="implicitGemmTiledonly",
    summary="implicit GEMM on NDHWC, CTA tiles of M x N, one output per thread, "
            "sequential K loop from global memory",
    layout=LAYOUT,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": _schedule("cpu"), "gpu": _schedule("gpu")},
    params=(Param("CTAtileM", 16, "output pixels per thread block", _tiling.power_of_two),
            Param("CTAtileN", 16, "output channels per thread block", _tiling.power_of_two)),
    check_params=_check,
    supports=_tiling.int32_offsets,
    constraints=_tiling.INT32_CONSTRAINT,
    precisions=ALL_PRECISIONS,
))
