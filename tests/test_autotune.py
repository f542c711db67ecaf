"""Fast on a machine never seen: the choice by rule, the nearest machine's parameters, the
quick autotune (convbench.tuning.autotune) and its store-then-reuse, the ISA cap, and the
toolchain's chatter kept off the terminal (convbench.build.chatter)."""

import json
import warnings

import pytest

from convbench import registry
from convbench.tuning import autotune
from convbench.build import chatter, toolchain, tuned as tuning
from convbench.network import end2end, cosmoflow as network
from convkernels.cpu import isa
from convbench.commands import tune as tune_command
from convbench.layersets.layer import Layer
from convkernels.layouts import Pass

BLOCKED = "directConvNDHWCblocked"
MLPERF64 = network.conv_layers(network.MODELS["mlperf"], 64, 2)
#: A layer of the rules' both kinds of kernel, small enough to build and time in seconds.
SMALL = Layer("at_small", 1, 16, 16, 6, 6, 6, 3, 3, 3, pad=1)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A tuning file of our own and a machine key set by ``machine(key)``."""
    path = tmp_path / "cpu.json"
    monkeypatch.setenv("CONVBENCH_TUNING", str(path))
    monkeypatch.setattr(tuning, "_SAID", set())
    monkeypatch.setattr(tuning, "_WARNED", set())

    def set_key(key, target_env=tuning.MACHINE_ENV):
        monkeypatch.setenv(target_env, key)
        tuning.machine_id.cache_clear()
        return path
    yield set_key
    tuning.machine_id.cache_clear()


def _write(path, machines):
    path.write_text(json.dumps({"machines": machines}))


# -- choice by rule ------------------------------------------------------------------------------

def test_an_unseen_machine_chooses_by_rule(machine):
    """No entries anywhere: Winograd where its rule applies (the deep 3x3x3 layers), the
    few-channel forward on conv1, the blocked direct kernels elsewhere (a filter gradient
    over 32^3 outputs per sample, strides), each said to be chosen by its rule."""
    machine("unseen CPU | avx512f")
    conv1, conv2 = MLPERF64[0], MLPERF64[1]
    assert network.default_choice(conv1, Pass.FWD, "cpu") == ("directConvNDHWCfew",
                                                              "rule few-channels")
    assert network.default_choice(conv2, Pass.FWD, "cpu") == ("winogradF2", "rule winograd-3x3x3")
    assert network.default_choice(conv2, Pass.BWD_DATA, "cpu")[0] == "winogradF2BwdData"
    # the data gradient sums over the 32 output channels: Winograd for 4 input channels too
    assert network.default_choice(conv1, Pass.BWD_DATA, "cpu") == (
        "winogradF2BwdData", "rule winograd-3x3x3-data")
    assert network.default_choice(conv2, Pass.BWD_FILTER, "cpu") == (
        "winogradF2BwdFilter", "rule winograd-3x3x3-filter")
    big = network.conv_layers(network.MODELS["mlperf"], 128, 2)[1]  # 64^3 outputs
    assert network.default_choice(big, Pass.BWD_FILTER, "cpu")[1] == "rule direct-blocked"
    strided = Layer("s2", 1, 32, 32, 9, 9, 9, 3, 3, 3, stride=2, pad=1)  # Winograd refuses
    assert network.default_choice(strided, Pass.FWD, "cpu") == (BLOCKED, "rule direct-blocked")
    choice, how = network.choose_explained(MLPERF64, None, need_backward=True)
    assert choice["conv3"][Pass.FWD] == "winogradF2" and how["conv3"][Pass.FWD].startswith("rule")
    assert network.choose_explained(MLPERF64, "implicitGemm")[1]["conv2"][Pass.FWD] == "--impl"


def test_a_measured_winner_goes_before_the_rule(machine):
    path = machine("unseen CPU | avx512f")
    conv2 = MLPERF64[1]
    tuning.store_best("cpu", "fwd", conv2, BLOCKED, {"cpu": "test"})
    assert network.default_choice(conv2, Pass.FWD, "cpu") == (BLOCKED, "measured here")
    # the winner was timed in float32: it does not decide a bfloat16 run
    from convbench.build import precision
    from convbench.experiment import choice
    assert choice.default_choice(conv2, Pass.FWD, "cpu", precision.get_dtype("bfloat16"))[1] \
        .startswith("rule")
    machine("another unseen CPU | avx512f")  # another machine's winner is not taken
    assert network.default_choice(conv2, Pass.FWD, "cpu")[0] == "winogradF2"
    assert path.is_file()


def test_rules_rank_and_registry_checks():
    layer = MLPERF64[2]
    impl, rule = registry.by_rule(Pass.FWD, layer, "cpu")
    assert impl.name == "directConvNDHWCamx" and rule.rank == 3  # bfloat16 on AMX
    float32 = lambda i: "float32" in i.precisions  # noqa: E731
    impl, rule = registry.by_rule(Pass.FWD, layer, "cpu", float32)
    assert impl.name == "winogradF2" and rule.rank == 2
    impl, rule = registry.by_rule(Pass.FWD, layer, "cpu",
                                  lambda i: float32(i) and i.name != "winogradF2")
    assert impl.name == BLOCKED and rule.name == "direct-blocked"
    assert registry.by_rule(Pass.FWD, layer, "gpu") is None
    with pytest.raises(ValueError, match="unknown target"):
        registry.Rule("r", "t", lambda layer: True, target="tpu")
    listing = registry.format_listing({"winogradF2": registry.get("winogradF2")})
    assert "rule (cpu, rank 2): winograd-3x3x3:" in listing


# -- the nearest machine -------------------------------------------------------------------------

def test_the_nearest_machine_of_the_same_isa_lends_its_parameters(machine, capsys):
    """Made-up vendors, so that no real host's own key (hidden when the key is set by
    hand) is among them."""
    layer, other = SMALL, SMALL.with_batch(3)
    path = machine("Acme X (family 25 model 17) | avx512f")
    _write(path, {"Zeta Y (family 6 model 143) | avx512f": {"entries": {
                      BLOCKED: {layer.key(): {"PIX": 2}, other.key(): {"PIX": 2}}}},
                  "Acme X (family 26 model 2) | avx512f": {"entries": {
                      BLOCKED: {layer.key(): {"PIX": 4}}}},
                  "Acme X (family 25 model 1) | avx2": {"entries": {
                      BLOCKED: {layer.key(): {"PIX": 8}}}}})
    impl = registry.get(BLOCKED)
    assert tuning.nearest_machines("cpu") == ["Acme X (family 26 model 2) | avx512f",
                                             "Zeta Y (family 6 model 143) | avx512f"]
    assert tuning.tuned_params(impl, layer, "cpu")["PIX"] == 4
    err = capsys.readouterr().err
    assert "nearest machine with the same ISA that has them, Acme X (family 26 model 2)" in err
    # the nearest has no entry for this layer: the next of the same ISA that has one
    assert tuning.tuned_params(impl, other, "cpu")["PIX"] == 2
    machine("Zeta Z (family 6 model 150) | avx512f")  # same vendor first
    assert tuning.tuned_params(impl, layer, "cpu")["PIX"] == 2
    machine("Acme X (family 25 model 3) | avx2")  # the same ISA only
    assert tuning.tuned_params(impl, layer, "cpu")["PIX"] == 8
    machine("Some CPU | sse4_2")  # none of its ISA: the defaults, and a note says so
    assert tuning.nearest_machine("cpu") is None
    assert tuning.tuned_params(impl, layer, "cpu") == impl.resolve_params()
    assert "their defaults are used" in capsys.readouterr().err
    machine("Acme X (family 26 model 2) | avx512f")  # its own entry, not a neighbour's
    tuning.store("cpu", BLOCKED, layer, {"PIX": 16}, {"cpu": "test"})
    assert tuning.tuned_params(impl, layer, "cpu")["PIX"] == 16


def test_a_machine_key_set_by_hand_hides_the_hosts_own_entries(machine, monkeypatch):
    """Pretending to be an unseen machine must not borrow this host's own entries as the
    nearest machine's (the measurement of a machine with no entries relies on it)."""
    monkeypatch.delenv(tuning.MACHINE_ENV, raising=False)
    tuning.machine_id.cache_clear()
    host = tuning.machine_id()
    widest = host.rsplit("| ", 1)[1]
    path = machine(f"unseen CPU | {widest}")
    # the host first in the file and the decoy no nearer (another vendor and family):
    # were the host not hidden, it would be the nearest
    _write(path, {host: {"entries": {BLOCKED: {SMALL.key(): {"PIX": 16}}}},
                  f"Zeta CPU (family 99 model 99) | {widest}": {"entries": {
                      BLOCKED: {SMALL.key(): {"PIX": 4}}}}})
    assert tuning.nearest_machines("cpu") == [f"Zeta CPU (family 99 model 99) | {widest}"]
    assert tuning.tuned_params(registry.get(BLOCKED), SMALL, "cpu")["PIX"] == 4
    assert {"PIX": 16} not in tuning.entries_elsewhere(BLOCKED, SMALL, "cpu")


