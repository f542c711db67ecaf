"""Every registered implementation, verified on the CPU: every layer of both CosmoFlow sets
at batch 1 and 2 (backward passes: batch 1), and odd shapes."""

import pytest

from convbench import registry, toolchain, verify
from convbench.layers import Layer, load_layers

# Grouped by pass, so that consecutive tests share a layer's reference.
IMPLS = sorted(registry.all_implementations(),
               key=lambda n: (registry.get(n).pass_ != "fwd", str(registry.get(n).pass_), n))

ODD_SHAPES = [
    Layer("noncubic", 2, 3, 5, 5, 7, 9, 3, 3, 3),
    Layer("stride2", 1, 4, 6, 9, 8, 7, 3, 3, 3, stride=2),
    Layer("pad2_stride2", 1, 5, 3, 6, 7, 5, 3, 3, 3, stride=2, pad=2),
    Layer("channels_7_13", 1, 7, 13, 6, 6, 6, 3, 3, 3, pad=1),
    Layer("k1x1x1", 2, 6, 10, 4, 5, 6, 1, 1, 1),
    Layer("k1x1x1_pad", 1, 3, 4, 3, 3, 3, 1, 1, 1, pad=1),
    Layer("k5x5x5", 1, 3, 4, 7, 8, 9, 5, 5, 5, pad=2),
    Layer("k_mixed", 1, 2, 3, 6, 5, 9, 3, 1, 5, stride=2, pad=1),
    Layer("single_out", 1, 1, 1, 3, 3, 3, 3, 3, 3),
    # K = 130 > every output-channel tile; GK = 27 * 3 = 81 is a tail for every K step
    Layer("k130_batch3", 3, 3, 130, 5, 6, 4, 3, 3, 3, pad=1),
]

COSMOFLOW = [(s, i) for s in ("cosmoflow", "cosmoflow_mlperf")
             for i in range(len(load_layers(s)))]


def _check(name, layer, cachedir, reference):
    impl = registry.get(name)
    params = impl.resolve_params()
    reason = impl.unsupported_reason(layer, params)
    if reason:
        pytest.skip(f"{name} does not support {layer.name}: {reason}")
    build = toolchain.build(toolchain.make_spec(impl, layer, params=params), cachedir)
    check = verify.verify_build(build, reference(layer, pass_=impl.pass_))[0]
    assert check.ok, f"{name} on {layer.name} ({layer.describe()}): {check.summary()}"


# The parameter closest to the function varies slowest: one layer's reference serves
# every implementation before the next layer's is made.
@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("layer", ODD_SHAPES, ids=lambda l: l.name)
def test_odd_shapes(name, layer, cachedir, reference):
    _check(name, layer, cachedir, reference)


@pytest.mark.parametrize("name", IMPLS)
def test_fresh_output_on_every_call(name, cachedir):
    """Two calls of one build on different inputs: the second result is checked, so state
    left over from the first call (a partial-sum buffer, say) cannot hide."""
    layer = ODD_SHAPES[2]
    impl = registry.get(name)
    build = toolchain.build(toolchain.make_spec(impl, layer), cachedir)
    first, second = (verify.make_reference(layer, impl.pass_, seed=s) for s in (11, 12))
    assert verify.verify_build(build, first)[0].ok
    check = verify.verify_build(build, second)[0]
    assert check.ok, check.summary()


# Forward implementations at batch 1 and 2, backward ones at batch 1; layer-major order.
COSMOFLOW_CASES = [(name, batch, s, i) for s, i in COSMOFLOW for batch in (1, 2) for name in IMPLS
                   if batch == 1 or registry.get(name).pass_ == "fwd"]


@pytest.mark.slow
@pytest.mark.parametrize("name, batch, layerset, index", COSMOFLOW_CASES,
                         ids=[f"{n}-b{b}-{s}-{i}" for n, b, s, i in COSMOFLOW_CASES])
def test_cosmoflow(name, batch, layerset, index, cachedir, reference):
    _check(name, load_layers(layerset)[index].with_batch(batch), cachedir, reference)


#: Tiled variants: the parameters of their thread maps and their staging buffers.
TILED = {
    "implicitGemmTiledonly": (("ti", "tj"), ()),
    "implicitGemmWarpTiled": (("ti", "tj"), ("As", "Bs")),
    "implicitGemmNCDHW": (("ti", "tj"), ("As", "Bs")),
    "implicitGemmsplitK": (("ti", "tj"), ("As", "Bs")),
    "directConvNCDHWnobuffer": (("t",), ()),
    "directConvNCDHWtileIC": (("t",), ()),
    "directConvNCDHWmerged": (("ti", "tj"), ("Xs", "Ws")),
}


@pytest.mark.parametrize("name", sorted(TILED))
def test_cpu_schedule_keeps_the_gpu_tiling(name):
    """The CPU SDFG has the same thread maps and staging buffers as the GPU one, so the
    CPU tests verify the structure that runs on the GPU."""
    import dace
    threads, staged = TILED[name]
    impl = registry.get(name)
    sdfgs = {t: toolchain.make_sdfg(toolchain.make_spec(impl, ODD_SHAPES[2], target=t))
             for t in ("cpu", "gpu")}
    for target, sdfg in sdfgs.items():
        maps = [n.map for n, _ in sdfg.all_nodes_recursive() if isinstance(n, dace.nodes.MapEntry)]
        thread_maps = [m for m in maps if tuple(m.params) == threads]
        assert thread_maps, (target, [m.params for m in maps])
        expected = (dace.ScheduleType.GPU_ThreadBlock if target == "gpu"
                    else dace.ScheduleType.Sequential)
        assert all(m.schedule == expected for m in thread_maps)
        arrays = {k: d for sd in sdfg.all_sdfgs_recursive() for k, d in sd.arrays.items()}
        for buf in staged:
            assert buf in arrays, (target, buf)
            storage = arrays[buf].storage
            assert storage == (dace.StorageType.GPU_Shared if target == "gpu"
                               else dace.StorageType.Register), (target, buf, storage)


def test_split_k_tail_bug_is_caught(monkeypatch, cachedir, reference):
    """The original split-K dropped reduction terms at K tails.  Planting that bug (chunk
    length rounded down instead of up) must fail the verification."""
    from impls import _igemm
    real = _igemm.geometry

    def dropping_tail(layer, layout, tm, tn, tk, nsplit=1):
        g = real(layer, layout, tm, tn, tk, nsplit)
        g.KS = (g.GK // (tk * nsplit)) * tk  # each chunk too short: the last terms are lost
        return g

    layer = Layer("tail", 1, 5, 8, 6, 6, 6, 3, 3, 3)  # GK = 135 = 2 * 64 + 7 with the params
    impl = registry.get("implicitGemmsplitK")
    spec = toolchain.make_spec(impl, layer, params={"CTAtileK": 16, "nsplitK": 4})
    assert verify.verify_build(toolchain.build(spec, cachedir), reference(layer))[0].ok
    monkeypatch.setattr(_igemm, "geometry", dropping_tail)
    build = toolchain.build(spec, cachedir / "planted")
    check = verify.verify_build(build, reference(layer))[0]
    assert not check.ok, check.summary()
