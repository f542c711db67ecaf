"""The few-channel CPU forward (``directConvNDHWCfew``, convkernels.cpu.direct.few):
verified on the shapes its blocks meet (width borders, a shorter last block, strides,
padding per dimension, one vector per block, both kinds of store), its plants caught, its
rule, its refusals, the store decision that follows the caches, and its main loop read
from the machine code."""

import pytest

from convbench import registry
from convbench.build import cpumix, toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer
from convkernels.cpu import caches as cpu_caches
from convkernels.cpu import isa
from convkernels.cpu.direct import few
from convkernels.layouts import Pass

NAME = "directConvNDHWCfew"
#: conv1's shape, small: 4 -> 32 channels.
CONV1 = Layer("few_conv1", 2, 4, 32, 7, 6, 19, 3, 3, 3, pad=1)
#: K = 20: the last channel block partly filled
STRIDED = Layer("few_s2", 1, 3, 20, 9, 8, 11, 3, 3, 3, stride=2, pad=1)
#: padding per dimension, one input channel, a 2x3x5 filter
#: rows wide enough for blocks away from both borders (the main loop is theirs)
WIDE = Layer("few_wide", 1, 4, 32, 3, 3, 64, 3, 3, 3, pad=1)
UNEVEN = Layer("few_uneven", 1, 1, 32, 6, 7, 13, 2, 3, 5, pad_d=0, pad_h=1, pad_w=2)

needs_fma = pytest.mark.skipif(bool(few.refusal(CONV1, registry.get(NAME).resolve_params())),
                               reason="needs AVX2 and FMA, or AVX-512")


def _check(layer, builds, reference, **params):
    impl = registry.get(NAME)
    resolved = impl.resolve_params(params)
    assert impl.unsupported_reason(layer, resolved) is None
    spec = toolchain.make_spec(impl, layer, "float32", "cpu", resolved)
    return verify.verify_build(builds(spec), reference(layer))[0]


@needs_fma
@pytest.mark.parametrize("layer, params", [
    (CONV1, {}),                          # the default block: borders and a shorter last block
    (CONV1, {"PB": 4, "NV": 1, "STREAM": 1}),
    (STRIDED, {"PB": 3, "STREAM": 0}),
    (STRIDED, {"NV": 1}),
    (UNEVEN, {"PB": 5}),
], ids=["conv1", "conv1_pb4_nv1_stream", "strided", "strided_nv1", "uneven"])
def test_verifies(layer, params, builds, reference):
    check = _check(layer, builds, reference, **params)
    assert check.ok, check.summary()


@needs_fma
@pytest.mark.parametrize("plant", [1, 2], ids=["row_of_taps", "last_column"])
def test_a_planted_error_fails(plant, builds, reference):
    check = _check(CONV1, builds, reference, PLANT=plant)
    assert not check.ok, check.summary()


def test_the_rule_takes_few_input_channels_only():
    conv1 = Layer("c1", 2, 4, 32, 64, 64, 64, 3, 3, 3, pad=1)
    impl, rule = registry.by_rule(Pass.FWD, conv1, "cpu")
    assert rule.name == "few-channels"
    if not few.refusal(conv1, impl.resolve_params()):
        assert impl.name == NAME
    deep = Layer("c2", 2, 32, 64, 32, 32, 32, 3, 3, 3, pad=1)
    float32 = lambda impl: "float32" in impl.precisions  # noqa: E731
    assert registry.by_rule(Pass.FWD, deep, "cpu", float32)[0].name == "winogradF2"


def test_it_refuses_with_the_reason():
    impl = registry.get(NAME)
    wide = Layer("wide", 1, 32, 32, 8, 8, 8, 3, 3, 3, pad=1)
    assert "KW x C = 96" in impl.unsupported_reason(wide, impl.resolve_params())
    assert impl.unsupported_reason(Layer("k20", 1, 4, 20, 8, 8, 8, 3, 3, 3, pad=1),
                                   impl.resolve_params()) is None
    grouped = Layer("grouped", 1, 4, 32, 8, 8, 8, 3, 3, 3, pad=1, groups=2)
    assert "groups" in impl.unsupported_reason(grouped, impl.resolve_params())


def test_the_stores_stream_where_the_output_outgrows_the_last_level_cache(monkeypatch):
    """STREAM=2 follows the caches read (here set by $CONVBENCH_CACHES): conv1's 64 MiB
    output at 64^3 batch 2 streams past a 32 MiB cache, not past a 128 MiB one."""
    impl = registry.get(NAME)
    conv1 = Layer("c1", 2, 4, 32, 64, 64, 64, 3, 3, 3, pad=1)
    auto = impl.resolve_params()
    monkeypatch.setenv(cpu_caches.ENV, "l1d=32K,l2=1M,l3=32M")
    assert few.streams(conv1, auto)
    monkeypatch.setenv(cpu_caches.ENV, "l1d=32K,l2=1M,l3=128M")
    assert not few.streams(conv1, auto)
    assert few.streams(conv1, impl.resolve_params({"STREAM": 1}))


def test_the_block_fills_the_registers():
    """PB 0: the pixels the vector registers hold beside the filter vectors."""
    impl = registry.get(NAME)
    conv1 = Layer("c1", 2, 4, 32, 64, 64, 64, 3, 3, 3, pad=1)
    pb, nv, vl = few.tile_of(conv1, impl.resolve_params())
    assert vl == isa.vector_floats() and nv == min(2, -(-32 // vl))
    assert pb * nv + nv + few.SPARE[few.embedded()] <= isa.vector_registers() < (pb + 1) * nv + nv + few.SPARE[few.embedded()]


@needs_fma
def test_the_main_loop_is_products_and_their_operands(builds):
    """conv1's main loop (a row of taps, written out): 12 steps of PB x NV FMAs, with no
    store and no other load than the filter vectors, the input values and a pointer or
    two reloaded per row (no spilled accumulator)."""
    impl = registry.get(NAME)
    spec = toolchain.make_spec(impl, WIDE, "float32", "cpu", impl.resolve_params())
    build = builds(spec)
    pb, nv, _ = few.tile_of(WIDE, impl.resolve_params())
    mix = cpumix.main_loop_mix(cpumix.library_of(build), "vfmadd")
    assert mix["product"] == 12 * pb * nv, mix
    assert mix.get("store", 0) == 0, mix
    loads = mix.get("load", 0) + mix.get("broadcast", 0)
    assert loads <= 12 * (nv + pb) + (12 * pb * nv if few.embedded() else 0) + 2, mix