def test_the_nearest_gpu_is_one_of_the_same_architecture(machine):
    path = machine("NVIDIA H100 80GB HBM3 (CUDA 13.0)", tuning.GPU_ENV)  # $CONVBENCH_TUNING
    _write(path, {"NVIDIA A100-SXM4-80GB (CUDA 13.0)": {}, "NVIDIA H200 (CUDA 12.8)": {},
                  "NVIDIA H200 (CUDA 13.0)": {}})
    assert tuning.gpu_architecture("NVIDIA H100 80GB HBM3 (CUDA 13.0)") == "sm_90"
    assert tuning.nearest_machine("gpu") == "NVIDIA H200 (CUDA 13.0)"
    machine("NVIDIA L4 (CUDA 13.0)", tuning.GPU_ENV)
    assert tuning.nearest_machine("gpu") is None


# -- the quick autotune --------------------------------------------------------------------------

def test_quick_autotune_stores_the_verified_winner_and_a_second_run_reuses_it(
        machine, cachedir, capsys, monkeypatch):
    """On a small layer: both candidates built, verified and timed; the faster stored with
    its parameters; the choice then says "measured here".  A candidate made 1% wrong (and
    made the fastest) is never stored."""
    path = machine("autotune test CPU | avx512f")
    from convbench.experiment.pipeline import Experiment
    original = Experiment.run_case

    def planted(self, impl, layer, *args, **kwargs):
        if impl.name == "winogradF2":  # 1% off: fails its check however fast it is
            kwargs["tamper"] = lambda y: y * 1.01
        return original(self, impl, layer, *args, **kwargs)
    monkeypatch.setattr(Experiment, "run_case", planted)
    result = autotune.tune([(SMALL, Pass.FWD)], 5, cachedir=cachedir, threads=2)
    text = capsys.readouterr().out
    assert "autotune: 1 layer-passes, 2 candidates" in text and "build 2/2" in text
    assert result["winners"][f"{SMALL.key()}/fwd"][0] == BLOCKED
    wrong = [c for c in result["candidates"] if c["implementation"] == "winogradF2"]
    assert wrong and wrong[0]["ok"] is False
    stored = json.loads(path.read_text())["machines"]["autotune test CPU | avx512f"]
    assert stored["best"]["fwd"][SMALL.key()] == BLOCKED
    assert "winogradF2" not in stored["entries"]
    assert network.default_choice(SMALL, Pass.FWD, "cpu") == (BLOCKED, "measured here")
    won = result["winners"][f"{SMALL.key()}/fwd"][1]
    assert stored["entries"][BLOCKED][SMALL.key()] == won
    assert tuning.tuned_params(registry.get(BLOCKED), SMALL, "cpu") == won


