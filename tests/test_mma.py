"""The tensor-core kernels (``convkernels/gpu/mma/``, ``convkernels/gpu/mma/filter_gradient.py``): their sm_90 main loop is what issue "Tensor
cores at the vendor's speed" asked for (``ldmatrix`` and ``cp.async``, no 16-bit scalar
shared loads, at least one ``HMMA`` per 4 instructions, no spills), on a fresh build and
in the committed table of every CosmoFlow layer with 32 channels or more; bad tiles are
refused.  (Their CPU verification and planted layout errors: ``tests/test_precision.py``.)"""

import shutil
from pathlib import Path

import pytest

from convbench import registry
from convbench.build import gpubuild, sass
from convbench.layersets.sets import load_layers
from convkernels.gpu.mma import tiles as mma_tiles
from tests.test_pipelined import check_committed_table

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter")
TABLE = ROOT / "results" / "gpu" / "sass" / "mma"
LEAST_HMMA_SHARE = 0.25

needs_tools = pytest.mark.skipif(sass.tool_dir() is None or shutil.which("nvcc") is None,
                                 reason="nvcc or cuobjdump/nvdisasm is not installed")


#: The 32-bit shared loads per HMMA a TF32 build may issue at the defaults (64x64 warp
#: tiles): one per register of an N-major operand, since ``ldmatrix`` cannot transpose
#: 4-byte values: the data gradient's filter (2 per 8-column tile, 8 tiles per 32 MMAs:
#: 0.5), both operands of the filter gradient (1.0).
TF32_LDS_PER_HMMA = {"implicitGemmMMA": 0.0, "implicitGemmMMABwdData": 0.5,
                     "implicitGemmMMABwdFilter": 1.0}
#: The TF32 builds whose operands are all N-major: no ``ldmatrix`` at all.
TF32_WITHOUT_LDSM = {"implicitGemmMMABwdFilter"}


def misses(row) -> list:
    """What a reading row (``gpubuild.kernel_rows`` or a table's) misses of the bar: in
    TF32, the 32-bit loads of its N-major operands in place of ``ldmatrix``."""
    missing = []
    if row["fma_kind"] != "HMMA" or float(row["fma_share"]) < LEAST_HMMA_SHARE:
        missing.append(f"{row['fma_kind']} {row['fma_share']} < {LEAST_HMMA_SHARE}")
    lds32 = float(row[sass._column("LDS")] or 0)
    tf32 = row["dtype"] == "float32-tf32"
    allowed = TF32_LDS_PER_HMMA[row["impl"]] if tf32 else 0.0
    without_ldsm = tf32 and row["impl"] in TF32_WITHOUT_LDSM
    if not int(row["ldgsts"]) or not (float(row["ldsm_per_fma"]) or without_ldsm):
        missing.append("no ldmatrix or no cp.async")
    scalar = sum(float(row[sass._column(w)] or 0) for w in ("LDS.64", "LDS.U16"))
    if scalar or lds32 > allowed:
        missing.append(f"{scalar + lds32} scalar shared loads per HMMA")
    if int(row["spill_stores"]) or int(row["spill_loads"]) or int(row["local"]):
        missing.append("spills or local memory")
    return missing


@needs_tools
@pytest.mark.parametrize("impl, dtype", [
    ("implicitGemmMMA", "float16"),
    pytest.param("implicitGemmMMABwdData", "bfloat16", marks=pytest.mark.full),
    pytest.param("implicitGemmMMABwdFilter", "float16", marks=pytest.mark.full),
    pytest.param("implicitGemmMMABwdFilter", "float32-tf32", marks=pytest.mark.full)])
def test_the_main_loop_feeds_the_tensor_cores(impl, dtype):
    """A fresh build's main loop meets the bar (:func:`misses`): ldmatrix and cp.async,
    TF32's N-major operands through 32-bit loads."""
    layer = next(x for x in load_layers("cosmoflow_mlperf") if x.name == "conv3").with_batch(8)
    probe = gpubuild.probe(impl, "cosmoflow_mlperf", layer,
                           dict(registry.get(impl).resolve_params({})), disassemble=True,
                           dtype=dtype)
    assert not probe.error, probe.error
    main, = [r for r in gpubuild.kernel_rows(probe) if r["main"] == "yes"]
    assert not misses(main), misses(main)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype, suffix", [("float16", ""), ("float32-tf32", "-tf32")])
def test_the_committed_table_covers_every_deep_layer_at_the_defaults(impl, dtype, suffix):
    """``results/gpu/sass/mma/``: the defaults in float16 and in TF32 on every CosmoFlow
    layer with at least 32 input channels (both sets, original batches) meet the bar; a
    change of the defaults without a new table fails here."""
    check_committed_table(impl, TABLE, misses, dtype, suffix)


def test_the_bar_refuses_scalar_loads_beyond_the_tf32_operands():
    """The bar fails a float16 row with 32-bit shared loads or without ldmatrix, a TF32
    forward with any, a TF32 data gradient with more than its filter's or without
    ldmatrix (its A is K-major); it passes the TF32 filter gradient's (no ldmatrix)."""
    row = {"fma_kind": "HMMA", "fma_share": "0.3", "ldsm_per_fma": "0.125", "ldgsts": "8",
           "spill_stores": "0", "spill_loads": "0", "local": "0",
           sass._column("LDS.64"): "0", sass._column("LDS.U16"): "0"}
    for impl, dtype, lds, ldsm, ok in [
            ("implicitGemmMMABwdData", "float32-tf32", "0.5", "0.125", True),
            ("implicitGemmMMABwdData", "float32-tf32", "1.0", "0.125", False),
            ("implicitGemmMMABwdData", "float32-tf32", "0.5", "0", False),  # A needs LDSM
            ("implicitGemmMMABwdData", "float16", "0.5", "0.125", False),
            ("implicitGemmMMA", "float32-tf32", "0.5", "0.25", False),
            ("implicitGemmMMABwdFilter", "float32-tf32", "1.0", "0", True),
            ("implicitGemmMMABwdFilter", "float16", "0", "0", False)]:
        reading = dict(row, impl=impl, dtype=dtype, ldsm_per_fma=ldsm,
                       **{sass._column("LDS"): lds})
        assert (not misses(reading)) == ok, (impl, dtype, lds, ldsm, misses(reading))


@pytest.mark.parametrize("params, words", [
    ({"warpTileM": 128, "warpTileN": 64}, "accumulators"),
    ({"CTAtileK": 8}, "at least 16"),
    ({"stages": 4}, "shared memory"),
    ({"CTAtileM": 256, "warpTileM": 32, "warpTileN": 32}, "threads"),
])
def test_tiles_that_do_not_fit_are_refused(params, words):
    values = dict(registry.get("implicitGemmMMA").resolve_params({}), **params)
    reason = mma_tiles.check_params(values)
    assert reason and words in reason, reason
