"""The Hopper tensor-core kernels (``implicitGemmWGMMA``, ``implicitGemmWGMMABwdData``):
their CPU emulation verifies in every precision; a wrong swizzle mode, a wrong stride byte
offset and a wrong accumulator mapping each fail it; the parameters are checked; the
build is for sm_90a; and the dynamic shared memory extension launches a DaCe kernel with
more than 48 KiB (tested on the generated code)."""

import csv
import re
import subprocess
from pathlib import Path

import pytest

from convbench.build import gpubuild, nvcc, toolchain
from convbench.check import verify
from convbench.layersets.layer import Layer
from convkernels.gpu import dynamic_shared
from convkernels.gpu.mma import epilogue as mma_epilogue
from convkernels.gpu.wgmma import program as wgmma

#: 6 input channels (taps packed into K tiles), 40 output channels (a column tail),
#: stride 2, padding 2.
LAYER = Layer("wgmma", 2, 6, 40, 6, 7, 5, 3, 3, 3, stride=2, pad=2)
#: 40 input channels: a K tile per tap, the channels' tail zero-filled; 72 outputs.
DEEP_LAYER = Layer("wgmma_deep", 2, 40, 72, 5, 6, 5, 3, 3, 3, pad=1)
#: A stride-1 layer for the data gradient: 40 reduction channels, 24 output channels.
BWD_LAYER = Layer("wgmma_bwd", 2, 24, 40, 6, 7, 5, 3, 3, 3, pad=1)

#: The filter gradient's: 40 output channels (a row tail of the M tile), 24 x 27 filter
#: values (a column tail), output rows of 5 pixels (a K tile's tail), stride 2 on one.
WGRAD_LAYER = Layer("wgmma_wgrad", 2, 24, 40, 6, 7, 9, 3, 3, 3, pad=1)
#: 6 input channels (filter values in 8-byte and 4-byte copies), stride 2, 70 outputs.
WGRAD_SMALL_C = Layer("wgmma_wgrad_c6", 2, 6, 70, 7, 6, 9, 3, 3, 3, stride=2, pad=1)

#: The three passes' kernels.
WGMMA_KERNELS = ("implicitGemmWGMMA", "implicitGemmWGMMABwdData", "implicitGemmWGMMABwdFilter")

CASES = [("implicitGemmWGMMA", "float16", LAYER),
         ("implicitGemmWGMMA", "float32-tf32", DEEP_LAYER),
         ("implicitGemmWGMMABwdData", "bfloat16", BWD_LAYER),
         ("implicitGemmWGMMABwdFilter", "float16", WGRAD_LAYER),
         ("implicitGemmWGMMABwdFilter", "float32-tf32", WGRAD_LAYER)]
FULL = [("implicitGemmWGMMA", "bfloat16", DEEP_LAYER),
        ("implicitGemmWGMMA", "float16", DEEP_LAYER),
        ("implicitGemmWGMMA", "float32-tf32", LAYER),
        ("implicitGemmWGMMABwdData", "float16", BWD_LAYER),
        ("implicitGemmWGMMABwdData", "float32-tf32", BWD_LAYER),
        ("implicitGemmWGMMABwdFilter", "bfloat16", WGRAD_LAYER),
        ("implicitGemmWGMMABwdFilter", "float16", WGRAD_SMALL_C),
        ("implicitGemmWGMMABwdFilter", "float32-tf32", WGRAD_SMALL_C)]


def _pass(name):
    return ("bwd_data" if name.endswith("BwdData") else "bwd_filter"
            if name.endswith("BwdFilter") else "fwd")


def _ids(cases):
    return [f"{n}-{d}-{l.name}" for n, d, l in cases]


@pytest.mark.parametrize("name, dtype, layer",
                         [pytest.param(*c, id=i) for c, i in zip(CASES, _ids(CASES))]
                         + [pytest.param(*c, id=i, marks=pytest.mark.full)
                            for c, i in zip(FULL, _ids(FULL))])