@pytest.mark.parametrize("args, words", [
    (["--autotune", "abc"], "--autotune: expected minutes"),
    (["--autotune", "0"], "--autotune: expected minutes"),
    (["--autotune", "inf"], "--autotune: expected minutes"),
])
def test_a_bad_autotune_budget_is_one_line(args, words, capsys):
    assert end2end.main(["--device", "cpu", "--size", "32"] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


@pytest.mark.parametrize("args, words", [
    (["--quick", "cosmoflow", "--budget", "-1"], "--budget: expected minutes"),
    (["--quick", "cosmoflow", "--passes", "fwd,up"], "--passes: expected names"),
    (["--budget", "3"], "--budget: only with --quick"),
    (["--quick", "cosmoflow", "--implementation", BLOCKED], "--quick: takes its layer sets"),
])
def test_tune_quick_bad_input_is_one_line(args, words, capsys):
    assert tune_command.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


# -- the ISA cap ---------------------------------------------------------------------------------

def test_the_isa_cap_narrows_kernels_key_and_compiler(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(isa.ISA_ENV, "avx2")
    tuning.machine_id.cache_clear()
    try:
        assert isa.widest_isa() in ("avx2", "avx", "sse4_2", "scalar")
        if "avx2" in isa.cpu_flags():
            assert isa.widest_isa() == "avx2" and isa.vector_floats() == 8
            assert tuning.machine_id().endswith("| avx2")
        assert not any(f.startswith("avx512") for f in isa.cpu_flags())
        args = toolchain.dace_settings("cpu", toolchain.PROJECT_ROOT)[("compiler", "cpu", "args")]
        if toolchain._native_target().get("-mavx512f") == "[enabled]":
            assert "-mno-avx512f" in args and "-mprefer-vector-width=512" not in args
        monkeypatch.setenv(isa.ISA_ENV, "avx1024")
        with pytest.raises(isa.IsaCapError, match="unknown ISA"):
            isa.widest_isa()
        assert end2end.main(["--device", "cpu", "--size", "32", "--iters", "0", "--check",
                             "--outdir", str(tmp_path)]) == 2
        assert "$CONVBENCH_ISA: unknown ISA 'avx1024'" in capsys.readouterr().err
    finally:
        tuning.machine_id.cache_clear()


# -- quiet by default ----------------------------------------------------------------------------

def test_a_build_keeps_the_toolchains_warnings_off_the_terminal(tmp_path, capfd, monkeypatch):
    """A fresh build of a blocked kernel raises DaCe's memlet warnings: by default they go
    to the build folder's log and the run's log, not to the terminal; with -v they are
    raised as usual (the control: without it, the test could not fail).  The first
    build also shows that capturing does not hide its warnings from pytest: none may
    reach its recorder either."""
    monkeypatch.delenv(chatter.VERBOSE_ENV, raising=False)
    run_log = tmp_path / "run" / chatter.LOG_NAME
    chatter.set_run_log(run_log, fresh=True)
    try:
        layer = Layer("quiet", 1, 3, 16, 5, 4, 6, 3, 3, 3, pad=1)
        spec = toolchain.make_spec(registry.get(BLOCKED), layer, planted="quiet")
        with warnings.catch_warnings(record=True) as leaked:
            warnings.simplefilter("always")
            toolchain.compile_spec(spec, tmp_path / "b1")
        assert not leaked
        out, err = capfd.readouterr()
        assert "Warning" not in out + err and "Parsing" not in out + err
        logged = (tmp_path / "b1" / chatter.LOG_NAME).read_text()
        assert "UserWarning" in logged and run_log.read_text().startswith(f"--- {spec.name}")
        monkeypatch.setenv(chatter.VERBOSE_ENV, "1")  # -v: raised as usual
        with pytest.warns(UserWarning):
            toolchain.compile_spec(spec, tmp_path / "b2")
        assert not (tmp_path / "b2" / chatter.LOG_NAME).exists()
    finally:
        chatter.set_run_log(None)
        monkeypatch.delenv(chatter.VERBOSE_ENV, raising=False)


def test_captured_writes_what_it_hides(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv(chatter.VERBOSE_ENV, raising=False)
    with chatter.captured(tmp_path / "log.txt", "t"):
        warnings.warn("first")
        warnings.warn("first")  # every one, not once per place
    assert capfd.readouterr().err == ""
    assert (tmp_path / "log.txt").read_text().count("UserWarning: first") == 2
