"""The tensor-core kernels (``impls/_mma.py``, ``impls/_mma_wgrad.py``): their sm_90 main loop is what issue "Tensor
cores at the vendor's speed" asked for (``ldmatrix`` and ``cp.async``, no 16-bit scalar
shared loads, at least one ``HMMA`` per 4 instructions, no spills), on a fresh build and
in the committed table of every CosmoFlow layer with 32 channels or more; bad tiles are
refused.  (Their CPU verification and planted layout errors: ``tests/test_precision.py``.)"""

import shutil
from pathlib import Path

import pytest

from convbench import gpubuild, registry, sass
from convbench.layersets import load_layers
from impls import _mma
from tests.test_pipelined import check_committed_table

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter")
TABLE = ROOT / "results" / "gpu" / "sass" / "mma"
LEAST_HMMA_SHARE = 0.25

needs_tools = pytest.mark.skipif(sass.tool_dir() is None or shutil.which("nvcc") is None,
                                 reason="nvcc or cuobjdump/nvdisasm is not installed")


def misses(row) -> list:
    """What a reading row (``gpubuild.kernel_rows`` or a table's) misses of the bar."""
    missing = []
    if row["fma_kind"] != "HMMA" or float(row["fma_share"]) < LEAST_HMMA_SHARE:
        missing.append(f"{row['fma_kind']} {row['fma_share']} < {LEAST_HMMA_SHARE}")
    if not float(row["ldsm_per_fma"]) or not int(row["ldgsts"]):
        missing.append("no ldmatrix or no cp.async")
    scalar = sum(float(row[sass._column(w)] or 0) for w in ("LDS", "LDS.64", "LDS.U16"))
    if scalar:
        missing.append(f"{scalar} scalar shared loads per HMMA")
    if int(row["spill_stores"]) or int(row["spill_loads"]) or int(row["local"]):
        missing.append("spills or local memory")
    return missing


@needs_tools
@pytest.mark.parametrize("impl, dtype", [
    ("implicitGemmMMA", "float16"),
    pytest.param("implicitGemmMMABwdData", "bfloat16", marks=pytest.mark.full),
    pytest.param("implicitGemmMMABwdFilter", "float16", marks=pytest.mark.full)])
def test_the_main_loop_feeds_the_tensor_cores_through_ldmatrix(impl, dtype):
    layer = next(x for x in load_layers("cosmoflow_mlperf") if x.name == "conv3").with_batch(8)
    probe = gpubuild.probe(impl, "cosmoflow_mlperf", layer,
                           dict(registry.get(impl).resolve_params({})), disassemble=True,
                           dtype=dtype)
    assert not probe.error, probe.error
    main, = [r for r in gpubuild.kernel_rows(probe) if r["main"] == "yes"]
    assert not misses(main), misses(main)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_committed_table_covers_every_deep_layer_at_the_defaults(impl):
    """``results/gpu/sass/mma/``: the defaults in float16 on every CosmoFlow layer with at
    least 32 input channels (both sets, original batches) meet the bar; a change of the
    defaults without a new table fails here."""
    check_committed_table(impl, TABLE, misses, "float16")


@pytest.mark.parametrize("params, words", [
    ({"warpTileM": 128, "warpTileN": 64}, "accumulators"),
    ({"CTAtileK": 8}, "at least 16"),
    ({"stages": 4}, "shared memory"),
    ({"CTAtileM": 256, "warpTileM": 32, "warpTileN": 32}, "threads"),
])
def test_tiles_that_do_not_fit_are_refused(params, words):
    values = dict(registry.get("implicitGemmMMA").resolve_params({}), **params)
    reason = _mma.check_params(values)
    assert reason and words in reason, reason
