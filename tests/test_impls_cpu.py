"""Every registered implementation, verified on the CPU.

Fast tier: every implementation on the representative layers of ``cases.fast_layers``, and
a second call of one build on new inputs.  Full tier (``--full``): every layer of both
CosmoFlow sets at batch 1 and 2, for every pass, and every odd shape."""

import pytest

from cases import (DEGENERATE, IMPLS, ODD, ODD_SHAPES, Case, case_params, cases, cosmoflow,
                   fast_cases, fast_layers, verify_case)
from convbench import registry
from convbench.build import toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer

FAST = fast_cases(IMPLS)
FULL = cases(IMPLS, cosmoflow((1, 2)) + [("odd", layer) for layer in ODD_SHAPES])


@pytest.mark.parametrize("case", case_params(FAST, FULL))
def test_verifies(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


#: The general kernel of each pass (the network's fallback, which takes groups) on the
#: degenerate layer with one channel per group, and the forward's on the one with every
#: dimension 1 but the input's extents (tests/test_verify.py runs three more kernels on
#: it); the full tier runs every implementation on all of DEGENERATE (ODD_SHAPES).
GENERAL = ("implicitGemm", "implicitGemmBwdData", "implicitGemmBwdFilter")


@pytest.mark.parametrize("case", case_params(cases(GENERAL, [("odd", ODD["depthwise"])])
                                             + [Case("implicitGemm", ODD["ones"], "odd")]))
def test_degenerate_layers_verify(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


@pytest.mark.parametrize("layer", DEGENERATE, ids=lambda layer: layer.name)
def test_every_implementation_takes_a_degenerate_layer_or_says_why(layer):
    """No build: each implementation either takes the layer or refuses it with a reason a
    user can read (one line, naming what it cannot do)."""
    taken = 0
    for name in IMPLS:
        impl = registry.get(name)
        reason = impl.unsupported_reason(layer, impl.resolve_params())
        if reason is None:
            taken += 1
        else:
            assert isinstance(reason, str) and 10 < len(reason) < 300 and "\n" not in reason, \
                (name, reason)
    assert taken >= 3  # the general kernels of every pass take every layer


#: The odd fast layer of each implementation (a build the fast tier has anyway).
FRESH = [Case(name, fast_layers(name)[-1][1], "odd") for name in IMPLS]


@pytest.mark.parametrize("case", case_params(FRESH))
def test_fresh_output_on_every_call(case, builds):
    """Two calls of one build on different inputs: the second result is checked, so state
    left over from the first call (a partial-sum buffer, say) cannot hide."""
    reason = case.refused()
    if reason:  # nothing to run (the AMX kernels without AMX would not even start)
        pytest.skip(f"{case.impl} does not support {case.layer.name}: {reason}")
    build = builds(case.spec())
    first, second = (verify.make_truth(case.layer, case.pass_, seed=s, dtype=case.precision)
                     for s in (11, 12))
    assert verify.verify_build(build, first)[0].ok
    check = verify.verify_build(build, second)[0]
    assert check.ok, check.summary()


#: Tiled variants: the parameters of their thread maps and their staging buffers.
TILED = {
    "implicitGemmTiledonly": (("ti", "tj"), ()),
    "implicitGemmWarpTiled": (("ti", "tj"), ("As", "Bs")),
    "implicitGemmNCDHW": (("ti", "tj"), ("As", "Bs")),
    "implicitGemmsplitK": (("ti", "tj"), ("As", "Bs")),
    "implicitGemmNCDHWinplace": (("ti", "tj"), ("As", "Bs")),
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


SPLIT_TAIL = Case("implicitGemmsplitK", Layer("tail", 1, 5, 8, 6, 6, 6, 3, 3, 3), "odd",
                  params=(("CTAtileK", 16), ("nsplitK", 4)))  # GK = 135 = 2 * 64 + 7


@pytest.mark.prebuild(SPLIT_TAIL)
def test_split_k_tail_bug_is_caught(monkeypatch, builds, reference):
    """The original split-K dropped reduction terms at K tails.  Planting that bug (chunk
    length rounded down instead of up) must fail the verification."""
    from convkernels.gpu import igemm
    real = igemm.geometry

    def dropping_tail(layer, layout, tm, tn, tk, nsplit=1):
        g = real(layer, layout, tm, tn, tk, nsplit)
        g.KS = (g.GK // (tk * nsplit)) * tk  # each chunk too short: the last terms are lost
        return g

    layer, spec = SPLIT_TAIL.layer, SPLIT_TAIL.spec()
    assert verify.verify_build(builds(spec), reference(layer))[0].ok
    monkeypatch.setattr(igemm, "geometry", dropping_tail)
    planted = toolchain.make_spec(spec.impl, layer, params=spec.params, planted="ks_rounded_down")
    check = verify.verify_build(builds(planted), reference(layer))[0]
    assert not check.ok, check.summary()


INPLACE_BORDER = Case("implicitGemmNCDHWinplace", Layer("border", 2, 3, 20, 7, 6, 5, 3, 3, 3,
                                                      pad=1), "odd")


@pytest.mark.prebuild(INPLACE_BORDER)
def test_inplace_border_predicate_bug_is_caught(monkeypatch, builds, reference):
    """implicitGemmNCDHWinplace pads nothing: its loads test each input coordinate.
    Planting a bound one plane too deep (the padding taps past the last plane read the
    next channel's first plane instead of 0) must fail the verification."""
    from convkernels.gpu import igemm_inplace
    layer, spec = INPLACE_BORDER.layer, INPLACE_BORDER.spec()
    assert verify.verify_build(builds(spec), reference(layer))[0].ok
    monkeypatch.setattr(igemm_inplace, "bounds", lambda la: (la.in_d + 1, la.in_h, la.in_w))
    planted = toolchain.make_spec(spec.impl, layer, params=spec.params, planted="bound_past_border")
    check = verify.verify_build(builds(planted), reference(layer))[0]
    assert not check.ok, check.summary()


def test_inplace_refuses_layers_whose_coordinates_would_carry():
    """The packed (d, h, w) fields hold -pad .. extent + pad - 1 biased by 256 in 10 bits:
    padding over 256 would borrow, extent plus padding over 768 would carry into the next
    field, and a wrapped coordinate could read real input where 0 belongs."""
    impl = registry.get("implicitGemmNCDHWinplace")
    params = impl.resolve_params({})
    fits = Layer("edge", 1, 1, 1, 764, 8, 8, 3, 3, 3, pad=4)       # 764 + 4 = 768
    assert impl.unsupported_reason(fits, params) is None
    wide = Layer("wide", 1, 1, 1, 764, 8, 8, 3, 3, 3, pad=5)
    assert "over 768" in impl.unsupported_reason(wide, params)
    padded = Layer("padded", 1, 1, 1, 8, 8, 8, 3, 3, 3, pad=257)
    assert "padding 257 over 256" in impl.unsupported_reason(padded, params)


#: Micro-tiles of several channel vectors (NV > 1), both filter reads of the
#: backward-data kernel and both forms (and the single vector loop) of the backward-filter
#: one: odd pixel counts,
#: padding, and vectors of 4 or 8 lanes.
MULTI_VECTOR = [
    Case("directConvNDHWCblocked", Layer("mv", 1, 3, 32, 5, 6, 7, 3, 3, 3, pad=1), "odd",
         params=(("PIX", 6), ("NB", 8), ("NV", 2))),
    Case("directConvNDHWCblockedBwdData", Layer("mvd", 2, 16, 5, 5, 6, 7, 3, 3, 3, pad=1),
         "odd", params=(("PIX", 4), ("NB", 4), ("NV", 2), ("PACK", 0))),
    Case("directConvNDHWCblockedBwdData", Layer("mvd", 2, 16, 5, 5, 6, 7, 3, 3, 3, pad=1),
         "odd", params=(("PIX", 4), ("NB", 4), ("NV", 4), ("PACK", 1))),
    Case("directConvNDHWCblockedBwdFilter", Layer("mvf", 2, 3, 16, 6, 5, 7, 3, 3, 3, pad=1),
         "odd", params=(("NB", 4), ("NV", 2), ("SLICES", 2))),
    Case("directConvNDHWCblockedBwdFilter", Layer("mvf", 2, 16, 6, 6, 5, 7, 3, 3, 3, pad=1),
         "odd", params=(("FORM", 1), ("CB", 3), ("NB", 4), ("NV", 2), ("SLICES", 2))),
    # Blocks of output rows (bwd_filter), blocks of the channel reduction (fwd, bwd_data)
    Case("directConvNDHWCblockedBwdFilter", Layer("rows", 2, 3, 16, 6, 7, 5, 3, 3, 3, pad=1),
         "odd", params=(("NB", 4), ("NV", 2), ("SLICES", 2), ("ROWS", 3), ("KFIRST", 1))),
    Case("directConvNDHWCblockedBwdFilter", Layer("rows", 2, 16, 6, 6, 7, 5, 3, 3, 3, pad=1),
         "odd", params=(("FORM", 1), ("CB", 3), ("NB", 4), ("NV", 2), ("ROWS", 7))),
    Case("directConvNDHWCblockedBwdFilter", Layer("noslice", 2, 5, 16, 6, 7, 5, 3, 3, 3, pad=1),
         "odd", params=(("NB", 8), ("NV", 2), ("CB", 3), ("SLICES", 0))),
    # Strided, the kernel or the padding wider than the input: taps that read no input at
    # all (every loop bounded to the input read in place; whole slices, rows, one tap)
    Case("directConvNDHWCblockedBwdFilter", Layer("bfs2k4", 1, 2, 16, 2, 2, 2, 4, 4, 4,
                                                 stride=2, pad=1), "odd",
         params=(("NB", 8), ("CB", 2), ("SLICES", 1))),
    Case("directConvNDHWCblockedBwdFilter", Layer("bfs2k4", 1, 2, 16, 2, 2, 2, 4, 4, 4,
                                                 stride=2, pad=1), "odd",
         params=(("NB", 8), ("CB", 2), ("ROWS", 1), ("TAPW", 0))),
    Case("directConvNDHWCblockedBwdFilter", Layer("bfs2k5", 2, 3, 16, 3, 4, 3, 5, 3, 5,
                                                 stride=2, pad=1, pad_h=2), "odd",
         params=(("NB", 8), ("CB", 3), ("SLICES", 0))),
    Case("directConvNDHWCblockedBwdFilter", Layer("bfw", 1, 2, 16, 3, 3, 1, 1, 1, 2,
                                                 stride=3, pad=0, pad_w=2), "odd",
         params=(("NB", 8), ("CB", 2), ("SLICES", 0))),  # no pixel reads the input
    # The taps inside each output row (TAPS: on the padded input, every loop whole)
    Case("directConvNDHWCblockedBwdFilter", Layer("taps", 2, 5, 16, 6, 7, 5, 3, 3, 3, pad=1),
         "odd", params=(("NB", 8), ("CB", 3), ("TAPS", 1), ("SLICES", 2))),
    # Vector loops of GROUP pixels (data gradient: 3 pixels in loops of 2 and 1)
    Case("directConvNDHWCblockedBwdData", Layer("grp", 2, 16, 5, 5, 6, 6, 3, 3, 3, pad=1),
         "odd", params=(("PIX", 5), ("NB", 8), ("NV", 2), ("PACK", 0), ("GROUP", 2))),
    # One vector loop for the whole micro-tile (SPLIT 0; the default is one per width tap)
    Case("directConvNDHWCblockedBwdFilter", Layer("split", 2, 6, 16, 6, 7, 5, 3, 3, 3, pad=1),
         "odd", params=(("NB", 4), ("NV", 2), ("CB", 2), ("SPLIT", 0), ("SLICES", 2),
                        ("ROWS", 3))),
    Case("directConvNDHWCblocked", Layer("cblk", 2, 12, 32, 5, 6, 7, 3, 3, 3, pad=1), "odd",
         params=(("PIX", 6), ("NB", 8), ("NV", 2), ("CBLK", 5))),
    Case("directConvNDHWCblockedBwdData", Layer("cblk", 2, 16, 12, 5, 6, 7, 3, 3, 3, pad=1),
         "odd", params=(("PIX", 4), ("NB", 4), ("NV", 2), ("PACK", 0), ("CBLK", 4))),
]


#: Fast tier: the paths that no other fast test builds: strided filter gradients whose taps
#: read no input, the taps inside each row (TAPS), two vectors per filter-gradient tile with
#: row blocks and the filter taps outermost (KFIRST), four vectors of the data gradient's
#: packed filter.  Two-vector forward and data-gradient tiles, channel blocks, pixel groups,
#: both filter-gradient forms, slices or none, one vector loop per tile (SPLIT 0) and both
#: filter reads of the data gradient are built in the fast tier by the planted-bug tests'
#: controls (tests/test_backward.py); the other shapes here run in the full tier.
MULTI_VECTOR_FAST = [c for c in MULTI_VECTOR
                     if c.layer.name in ("bfs2k4", "bfs2k5", "bfw", "taps")
                     or dict(c.params).get("NV") == 4 or dict(c.params).get("KFIRST") == 1]


@pytest.mark.parametrize("case", case_params(MULTI_VECTOR_FAST, MULTI_VECTOR))
def test_multi_vector_tiles_verify(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)
