"""Tuned parameters (convbench.tuning), the tuning and CPU benchmark scripts, and the host's
vector ISA (the register-blocked kernels' own tests: tests/test_blocked_kernels.py)."""

import csv as csvmod
import json

import pytest

from cases import FIRST_SMALL, Case, case_params, params_of, verify_case
from conftest import ROOT
from convbench import registry
from convbench.timing import ceilings
from convbench.commands import profile_conv3d as cli
from convbench.build import tuned as tuning
from convbench.commands import bench, tune
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers

BLOCKED = "directConvNDHWCblocked"
DOT = "directConvNDHWCdot"
LAYER = Layer("tt", 2, 3, 32, 6, 6, 8, 3, 3, 3, pad=1)
#: A layer of the fast tier's (tests/cases.py FIRST_SMALL), so that the commands below
#: load builds the session makes anyway (each test declares those it loads).
ONE_LAYER = ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
             "conv1_small,1,1,16,20,20,20,3,3,3,1,1\n")
#: The blocked kernel's default tile on this host (the fast tier's build), and another
#: (one build, shared by the tuned-entry and the tuner tests).
DEFAULT_PIX = registry.get(BLOCKED).resolve_params()["PIX"]
OTHER_PIX = 2 if DEFAULT_PIX != 2 else 4
ON_SMALL = {pix: Case(BLOCKED, FIRST_SMALL, "small", params=params_of({"PIX": pix}))
            for pix in (DEFAULT_PIX, OTHER_PIX)}
#: The ceilings as a stand-in, where a test checks none of them.
CEILINGS = {"peak_gflops": 100.0, "peak_method": "stand-in", "bandwidth_gbs": 10.0,
            "bandwidth_method": "stand-in", "fma_peak_gflops": 200.0,
            "fma_peak_method": "stand-in"}


def _small(*names):
    """The fast tier's builds of ``names`` on FIRST_SMALL."""
    return [Case(name, FIRST_SMALL, "small") for name in names]


@pytest.fixture
def tuning_file(tmp_path, monkeypatch):
    path = tmp_path / "cpu.json"
    monkeypatch.setenv("CONVBENCH_TUNING", str(path))
    return path


def test_precedence_defaults_file_overrides(tuning_file):
    impl = registry.get(BLOCKED)
    assert tuning.tuned_params(impl, LAYER, "cpu") == impl.resolve_params()
    tuning.store("cpu", BLOCKED, LAYER, {"PIX": 8, "NV": 4, "KOUTER": 1}, {"cpu": "test"})
    assert tuning.tuned_params(impl, LAYER, "cpu")["NV"] == 4
    default_nv = impl.resolve_params()["NV"]
    assert default_nv != 4 and tuning.tuned_params(impl, LAYER.with_batch(3), "cpu")["NV"] \
        == default_nv  # other key
    assert tuning.tuned_params(impl, LAYER, "cpu", {"PIX": "12"})["PIX"] == 12
    assert tuning.tuned_params(impl, LAYER, "cpu")["KOUTER"] == 1
    data = json.loads(tuning_file.read_text())
    mine = data["machines"][tuning.machine_id()]
    assert mine["entries"][BLOCKED][LAYER.key()] == {"PIX": 8, "NV": 4, "KOUTER": 1}
    assert mine["machine"] == {"cpu": "test"}


def test_entries_of_another_machine_are_not_used(tuning_file, capsys):
    """Another CPU's entry (of another ISA) is not applied, and a note says so; the older
    file form (no machines) applies to any machine, and storing keeps it under an unknown
    machine.  (One of the same ISA lends its entries: tests/test_autotune.py.)"""
    impl = registry.get(BLOCKED)
    # of another ISA than this host's: a machine of the same one would lend its entries
    isa_elsewhere = "neon" if not tuning.machine_id().endswith("| neon") else "avx2"
    other = {"machines": {f"Other CPU | {isa_elsewhere}": {"entries": {
        BLOCKED: {LAYER.key(): {"PIX": 8}}}}}}
    tuning_file.write_text(json.dumps(other))
    tuning._WARNED.clear()
    assert tuning.tuned_params(impl, LAYER, "cpu") == impl.resolve_params()
    err = capsys.readouterr().err
    assert f"no {BLOCKED} entries for this machine ({tuning.machine_id()})" in err
    tuning_file.write_text(json.dumps({"entries": {BLOCKED: {LAYER.key(): {"PIX": 12}}}}))
    assert tuning.tuned_params(impl, LAYER, "cpu")["PIX"] == 12
    tuning.store("cpu", BLOCKED, LAYER, {"PIX": 4}, {"cpu": "test"})
    data = json.loads(tuning_file.read_text())["machines"]
    assert data[tuning.machine_id()]["entries"][BLOCKED][LAYER.key()] == {"PIX": 4}
    assert any(m.startswith("unknown") and m != tuning.machine_id() for m in data)


