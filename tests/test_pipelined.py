"""The pipelined implicit GEMM (:mod:`convkernels.gpu.simt`): planted bugs in its staging and
its stages fail the check on the CPU, and its sm_90 main loop is what the issue asked
for: at least 80% FFMA, at most one shared load per 8 FFMA (128-bit ones), cp.async
copies, no 64-bit integer multiply."""

import csv
import shutil
from pathlib import Path

import pytest

from convbench import registry
from convbench.build import gpubuild, sass, toolchain
from convbench.check import verify
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers
from convkernels.gpu.simt import epilogue, gather, mainloop

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("implicitGemmPipelined", "implicitGemmPipelinedNCDHW")
#: Five channel blocks of the default K tile (one part-filled), padding on every side,
#: an output tile cut short in M and in N, two images.
LAYER = Layer("c36_k70", 2, 36, 70, 5, 6, 7, 3, 3, 3, pad=1)


def plant(monkeypatch, module, function, old, new):
    """Replace ``old`` by ``new`` in the C++ that ``module.<function>`` returns."""
    real = getattr(module, function)

    def planted(*args, **kwargs):
        text = real(*args, **kwargs)
        assert old in text, f"{function} no longer holds {old!r}"
        return text.replace(old, new)
    monkeypatch.setattr(module, function, planted)


#: (name, module, function, old, new): each a bug the CPU check must catch.
BUGS = [
    # reads A from the stage after the one it computes (an off-by-one in the stages)
    ("reads_a_from_the_next_stage", mainloop, "step_code", "As_ + cslot", "As_ + (cslot + 1) % 3"),
    # wraps the stage it computes from one stage early
    ("wraps_the_stages_early", mainloop, "step_code", "cslot = cslot + 1 == 3", "cslot = cslot + 1 == 2"),
    # reads across the w border instead of zero-filling it
    ("ignores_the_w_border", gather, "stage_code", "\n                        && (unsigned)ww < 7u",
     ""),
    # steps over a channel block
    ("skips_channel_blocks", gather, "stage_code", "c0 += 8;", "c0 += 16;"),
    # stores each thread's columns one column off
    ("shifts_the_output_columns", epilogue, "epilogue_code", "tj + c *", "tj + 1 + c *"),
]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_unplanted_kernel_passes(impl, builds, reference):
    check = verify.verify_build(builds(toolchain.make_spec(registry.get(impl), LAYER)),
                                reference(LAYER))[0]
    assert check.ok, check.summary()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bug", BUGS, ids=[b[0] for b in BUGS])
def test_planted_bugs_fail_the_check(monkeypatch, builds, reference, impl, bug):
    name, module, function, old, new = bug
    plant(monkeypatch, module, function, old, new)
    spec = toolchain.make_spec(registry.get(impl), LAYER, planted=name)
    check = verify.verify_build(builds(spec), reference(LAYER))[0]
    assert not check.ok, f"{impl} with {name} passed: {check.summary()}"


def test_tiles_that_do_not_split_over_the_threads_are_refused():
    impl = registry.get("implicitGemmPipelined")
    for bad, word in (({"stages": 5}, "stages"), ({"CTAtileK": 4}, "multiple of 8"),
                      ({"CTAtileM": 256, "threadTileM": 8, "CTAtileN": 16,
                        "threadTileN": 8}, "at least one per row"),
                      ({"CTAtileK": 32, "stages": 4}, "shared memory")):
        with pytest.raises(UsageError, match=word):
            impl.resolve_params(bad)


# -- the machine code -------------------------------------------------------------------------

needs_tools = pytest.mark.skipif(sass.tool_dir() is None or shutil.which("nvcc") is None,
                                 reason="nvcc or cuobjdump/nvdisasm is not installed")

#: What the main loop must be (issue "The GPU main loop that CUTLASS would write").
LEAST_FFMA_SHARE = 0.80
MOST_SHARED_LOADS_PER_FFMA = 1 / 8


def meets(row) -> list:
    """What a reading row (``gpubuild.kernel_rows`` or ``readings.csv``) misses of the
    main loop's bar, as sentences (empty: none)."""
    loads = sum(float(row[sass._column(w)] or 0) for w in sass.LDS_WIDTHS)
    missing = []
    if row["fma_kind"] != "FFMA" or float(row["fma_share"]) < LEAST_FFMA_SHARE:
        missing.append(f"FMA share {row['fma_kind']} {row['fma_share']} < {LEAST_FFMA_SHARE}")
    if loads > MOST_SHARED_LOADS_PER_FFMA:
        missing.append(f"{loads:.3f} shared loads per FFMA")
    if int(row["imad_wide"]):
        missing.append(f"{row['imad_wide']} IMAD.WIDE")
    if int(row["spill_stores"]) or int(row["spill_loads"]) or int(row["local"]):
        missing.append("spills or local memory")
    if not int(row["ldgsts"]) or not float(row["lds128_per_fma"]):
        missing.append("no cp.async or no 128-bit shared loads")
    return missing


#: Fast tier: the NDHWC kernel; full tier: the NCDHW one as well (the same main loop, another
#: gather; both are in the committed table below, which every tier checks).
@needs_tools
@pytest.mark.parametrize("impl, layer_set, name, batch", [
    ("implicitGemmPipelined", "cosmoflow", "conv5", 16),
    pytest.param("implicitGemmPipelinedNCDHW", "cosmoflow_mlperf", "conv3", 8,
                 marks=pytest.mark.full)])
def test_the_default_main_loop_is_mostly_ffma(impl, layer_set, name, batch):
    layer = next(x for x in load_layers(layer_set) if x.name == name).with_batch(batch)
    probe = gpubuild.probe(impl, layer_set, layer, dict(registry.get(impl).resolve_params({})),
                           disassemble=True)
    assert not probe.error, probe.error
    main, = [r for r in gpubuild.kernel_rows(probe) if r["main"] == "yes"]
    assert not meets(main), meets(main)


TABLE = ROOT / "results" / "gpu" / "sass" / "pipelined"


@pytest.mark.parametrize("impl", IMPLS)
def test_the_committed_table_covers_every_deep_layer_at_the_defaults(impl):
    """``results/gpu/sass/pipelined/``: the default configuration on every CosmoFlow
    layer with at least 32 channels (both sets at the original batches) meets the bar;
    a change of the defaults without a new table fails here."""
    check_committed_table(impl)


def check_committed_table(impl, table=TABLE, bar=None, dtype=None, suffix=""):
    """:func:`test_the_committed_table_covers_every_deep_layer_at_the_defaults` for
    ``impl`` (the backward and tensor-core kernels' tests call it too, with their
    ``table`` folder, their ``bar``, the precision read and its files' ``suffix``)."""
    bar = bar or meets
    defaults = ";".join(f"{k}={v}" for k, v in registry.get(impl).resolve_params({}).items())
    for layer_set, batch in (("cosmoflow", 16), ("cosmoflow_mlperf", 8)):
        path = table / f"{impl}-{layer_set}{suffix}.csv"
        rows = {r["layer"]: r for r in csv.DictReader(open(path)) if r["main"] == "yes"}
        for layer in load_layers(layer_set):
            if layer.in_channels < 32:
                continue
            row = rows.get(layer.name)
            assert row is not None, f"{path}: no {layer.name}"
            assert (row["config"], int(row["batch"])) == (defaults, batch), \
                f"{path}: regenerate it (convbench sass {impl} --layer all)"
            assert dtype is None or row["dtype"] == dtype, path
            assert not bar(row), (layer_set, layer.name, bar(row))
