"""The bfloat16 AMX tile kernels (convkernels.cpu.direct.amx): the forward, the data and the
filter gradient verified with the tile instructions emulated in C++ (``EMULATE=1``, any
CPU), their plants caught, the hardware builds assembled and their main loops read from
the machine code (4 ``tdpbf16ps`` per 4 tile loads), the refusals, and the rule that
picks them in bfloat16 where the CPU has AMX-BF16 and never in float32."""

import pytest

from convbench import registry
from convbench.build import cpumix, precision, toolchain
from convbench.check import verify
from convbench.experiment import choice
from convbench.layersets.layer import Layer
from convkernels.cpu.direct import amx
from convkernels.layouts import Pass

NAMES = {Pass.FWD: "directConvNDHWCamx", Pass.BWD_DATA: "directConvNDHWCamxBwdData",
         Pass.BWD_FILTER: "directConvNDHWCamxBwdFilter"}
#: 32 -> 64 channels (two reduction chunks in the data gradient), a width that leaves
#: positions past OW in the tiles, padding 1
SMALL = Layer("amx_small", 2, 32, 64, 4, 5, 7, 3, 3, 3, pad=1)
#: 64 -> 32, no padding, a 2x3x1 filter (odd and even tap offsets on the q grid)
UNPADDED = Layer("amx_unpadded", 1, 64, 32, 5, 6, 9, 2, 3, 1)


def _check(pass_, layer, builds, reference, **params):
    impl = registry.get(NAMES[pass_])
    resolved = impl.resolve_params(dict(EMULATE=1, **params))
    assert impl.unsupported_reason(layer, resolved) is None
    spec = toolchain.make_spec(impl, layer, "bfloat16", "cpu", resolved)
    return verify.verify_build(builds(spec), reference(layer, pass_=pass_, dtype="bfloat16"))[0]


@pytest.mark.parametrize("pass_", list(NAMES), ids=str)
@pytest.mark.parametrize("layer", [SMALL, UNPADDED], ids=lambda layer: layer.name)
def test_the_emulated_tiles_verify(pass_, layer, builds, reference):
    check = _check(pass_, layer, builds, reference)
    assert check.ok, check.summary()


@pytest.mark.parametrize("pass_, plant", [(Pass.FWD, 1), (Pass.FWD, 2), (Pass.BWD_DATA, 2),
                                          (Pass.BWD_FILTER, 1), (Pass.BWD_FILTER, 2)],
                         ids=["fwd_tap", "fwd_pairs", "bwdd_pairs", "bwdf_block", "bwdf_pairs"])
def test_a_planted_error_fails(pass_, plant, builds, reference):
    check = _check(pass_, SMALL, builds, reference, PLANT=plant)
    assert not check.ok, check.summary()


@pytest.mark.parametrize("pass_", [Pass.FWD, Pass.BWD_FILTER], ids=str)
def test_the_hardware_main_loop_is_four_tile_products(pass_, builds):
    """EMULATE=0 assembles on any x86-64 host (inline assembly): the innermost loop holds
    4 tdpbf16ps per 4 tile loads of their operands (the compiler may unroll it), and no
    tile store."""
    impl = registry.get(NAMES[pass_])
    spec = toolchain.make_spec(impl, SMALL, "bfloat16", "cpu", impl.resolve_params())
    build = builds(spec, load=False)
    mix = cpumix.main_loop_mix(cpumix.library_of(build), amx.PRODUCT)
    assert mix["product"] in (4, 8, 16) and mix["load"] == mix["product"], mix
    assert not mix.get("store"), mix


def test_the_refusals_say_why(monkeypatch):
    impl = registry.get(NAMES[Pass.FWD])
    monkeypatch.setattr(amx, "has_feature", lambda flag: False)
    reason = impl.unsupported_reason(SMALL, impl.resolve_params())
    assert "amx_tile" in reason and "EMULATE=1" in reason
    odd = Layer("odd", 1, 16, 32, 4, 4, 4, 3, 3, 3, pad=1)
    assert "multiples of 32" in impl.unsupported_reason(odd, impl.resolve_params({"EMULATE": 1}))
    strided = Layer("s2", 1, 32, 32, 8, 8, 8, 3, 3, 3, stride=2, pad=1)
    assert "stride 1" in impl.unsupported_reason(strided, impl.resolve_params({"EMULATE": 1}))
    big = Layer("big", 2, 64, 128, 32, 32, 32, 3, 3, 3, pad=1)
    assert "too many" in impl.unsupported_reason(big, impl.resolve_params({"EMULATE": 1}))
    assert "float32" not in impl.precisions


@pytest.mark.parametrize("has_amx", [False, True], ids=["no_amx", "amx"])
def test_the_rule_takes_amx_in_bfloat16_only(has_amx, monkeypatch):
    monkeypatch.setattr(amx, "has_feature", lambda flag: has_amx)
    monkeypatch.setenv("CONVBENCH_MACHINE", "unseen amx test | avx512f")
    from convbench.build import tuned
    tuned.machine_id.cache_clear()
    try:
        conv2 = Layer("c2", 2, 32, 64, 32, 32, 32, 3, 3, 3, pad=1)
        bf16 = precision.get_dtype("bfloat16")
        for pass_, name in NAMES.items():
            chosen, how = choice.default_choice(conv2, pass_, "cpu", bf16)
            assert (chosen == name) == has_amx, (pass_, chosen, how)
            if has_amx:
                assert how == "rule amx-bf16"
            assert choice.default_choice(conv2, pass_, "cpu")[0] != name
    finally:
        tuned.machine_id.cache_clear()