def test_bad_tuning_file_is_a_usage_error(tuning_file):
    tuning_file.write_text("{not json")
    with pytest.raises(UsageError, match="tuning file"):
        tuning.tuned_params(registry.get(BLOCKED), LAYER, "cpu")
    tuning_file.write_text(json.dumps({"entries": {BLOCKED: {LAYER.key(): {"PIX": 0}}}}))
    with pytest.raises(UsageError, match="PIX must be >= 1"):
        tuning.tuned_params(registry.get(BLOCKED), LAYER, "cpu")


def test_tuning_off(monkeypatch):
    monkeypatch.setenv("CONVBENCH_TUNING", "off")
    assert tuning.tuning_file("cpu") is None
    assert tuning.tuned_entry(BLOCKED, LAYER, "cpu") == {}


@pytest.mark.prebuild(*ON_SMALL.values())
def test_cli_builds_with_the_tuned_entry(tuning_file, tmp_path, builds, cachedir, capsys):
    csv = tmp_path / "one.csv"
    csv.write_text(ONE_LAYER)
    layer = load_layers(str(csv))[0]
    tuning.store("cpu", BLOCKED, layer, {"PIX": OTHER_PIX}, {"cpu": "test"})  # not the default
    args = ["--implementation", BLOCKED, "--verify", "--device", "cpu", "--paramscsv", str(csv),
            "--cachedir", str(cachedir), "--loadprecompiled"]  # the session's builds
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"params PIX={OTHER_PIX}," in out and "PASS" in out
    assert cli.main(args + ["--param", f"PIX={DEFAULT_PIX}"]) == 0
    assert "params PIX" not in capsys.readouterr().out  # --param wins: the defaults


# -- the committed tuning file ----------------------------------------------------------------

def _committed():
    path = ROOT / "tuning" / "cpu.json"
    data = json.loads(path.read_text()) if path.is_file() else {"machines": {}}
    from convbench.network import cosmoflow as network
    layers = [layer for s in ("cosmoflow", "cosmoflow_mlperf") for layer in load_layers(s)]
    layers += [layer for spec in network.MODELS.values() for size in (64, 128)
               for layer in network.conv_layers(spec, size, 1)]  # the end-to-end networks'
    keys = {layer.with_batch(b).key(): layer.with_batch(b)
            for layer in layers for b in (1, 2, 4, 8, 16)}
    return [(impl, keys.get(key), key, params) for machine in data["machines"].values()
            for impl, entries in machine["entries"].items() for key, params in entries.items()]


def test_committed_entries_name_real_layers_and_valid_params():
    for impl_name, layer, key, params in _committed():
        impl = registry.get(impl_name)
        assert layer is not None, f"{impl_name}: {key} is no CosmoFlow (set or network) layer"
        impl.resolve_params(params, source="tuning/cpu.json")


TUNED = [Case(impl, layer, "tuned", params=params_of(params))
         for impl, layer, _, params in _committed() if layer is not None]


