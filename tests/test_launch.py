"""CUDA launch limits, checked on the CPU (convbench.build.launch), and the GPU build failures the
first H100 campaign found (2026-11-24), reproduced without a GPU."""

import dataclasses

import dace
import pytest

from convbench import registry
from convbench.build import launch, toolchain
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers


def _kernel(sizes, block=(256, 1, 1)):
    """An SDFG with one element-wise GPU kernel over ``sizes`` (parameters p0, p1, ...)."""
    sdfg = dace.SDFG("grid_probe")
    sdfg.add_array("A", list(sizes), dace.float32, storage=dace.StorageType.GPU_Global)
    state = sdfg.add_state()
    params = [f"p{i}" for i in range(len(sizes))]
    _, entry, _ = state.add_mapped_tasklet(
        "probe", {p: f"0:{s}" for p, s in zip(params, sizes)}, {}, "o = 1",
        {"o": dace.Memlet(f"A[{', '.join(params)}]")}, schedule=dace.ScheduleType.GPU_Device,
        external_edges=True)
    entry.map.gpu_block_size = list(block)
    return sdfg, state, entry


def test_grid_follows_dace_rules():
    sdfg, state, entry = _kernel([7, 100000, 300])
    assert launch.grid(state, entry) == [2, 100000, 7]  # last parameter on x, in blocks of 256
    assert len(launch.grid_problems(sdfg)) == 1


def test_fit_keeps_x_and_moves_the_largest_to_y():
    sdfg, state, entry = _kernel([300, 300, 3, 300])
    assert launch.grid(state, entry) == [2, 3, 90000]
    moved = launch.fit_grids(sdfg)
    assert entry.map.params == ["p2", "p0", "p1", "p3"] and len(moved) == 1
    assert launch.grid(state, entry) == [2, 300, 900]
    assert launch.grid_problems(sdfg) == []


def test_fit_moves_the_largest_to_x_when_y_overflows():
    sdfg, state, entry = _kernel([100000, 3])
    assert launch.grid(state, entry) == [1, 100000, 1]
    moved = launch.fit_grids(sdfg)
    assert moved and entry.map.params == ["p1", "p0"]
    assert launch.grid(state, entry) == [391, 3, 1]
    assert launch.grid_problems(sdfg) == []


def test_fit_prefers_the_order_that_fills_the_block():
    # The filter-matrix shape: keeping the 3-wide last parameter on x fits, but runs 3 of
    # 256 threads; the largest parameter on x fits too and fills them.
    sdfg, state, entry = _kernel([256, 256, 3, 3])
    assert launch.grid(state, entry) == [1, 3, 65536]
    launch.fit_grids(sdfg)
    assert entry.map.params == ["p2", "p3", "p0", "p1"]
    assert launch.grid(state, entry) == [1, 256, 9] and launch.x_lane_use(state, entry) == 1.0


def test_a_grid_that_cannot_fit_is_named_and_left_alone():
    sdfg, state, entry = _kernel([70000, 70000, 70000])
    assert launch.fit_grids(sdfg) == []
    assert entry.map.params == ["p0", "p1", "p2"]
    (problem,) = launch.grid_problems(sdfg)
    assert "kernel probe" in problem and "65535" in problem


def _layer(set_name, name, batch):
    layer = next(layer for layer in load_layers(set_name) if layer.name == name)
    return dataclasses.replace(layer, batch=batch)


#: Builds whose launches failed on the H100 ("invalid argument", grid y or z > 65535):
#: the filter matrix, the split-K reduction, the direct backward-filter map, the padding.
H100_GRID_FAILURES = [
    ("implicitGemmNCDHW", "cosmoflow", "conv7", 16),
    ("implicitGemmsplitK", "cosmoflow", "conv2", 16),
    ("directConvNCDHWBwdFilter", "cosmoflow", "conv7", 16),
    ("implicitGemmWarpTiled", "cosmoflow_mlperf", "conv1", 8),
]


@pytest.mark.parametrize("name,set_name,layer,batch", H100_GRID_FAILURES,
                         ids=[f"{c[0]}-{c[2]}-b{c[3]}" for c in H100_GRID_FAILURES])
def test_h100_grid_failures_build_in_range(name, set_name, layer, batch, monkeypatch):
    spec = toolchain.make_spec(registry.get(name), _layer(set_name, layer, batch), target="gpu")
    sdfg = toolchain.make_sdfg(spec)
    assert launch.grid_problems(sdfg) == []
    # Without the reordering the same build stops here, on the CPU, with the reason.
    monkeypatch.setattr(launch, "fit_grids", lambda sdfg: [])
    with pytest.raises(ValueError, match="65535"):
        toolchain.make_sdfg(spec)


def test_split_k_refuses_partials_beyond_int32():
    impl = registry.get("implicitGemmsplitK")
    params = impl.resolve_params({})
    reason = impl.unsupported_reason(_layer("cosmoflow_mlperf", "conv1", 8), params)
    assert reason and "int32" in reason and "nsplitK=4" in reason
    assert impl.unsupported_reason(_layer("cosmoflow_mlperf", "conv1", 2), params) is None


def test_dace_nested_propagation_bug_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # DaCe saves the invalid SDFG under the working folder
    layer = Layer("gpu_stride2", 1, 4, 6, 9, 8, 7, 3, 1, 5, stride=2, pad=1)
    impl = registry.get("directConvNCDHW")
    with pytest.raises(ValueError, match="spcl/dace#1739"):
        toolchain.make_sdfg(toolchain.make_spec(impl, layer, target="gpu"))
    toolchain.make_sdfg(toolchain.make_spec(impl, layer, target="cpu"))
    toolchain.make_sdfg(toolchain.make_spec(impl, dataclasses.replace(layer, batch=2),
                                            target="gpu"))