def test_wgmma_emulation_verifies(name, dtype, layer, builds, reference):
    """Each thread's wgmma decodes both descriptors and sums its own accumulators from
    the staged bytes; the outputs pass the precision's bound."""
    from convbench import registry
    impl = registry.get(name)
    truth = reference(layer, pass_=_pass(name), dtype=dtype)
    good = verify.verify_build(builds(toolchain.make_spec(impl, layer, dtype)), truth)[0]
    assert good.ok, good.summary()


def _swapped_halves(s, rows, cols, target):
    """The epilogue with each thread's rows g and g + 8 exchanged (registers 4 j + 0, 1
    and 4 j + 2, 3 stored to each other's rows): a wrong accumulator mapping."""
    right = _STORE(s, rows, cols, target)
    wrong = right.replace("i2 * 2 + i1]", "(1 - i2) * 2 + i1]")
    assert wrong != right
    return wrong


_STORE = mma_epilogue.store_code

#: Each plant: what it changes (a descriptor field, or a function of the epilogue).
PLANTS = {"swizzle_mode_64B": ("DESCRIPTOR", {"mode": 2}),
          "stride_byte_offset_512": ("DESCRIPTOR", {"sbo": 512}),
          "leading_byte_offset_4096": ("DESCRIPTOR", {"lbo": 4096}),
          "accumulator_rows_swapped": ("store_code", _swapped_halves)}

#: The kernels the plants run on; the leading byte offset only where it is read (the
#: 16-bit filter gradient's N-major B: 128 columns in two slabs, LBO apart; K-major
#: operands with a swizzle have no LBO, for the hardware or the emulation).
PLANTED = [pytest.param(plant, name, dtype, layer, id=f"{plant}-{tag}", marks=marks)
           for name, dtype, layer, tag, marks in (
               ("implicitGemmWGMMA", "float16", DEEP_LAYER, "fwd-f16", ()),
               ("implicitGemmWGMMABwdFilter", "bfloat16", WGRAD_LAYER, "bwd_filter-bf16", ()),
               ("implicitGemmWGMMABwdData", "float32-tf32", BWD_LAYER, "bwd_data-tf32",
                pytest.mark.full),
               ("implicitGemmWGMMABwdFilter", "float32-tf32", WGRAD_LAYER, "bwd_filter-tf32",
                pytest.mark.full))
           for plant in PLANTS
           if plant != "leading_byte_offset_4096" or (name.endswith("Filter") and "tf32" not in dtype)]


def _module(name):
    from convkernels.gpu.wgmma import filter_gradient
    return filter_gradient if name.endswith("BwdFilter") else wgmma


@pytest.mark.parametrize("plant, name, dtype, layer", PLANTED)
def test_wgmma_plants_fail(plant, name, dtype, layer, builds, reference, monkeypatch):
    """A 64-byte swizzle mode in the descriptors (the stages are written with the 128-byte
    one), a stride byte offset of 512 (the atoms are 1024 bytes apart), a leading byte
    offset of 4096 (the filter gradient's 16-bit slabs are 8 KiB apart) and the
    accumulators' row halves exchanged in the epilogue each fail the emulation: it reads
    shared memory and places sums as the hardware does."""
    from convbench import registry
    impl = registry.get(name)
    truth = reference(layer, pass_=_pass(name), dtype=dtype)
    what, change = PLANTS[plant]
    if what == "DESCRIPTOR":
        module = _module(name)
        monkeypatch.setattr(module, "DESCRIPTOR", {**module.DESCRIPTOR, **change})
    else:
        monkeypatch.setattr(mma_epilogue, what, change)
    spec = toolchain.make_spec(impl, layer, dtype, planted=f"wgmma_{plant}")
    bad = verify.verify_build(builds(spec), truth)[0]
    assert not bad.ok, f"{plant}: {bad.summary()}"