@pytest.mark.parametrize("case", case_params([], TUNED))
def test_every_tuned_configuration_verifies(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


# -- the tools (convbench.commands; in this process: their main(argv)) -------------------------

@pytest.mark.prebuild(*_small(BLOCKED, "implicitGemm", "im2colGemm"))
def test_bench_cpu_small_set(tmp_path, builds, cachedir, capsys):
    csv = tmp_path / "small.csv"
    csv.write_text(ONE_LAYER)
    out = tmp_path / "bench"
    status = bench.main([
        "--paramscsv", str(csv), "--batch", "1", "--impls", f"{BLOCKED},implicitGemm,im2colGemm",
        "--samples", "5", "--warmup", "1", "--outdir", str(out), "--cachedir", str(cachedir),
        "--skip-slower", "1000", "--rounds", "2"])  # screening depends on the load: not tested
    stdout, stderr = capsys.readouterr()
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    assert stdout.strip().splitlines()[-1].startswith("max best/torch ratio: ")
    assert "timing rule: torch and DaCe allocate their output on every call" in stdout
    table = (out / "table.md").read_text()
    assert table.count("\n") == 3 and "im2colGemm (MKL) ms" in table  # a row for the layer
    assert "ratio (median of 2) | min-max" in table
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["timing"]["rounds"] == 2 and "allocate" in meta["timing"]["outputs"]
    rounds = meta["layers"]["small/conv1_small"]["rounds"]
    assert len(rounds) == 2 and all(r["ratio"] > 0 for r in rounds)
    per_round = (out / "rounds.csv").read_text().splitlines()
    assert per_round[0] == "layer,round,backend,median_ms,torch_layout,best,ratio"
    assert {line.split(",")[1] for line in per_round[1:]} == {"1", "2"}
    # each backend has its samples of both rounds
    samples = [r for r in csvmod.DictReader((out / "samples.csv").open())
               if r["layer"] == "conv1_small" and r["backend"] == BLOCKED]
    assert len(samples) == 10
    assert meta["status"] == "complete" and meta["ceilings"]["peak_gflops"] > 0
    assert meta["ceilings"]["fma_peak_gflops"] > 0 and "% of FMA peak" in table
    assert meta["layers"]["small/conv1_small"][BLOCKED]["verified"] is True
    summary = (out / "summary.csv").read_text()
    for backend in ("torch", "torch-ncdhw", "torch-ndhwc", BLOCKED, "implicitGemm"):
        assert f",{backend}," in summary, backend


@pytest.mark.prebuild(*_small("directConvNDHWCblockedBwdData", "directConvNDHWCdotBwdData",
                              "directConvNDHWCblockedBwdFilter"))
def test_bench_cpu_backward_passes(tmp_path, builds, cachedir, capsys, tuning_file,
                                   monkeypatch):
    """--pass bwd_data,bwd_filter: one table and one ratio line per pass, against torch's
    gradients (verified kernels only); --store records each layer's winner, which the
    end-to-end network then takes by default.  (The ceilings, measured once per pass, are
    checked by test_bench_cpu_small_set: a stand-in here.)"""
    from convbench.network import cosmoflow as network
    from convkernels.layouts import Pass
    monkeypatch.setattr(ceilings, "measure", lambda device: dict(CEILINGS))
    csv = tmp_path / "small.csv"
    csv.write_text(ONE_LAYER)
    out = tmp_path / "bench"
    data_impls = ("directConvNDHWCblockedBwdData", "directConvNDHWCdotBwdData")
    status = bench.main([
        "--paramscsv", str(csv), "--batch", "1", "--pass", "bwd_data,bwd_filter",
        "--impls", ",".join(data_impls + ("directConvNDHWCblockedBwdFilter",)),
        "--samples", "5", "--warmup", "1", "--outdir", str(out), "--cachedir", str(cachedir),
        "--skip-slower", "1000", "--store"])
    stdout, stderr = capsys.readouterr()
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    ratios = [line for line in stdout.splitlines() if line.startswith("max best/torch ratio: ")]
    assert [r.rsplit(" ", 1)[-1] for r in ratios] == ["(bwd_data)", "(bwd_filter)"], ratios
    for pass_, name in (("bwd_data", "directConvNDHWCblockedBwdData"),
                        ("bwd_filter", "directConvNDHWCblockedBwdFilter")):
        meta = json.loads((out / pass_ / "metadata.json").read_text())
        assert meta["bench_pass"] == pass_ and meta["layers"]["small/conv1_small"][name]["verified"]
        assert (out / pass_ / "table.md").is_file()
    best = json.loads(tuning_file.read_text())["machines"][tuning.machine_id()]["best"]
    for layer in load_layers(str(csv)):
        layer = layer.with_batch(1)
        stored = best["bwd_data"][layer.key()]
        assert stored in data_impls
        assert network.default_implementation(layer, Pass.BWD_DATA, "cpu") == stored
        assert network.default_implementation(layer.with_batch(3), Pass.BWD_DATA, "cpu") == \
            registry.default("network-cpu", Pass.BWD_DATA)  # no winner stored: the blocked kernel
    assert network.default_implementation(layer, Pass.BWD_DATA, "gpu") == \
        registry.default("network", Pass.BWD_DATA)  # the GPU takes no CPU winner


def test_fma_peak_probe(monkeypatch):
    from convbench.timing import ceilings
    assert ceilings.cpu_fma_peak(1) > 0
    monkeypatch.setenv("PATH", "/nonexistent")  # no compiler: no number, and no error
    assert ceilings.cpu_fma_peak(1) is None


@pytest.mark.parametrize("args,words", [(["--samples", "3"], "--samples: must be an integer >= 5"),
                                        (["--rounds", "0"], "--rounds"),
                                        (["--heap", "hot"], "--heap: unknown policy 'hot'"),
                                        (["--impls", "implicitGemmBwdData"], "computes bwd_data, not fwd"),
                                        (["--pass", "bwd"], "--pass: unknown pass 'bwd'"),
                                        (["--batch", "0"], "--batch")])
def test_bench_cpu_bad_input(args, words, capsys):
    assert bench.main(args) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_cpu.py: error: ") and words in err[0], err
    assert out == ""


def test_bench_info_says_why_a_build_is_not_timed():
    """One metadata entry per implementation; a progress line only for a build that is
    not timed, with the reason."""
    from types import SimpleNamespace

    from convbench.experiment.pipeline import Record
    from convbench.layersets.layer import Layer
    info = bench.Bench._info
    layer = Layer("l", 1, 2, 2, 4, 4, 4, 3, 3, 3, pad=1)

    def record(status, reason="", checks=()):
        r = Record(0, layer, "impl", "fwd", "cpu", {"PIX": 2}, status=status, reason=reason,
                   build_origin="loaded", build_seconds=0.5)
        r.checks = list(checks)
        return r
    call = SimpleNamespace(first_ms=120.0)
    assert info(record("unsupported", "stride 2"), None) == (
        {"status": "unsupported", "reason": "stride 2"}, None)
    meta, line = info(record("skipped", "first call 9.0x torch's"), call)
    assert meta["status"].startswith("skipped") and line == "120 ms, skipped (first call 9.0x torch's)"
    meta, line = info(record("error", "RuntimeError: boom"), call)
    assert meta["status"] == "error: RuntimeError: boom" and "not timed" in line
    wrong = SimpleNamespace(ok=False, worst_ratio=31.0, max_rel=1e-3, summary=lambda: "err/tol 31")
    meta, line = info(record("failed", checks=[wrong]), call)
    assert meta["status"] == "wrong" and line == "WRONG (err/tol 31), not timed"
    right = SimpleNamespace(ok=True, worst_ratio=0.1, max_rel=2e-7, summary=lambda: "err/tol 0.1")
    meta, line = info(record("passed", checks=[right]), call)
    assert line is None and meta["verified"] and meta["first_call_ms"] == 120.0
    assert meta["max_rel_error"] == 2e-7  # the bench table's error column


@pytest.mark.prebuild(*ON_SMALL.values())
def test_tune_cpu_stores_the_winner(tmp_path, builds, cachedir, monkeypatch, capsys):
    csv = tmp_path / "small.csv"
    csv.write_text(ONE_LAYER)
    store = tmp_path / "tuned.json"
    monkeypatch.setenv("CONVBENCH_TUNING", str(store))
    status = tune.main(["--paramscsv", str(csv), "--batch", "1", "--space",
                        f"PIX={OTHER_PIX},{DEFAULT_PIX}", "--samples", "2", "--store", "--out",
                        str(tmp_path / "t.json"), "--cachedir", str(cachedir)])
    stdout, stderr = capsys.readouterr()
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    entries = json.loads(store.read_text())["machines"][tuning.machine_id()]["entries"][BLOCKED]
    assert list(entries) == [FIRST_SMALL.key()]
    assert all(e["PIX"] in ON_SMALL for e in entries.values())
    records = json.loads((tmp_path / "t.json").read_text())["records"]
    assert len(records) == 2 and all(r["ok"] for r in records)
    assert tune.main(["--space", "PIX=0", "--cachedir", str(cachedir)]) == 2
    assert "PIX must be >= 1" in capsys.readouterr().err


# -- the host's vector ISA sizes the micro-tiles ------------------------------------------------

def test_isa_widths_and_budgets():
    from convkernels.cpu import isa
    assert isa.widest_of("fpu sse4_2 avx avx2 fma".split()) == "avx2"
    assert isa.widest_of("avx2 avx512f avx512bw".split()) == "avx512f"
    assert isa.widest_of(["fpu"]) == "scalar"
    assert (isa.vector_floats("avx512f"), isa.vector_floats("avx2"), isa.vector_floats("sse4_2")) \
        == (16, 8, 4)
    assert (isa.accumulator_budget("avx512f"), isa.accumulator_budget("avx2")) == (28, 12)
    assert isa.registers_per_vector(16, "avx2") == 2 and isa.registers_per_vector(16, "avx512f") == 1
    assert isa.fit_tile(8, 2, "avx512f") == 2 and isa.fit_tile(8, 2, "avx2") == 1
    assert isa.fit_tile(4, 4, "avx2") == 2 and isa.fit_tile(16, 1, "avx2") == 1
    assert isa.fit_pixels(8, 2, "avx512f") == 8 and isa.fit_pixels(8, 2, "avx2") == 4
    assert isa.fit_pixels(16, 1, "avx2") == 8 and isa.fit_pixels(1, 16, "avx2") == 1


def test_blocked_default_tiles_keep_two_vectors_per_broadcast():
    """Two filter vectors per broadcast input, the pixels cut to fit this CPU's registers
    (8 x 2 with AVX-512, 4 x 2 with AVX2: on the AVX2 EPYC 4 x 2 beat 8 x 1 by 1.2-1.8x on
    the CosmoFlow forward layers, once the filter vectors stayed in registers)."""
    from convkernels.cpu import isa
    layer = load_layers("cosmoflow_mlperf")[2].with_batch(2)
    for name in (BLOCKED, "directConvNDHWCblockedBwdData"):
        impl = registry.get(name)
        params = impl.resolve_params()
        assert (params["PIX"], params["NV"]) == (isa.fit_pixels(8, 2), 2), name
        assert impl.registers(layer, params) == params["PIX"] * 2 <= isa.accumulator_budget()


def test_channel_vectors_default_to_this_cpu():
    from convkernels.cpu import isa
    lanes = isa.vector_floats()
    for name, param in ((BLOCKED, "NB"), ("directConvNDHWCblockedBwdData", "NB"),
                        ("directConvNDHWCblockedBwdFilter", "NB"), (DOT, "CV"),
                        ("directConvNDHWCdotBwdData", "CV")):
        impl = registry.get(name)
        params = impl.resolve_params()
        assert params[param] == lanes, name
        layer = load_layers("cosmoflow_mlperf")[2].with_batch(2)
        assert impl.registers(layer, params) <= isa.accumulator_budget(), name  # no spills


@pytest.mark.parametrize("host,registers", [("avx512f", 16), ("avx2", 32)])
def test_tile_registers_count_vectors_wider_than_the_cpu(host, registers, monkeypatch):
    from convkernels.cpu import isa
    monkeypatch.setattr(isa, "widest_isa", lambda: host)
    impl = registry.get(BLOCKED)
    layer = load_layers("cosmoflow_mlperf")[2].with_batch(2)
    # 8 pixels x 2 vectors of 16 floats: 16 zmm, or 32 ymm (two per vector)
    assert impl.registers(layer, impl.resolve_params({"PIX": 8, "NB": 16, "NV": 2})) == registers


def test_tuner_leaves_out_tiles_that_spill(monkeypatch):
    from convkernels.cpu import isa
    monkeypatch.setattr(isa, "widest_isa", lambda: "avx2")
    impl = registry.get(BLOCKED)
    layer = load_layers("cosmoflow_mlperf")[2].with_batch(2)
    configs = tune.parse_space("NB=8;PIX=4,8;NV=1,2,4", impl)
    kept, spilled = tune.within_registers(impl, layer, configs)
    assert sorted((p["PIX"], p["NV"]) for p in kept) == [(4, 1), (4, 2), (8, 1)]
    assert spilled == 3
    # if every configuration spills, the smallest is still tried
    kept, spilled = tune.within_registers(impl, layer, tune.parse_space("NB=16;PIX=8;NV=2,4", impl))
    assert [(p["NB"], p["NV"]) for p in kept] == [(16, 2)] and spilled == 1


def test_fma_probe_fits_the_registers(monkeypatch):
    from convbench.timing import ceilings
    from convkernels.cpu import isa
    for host, lanes, chains in (("avx512f", 16, 12), ("avx2", 8, 12), ("sse4_2", 4, 12)):
        monkeypatch.setattr(isa, "widest_isa", lambda host=host: host)
        text = ceilings.fma_source()
        assert f"#define LANES {lanes}\n" in text and f"#define CHAINS {chains}\n" in text
        assert chains + 2 <= isa.vector_registers(host)  # the chains, b and c in registers


@pytest.mark.parametrize("name", sorted(n for n, i in registry.all_implementations().items()
                                         if i.search_space))
def test_default_spaces_name_parameters_that_exist(name):
    """Every default search space parses for its implementation: a misspelt or removed
    parameter there would only surface when someone runs the search."""
    space = registry.get(name).search_space
    configs = tune.parse_space(space, registry.get(name))
    axes = [part.partition("=")[0] for part in space.split(";")]
    assert configs and all(set(axes) <= set(c) for c in configs)


def test_the_confirmation_times_the_finalists_in_turn():
    """The tuner's winner comes from the finalists timed again in turn (``--confirm``): a
    configuration whose sweep median came from a fast moment (1.0 ms, 2.0 ms whenever
    timed again) loses to one that is steadily 1.5 ms; every finalist is timed once per
    round, in a rotated order, and the defaults are among them."""
    import types

    from convbench.commands import tune as tune_cmd
    speed = {1: 2.0, 2: 1.5, 3: 1.7, 4: 3.0, 5: 2.5}
    order = []

    def run_case(impl, layer, params, **kwargs):
        order.append(params["X"])
        timing = types.SimpleNamespace(samples_ms=[speed[params["X"]]] * 3)
        return types.SimpleNamespace(checks=[types.SimpleNamespace(ok=True)],
                                     measurements=[types.SimpleNamespace(timing=timing)])

    results = [{"params": {"X": x}, "median_ms": m}
               for x, m in ((1, 1.0), (2, 1.5), (3, 1.6), (4, 2.9), (5, 2.6))]
    base = results[4]  # the defaults, not among the 3 fastest
    tune_cmd.confirm(types.SimpleNamespace(run_case=run_case), None, None, None, results,
                     base, rounds=3)
    assert order == [1, 2, 3, 5, 2, 3, 5, 1, 3, 5, 1, 2]
    best = min((r for r in results if "confirmed_ms" in r), key=lambda r: r["confirmed_ms"])
    assert best["params"] == {"X": 2} and "confirmed_ms" not in results[3]
    assert base["confirmed_ms"] == 2.5 and len(base["confirmed_samples_ms"]) == 9


@pytest.mark.parametrize("args, words", [(["--confirm", "-1"], "--confirm: must be an integer >= 0"),
                                         (["--samples", "0"], "--samples: must be an integer >= 1")])
def test_tune_bad_input(args, words, capsys):
    from convbench.commands import tune as tune_cmd
    assert tune_cmd.main(["--paramscsv", "cosmoflow"] + args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