@pytest.mark.parametrize("params, words", [
    ({"CTAtileK": 32}, "128-byte"),
    ({"CTAtileM": 32}, "one warpgroup"),
    ({"CTAtileN": 512}, "64 to 256"),
    ({"stages": 2}, "3 to 6"),
    ({"CTAtileN": 256, "stages": 6}, "shared memory"),
    ({"CTAtileM": 64, "CTAtileN": 64, "stages": 3}, "more than 49152"),
    ({"CTAtileM": 512, "CTAtileN": 64}, "split evenly"),
])
def test_tiles_that_do_not_fit_are_refused(params, words):
    values = {p.name: p.default for p in wgmma.PARAMS}
    values.update(params)
    reason = wgmma.check_params(values)
    assert reason and words in reason, reason


def test_the_defaults_need_more_than_48_kib():
    values = {p.name: p.default for p in wgmma.PARAMS}
    assert wgmma.check_params(values) is None
    assert values["stages"] >= 3
    assert values["stages"] * (values["CTAtileM"] + values["CTAtileN"]) * 128 > 48 * 1024


def test_wgmma_kernels_build_for_sm_90a():
    """Their GPU builds name sm_90a (DaCe's setting, the CMake architecture that skips
    detection, nvcc's -gencode); the other GPU kernels keep sm_90."""
    from convbench import registry
    for name in WGMMA_KERNELS:
        impl = registry.get(name)
        assert toolchain.arch_of(impl) == "90a"
        settings = toolchain.dace_settings("gpu", Path("/tmp"), arch=toolchain.arch_of(impl))
        assert settings[("compiler", "cuda", "cuda_arch")] == "90a"
        assert "-DLOCAL_CUDA_ARCHITECTURES=90a" in settings[("compiler", "extra_cmake_args")]
    assert nvcc.arch_flags("90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    other = registry.get("implicitGemmMMA")
    assert toolchain.arch_of(other) == toolchain.CUDA_ARCH
    plain = toolchain.dace_settings("gpu", Path("/tmp"))
    assert "LOCAL_CUDA_ARCHITECTURES" not in plain[("compiler", "extra_cmake_args")]


def test_other_gpus_refuse_the_sm_90a_kernels(monkeypatch):
    """On a GPU other than sm_90 the wgmma kernels are refused with the reason."""
    import torch
    from convbench.timing import devices
    monkeypatch.setattr(devices, "gpu_problem", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    reason = devices.arch_problem("90a")
    assert reason and "sm_80" in reason and "sm_90a" in reason, reason
    assert devices.arch_problem("90") is None  # not architecture-specific: not this check
    assert devices.arch_problem("90a", "cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert devices.arch_problem("90a") is None


# -- the dynamic shared memory extension ------------------------------------------------

def _big_shared_program(elements):
    """A DaCe program whose one kernel stages ``elements`` floats in shared memory."""
    import dace
    import numpy as np
    n = elements

    @dace.program
    def staged(a: dace.float32[4 * n], b: dace.float32[4 * n]):
        for i in dace.map[0:4 * n:n]:
            s = np.ndarray([n], dace.float32)
            for j in dace.map[0:256]:
                for q in range(n // 256):
                    s[q * 256 + j] = a[i + q * 256 + j]
            for j in dace.map[0:256]:
                for q in range(n // 256):
                    b[i + q * 256 + j] = s[q * 256 + j] + 1
    sdfg = staged.to_sdfg(simplify=True)
    sdfg.apply_gpu_transformations()
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.MapEntry) and node.map.params == ["j"]:
            node.map.schedule = dace.ScheduleType.GPU_ThreadBlock
    for _, name, desc in sdfg.arrays_recursive():
        if name == "s":
            desc.storage = dace.StorageType.GPU_Shared
    return sdfg


def _cuda_code(sdfg):
    with toolchain.dace_config("gpu", Path("/tmp")):
        return next(c.clean_code for c in sdfg.generate_code() if c.language == "cu")


def test_a_kernel_over_48_kib_launches_with_dynamic_shared_memory():
    """64 KiB of stages: the array lives in the extern buffer, aligned; the launch passes
    the bytes through the opt-in helper, which sets the attribute before it; the code
    records the bytes for the build verdict."""
    dynamic_shared.register()
    code = _cuda_code(_big_shared_program(16384))
    kernel = re.search(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", code).group(1)
    assert f"extern __shared__ __align__({dynamic_shared.ALIGN}) unsigned char" in code
    assert re.search(r"float\* s = reinterpret_cast<float\*>\(__cb_dynamic_shared \+ 0\);", code)
    assert "__shared__ float s[" not in code
    need = 16384 * 4 + dynamic_shared.ALIGN
    assert dynamic_shared.kernel_bytes(code) == {kernel: need}
    assert re.search(rf"#define __cb_dsmem_{kernel} .*cb_dynamic_shared_opt_in\(\(const void\*\)"
                     rf"{kernel}, \"{kernel}\", {need}, done\)", code)
    launch = re.search(rf"cudaLaunchKernel\(\(void\*\){kernel}, dim3\([^)]*\), dim3\([^)]*\), "
                       rf"\w+_args, (\w+), ", code)
    assert launch and launch.group(1) == f"__cb_dsmem_{kernel}", launch
    assert "cudaFuncAttributeMaxDynamicSharedMemorySize" in code
    kernels = gpubuild.describe_kernels("", code)
    assert [k.dynamic_shared for k in kernels] == [need]


@pytest.mark.parametrize("name", WGMMA_KERNELS)
def test_the_wgmma_kernels_launch_with_their_stages_bytes(name):
    """The real kernels (their stages written in two places, two access nodes each): the
    launch passes exactly the opt-in's bytes, the stages' plus the alignment slack, where
    DaCe would sum every access node's size."""
    from convbench.build import codegen
    layer = DEEP_LAYER
    files = codegen.generate(name, "gpu", "float16", layer)
    code = next(text for path, text in files.items() if path.endswith(".cu"))
    values = {p.name: p.default for p in wgmma.PARAMS}
    stages = values["stages"] * (values["CTAtileM"] + values["CTAtileN"]) * 128
    recorded = dynamic_shared.kernel_bytes(code)
    assert list(recorded.values()) == [stages + dynamic_shared.ALIGN], recorded
    kernel = next(iter(recorded))
    launch = re.search(rf"cudaLaunchKernel\(\(void\*\){kernel}, dim3\([^)]*\), dim3\([^)]*\), "
                       rf"\w+_args, ([^,]+), ", code)
    assert launch and launch.group(1) == f"__cb_dsmem_{kernel}", launch and launch.group(1)
    assert code.count("extern __shared__") == 1


def test_kernels_within_48_kib_are_generated_as_dace_generates_them():
    """At 32 KiB nothing changes: the generated file is DaCe's own, byte for byte."""
    from dace.codegen.targets.cuda import CUDACodeGen
    from dace.codegen.targets.target import TargetCodeGenerator
    dynamic_shared.register()
    ours = _cuda_code(_big_shared_program(8192))
    assert "__cb_dynamic_shared" not in ours and "__shared__ float s[8192]" in ours
    TargetCodeGenerator.unregister(dynamic_shared.DynamicSharedCodeGen)
    TargetCodeGenerator.register(CUDACodeGen, name="cuda")
    try:
        assert _cuda_code(_big_shared_program(8192)) == ours
    finally:
        TargetCodeGenerator.unregister(CUDACodeGen)
        dynamic_shared.register()


@pytest.mark.skipif(subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0,
                    reason="needs nvcc")
def test_the_dynamic_kernel_compiles(tmp_path):
    dynamic_shared.register()
    cu = tmp_path / "k.cu"
    cu.write_text(_cuda_code(_big_shared_program(16384)))
    proc = subprocess.run(gpubuild.nvcc_command(cu, tmp_path / "k.o"), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("capability, forward, data, weights", [
    ((9, 0), *WGMMA_KERNELS),
    ((8, 9), "implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter")])
def test_the_network_picks_tensor_core_kernels_by_architecture(capability, forward, data,
                                                               weights, monkeypatch):
    """In 16 bits on the GPU the network runs the wgmma kernels of all three passes on
    Hopper and the mma.sync ones elsewhere."""
    import torch
    from convbench.build import precision
    from convbench.network import cosmoflow
    from convbench.timing import devices
    from convkernels.layouts import Pass
    monkeypatch.setattr(devices, "gpu_problem", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    f16 = precision.get_dtype("float16")
    picks = {p: cosmoflow.default_choice(DEEP_LAYER, p, "gpu", f16)[0]
             for p in (Pass.FWD, Pass.BWD_DATA, Pass.BWD_FILTER)}
    assert picks == {Pass.FWD: forward, Pass.BWD_DATA: data, Pass.BWD_FILTER: weights}, picks


# -- the committed SASS tables ------------------------------------------------------------

SASS_DIR = Path(__file__).resolve().parent.parent / "results" / "gpu" / "sass" / "wgmma"
TABLES = [f"{impl}-{layer_set}{suffix}.csv"
          for impl in WGMMA_KERNELS
          for layer_set in ("cosmoflow", "cosmoflow_mlperf")
          for suffix in ("", "-bf16", "-tf32")]
#: Layers of one K tile (v1 conv1: 27 reduction values; its data gradient's transposed
#: layer has 16 * 27): no main loop to read, the gate applies to the rest.
ONE_TILE = {("implicitGemmWGMMA", "cosmoflow", "conv1")}


def gate(row) -> list:
    """What a reading row misses of issue 78's bar for a wgmma main loop: HGMMA with both
    operands by descriptor, no shared load in the loop (no LDSM, LDS, LDS.U16 feeding the
    MMA), no wgmma note from ptxas (serialized, a wait injected), no spill or local
    memory, at least 3 stages in dynamic shared memory beyond 48 KiB."""
    missing = []
    hgmma, ss = int(row["hgmma"] or 0), int(row["hgmma_ss"] or 0)
    if (row["impl"], row["layer_set"], row["layer"]) not in ONE_TILE:
        if not hgmma or ss != hgmma:
            missing.append(f"HGMMA {hgmma}, {ss} with both operands by descriptor")
        fma = int(row["fma"] or 0)
        loads = sum(float(row[k] or 0) * fma for k in (
            "lds32_per_fma", "lds64_per_fma", "lds128_per_fma", "ldsm_per_fma", "lds16_per_fma"))
        if loads:
            missing.append(f"{loads:g} shared loads in the loop")
    if row["wgmma_notes"]:
        missing.append(f"ptxas: {row['wgmma_notes']}")
    if int(row["spill_stores"]) or int(row["spill_loads"]) or int(row["local"] or 0):
        missing.append("spills or local memory")
    stages = int(dict(kv.split("=") for kv in row["config"].split(";"))["stages"])
    if stages < 3 or int(row["dynamic_shared"] or 0) <= 48 * 1024:
        missing.append(f"{stages} stages in {row['dynamic_shared']} bytes of dynamic shared memory")
    return missing


@pytest.mark.parametrize("table", TABLES)
def test_the_committed_sass_tables_pass_the_bar(table):
    """Every CosmoFlow layer, each pass, each precision: the main kernel's loop passes
    :func:`gate` (``convbench sass ... --layer all --csv``, results/gpu/sass/wgmma)."""
    from convbench.layersets import load_layers
    rows = [r for r in csv.DictReader(open(SASS_DIR / table)) if r["main"] == "yes"]
    layer_set = rows[0]["layer_set"]
    assert {r["layer"] for r in rows} == {layer.name for layer in load_layers(layer_set)}
    bad = {r["layer"]: gate(r) for r in rows if gate(r)}
    assert not bad, bad


def test_the_bar_has_power():
    """A loop that loads an operand through LDSM, one with A from registers, a serialized
    loop, 2 stages or static shared memory each miss the bar."""
    row = next(r for r in csv.DictReader(open(SASS_DIR / TABLES[0]))
               if r["main"] == "yes" and r["layer"] == "conv4")
    assert gate(row) == []
    assert gate({**row, "ldsm_per_fma": "0.25"})
    assert gate({**row, "hgmma_ss": str(int(row["hgmma"]) - 1)})
    assert gate({**row, "wgmma_notes": "C7509"})
    assert gate({**row, "config": row["config"].replace("stages=4", "stages=2")})
    assert gate({**row, "dynamic_shared": "0"})
