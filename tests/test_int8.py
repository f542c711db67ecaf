"""The int8 forward kernel (convbench/quant/int8.py, convkernels/cpu/direct/int8_dot.py):
exact against the integer sums and the float64 requantization, within one unit of torch's
quantized Conv3d, and every planted error (a wrong input or output zero point, the scales
on the wrong channel, a dropped row of taps) fails."""

import csv
import json
import shutil

import pytest
import torch

from convbench.build import sass
from convbench.layersets.layer import Layer
from convbench.quant import int8
from convkernels.cpu.direct import int8_dot
from convkernels.cpu.isa import has_feature

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation")

#: Small, padded, with a KW x C run that is not a multiple of four (3 x 6 = 18).
SMALL = Layer("small", batch=2, in_channels=6, out_channels=32, in_d=5, in_h=6, in_w=8,
              k_d=3, k_h=3, k_w=3, stride=1, pad=1)
#: Strided, unpadded, a channel count of one (conv1 of the CosmoFlow set).
STRIDED = Layer("strided", batch=1, in_channels=1, out_channels=16, in_d=9, in_h=7, in_w=9,
                k_d=3, k_h=3, k_w=3, stride=2, pad=0)


def _verify(layer, cachedir, **kw):
    return int8.verify(layer, cachedir=cachedir, **kw)


@pytest.mark.parametrize("layer", [SMALL, STRIDED], ids=lambda layer: layer.name)
def test_the_kernel_is_exact(layer, cachedir):
    row = _verify(layer, cachedir)
    assert row["int32_mismatches"] == 0 and row["uint8_violations"] == 0, row
    assert row["torch_max_diff"] <= 1 and row["ok"], row


@pytest.mark.parametrize("plant", int8.PLANTS)
def test_every_plant_fails(plant, cachedir):
    row = _verify(SMALL, cachedir, plant=plant)
    assert not row["ok"], row
    if plant in ("zero-point", "tap"):  # the sums themselves are wrong
        assert row["int32_mismatches"] > 0, row
    else:  # only the requantization: caught without a unit's slack
        assert row["int32_mismatches"] == 0 and row["uint8_violations"] > 0, row


@pytest.mark.skipif(not has_feature("avx2"), reason="no AVX2 on this CPU")
def test_the_avx2_path_is_exact(cachedir):
    """ISA=3: the u8 x s8 products formed in 16 bits (no VNNI), 8 lanes."""
    row = _verify(SMALL, cachedir, params={"ISA": 3, "NV": 1})
    assert row["ok"] and row["int32_mismatches"] == 0, row


def test_the_requantization_check_has_no_slack_but_at_ties():
    f = torch.tensor([0.2, 1.5, 2.5000001, 250.7, 300.0, -4.0], dtype=torch.float64)
    slack = torch.full_like(f, 1e-6)
    # round half to even, + zy 3, clamped; 2.5000001 is within the slack of the tie 2.5,
    # so its lower neighbour (5) passes as well as 6
    exact = torch.tensor([3, 5, 5, 254, 255, 0])
    assert int8.u8_violations(exact, f, slack, 3) == 0
    assert int8.u8_violations(exact + 1, f, slack, 3) == 5  # all but the tie's other side
    tie = exact.clone()
    tie[2] = 6  # 2.5000001 is within the slack of 2.5: either neighbour
    assert int8.u8_violations(tie, f, slack, 3) == 0
    tie[1] = 4  # 1.5 rounds to 2 (+3 = 5); 4 is the other neighbour, a tie too
    assert int8.u8_violations(tie, f, slack, 3) == 0
    # without slack 1.5 is still a tie, 2.5000001 no longer (it rounds to 3, + 3 = 6)
    assert int8.u8_violations(tie, f, torch.zeros_like(f), 3) == 0
    assert int8.u8_violations(exact, f, torch.zeros_like(f), 3) == 1


def test_the_packed_filter_is_what_the_kernel_reads():
    case = int8.make_case(SMALL, 1)
    params = int8.KERNEL.resolve_params({"NV": 1, "ISA": 3})
    wpk, wsum = int8.pack_filter(case, params)
    blocks, KD, KH, Q, cw, _ = wpk.shape
    assert (blocks * cw, Q) == (32, 5)  # KW x C = 18 in 5 quads, two bytes of zeros
    w = case.wq  # [K, C, KD, KH, KW]
    for k, kd, kh, r in ((0, 0, 0, 0), (31, 2, 1, 17), (9, 1, 2, 7)):
        kw, c = divmod(r, SMALL.in_channels)
        q, e = divmod(r, 4)
        assert wpk[k // cw, kd, kh, q, k % cw, e] == w[k, c, kd, kh, kw]
    assert int(wpk[:, :, :, Q - 1, :, 2:].abs().sum()) == 0
    assert torch.equal(wsum, w.to(torch.int64).sum(dim=(1, 2, 3, 4)).to(torch.int32))


def test_refusals_say_why(monkeypatch):
    everything = lambda flag: True  # noqa: E731 - a CPU with every ISA
    monkeypatch.setattr(int8_dot, "has_feature", everything)
    odd = Layer("odd", batch=1, in_channels=4, out_channels=12, in_d=4, in_h=4, in_w=4,
                k_d=3, k_h=3, k_w=3, stride=1, pad=1)
    for isa, lanes in ((1, 16), (3, 8)):
        reason = int8.KERNEL.unsupported_reason(odd, int8.KERNEL.resolve_params({"ISA": isa}))
        assert f"multiple of {lanes}" in reason
    grouped = Layer("g", batch=1, in_channels=4, out_channels=32, in_d=4, in_h=4, in_w=4,
                    k_d=3, k_h=3, k_w=3, stride=1, pad=1, groups=2)
    assert "groups" in int8.KERNEL.unsupported_reason(grouped, int8.KERNEL.resolve_params({}))
    monkeypatch.setattr(int8_dot, "has_feature", lambda flag: flag == "avx2")
    reason = int8.KERNEL.unsupported_reason(SMALL, int8.KERNEL.resolve_params({"ISA": 2}))
    assert "this CPU has no avx_vnni" in reason
    assert int8_dot.isa_of(int8.KERNEL.resolve_params({})) == 3  # the best it has


def test_the_command_verifies_and_a_plant_fails(tmp_path, write_csv, cachedir, capsys):
    from convbench.commands import int8 as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "small,2,6,32,5,6,8,3,3,3,1,1\n")
    base = ["verify", "--paramscsv", str(sets), "--cachedir", str(cachedir)]
    assert command.main(base + ["--outdir", str(tmp_path / "ok")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "ok" / "verify.csv")))
    assert rows[0]["status"] == "passed" and rows[0]["int32_mismatches"] == "0"
    assert command.main(base + ["--plant", "scale-channel", "--outdir", str(tmp_path / "bad")]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_profile_conv3d_takes_dtype_int8(tmp_path, write_csv, cachedir, capsys):
    from convbench.commands import profile_conv3d
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "small,2,6,32,5,6,8,3,3,3,1,1\n")
    assert profile_conv3d.main(["--dtype", "int8", "--verify", "--paramscsv", str(sets),
                                "--cachedir", str(cachedir), "--outdir", str(tmp_path)]) == 0
    assert "2 passed, 0 failed" in capsys.readouterr().out  # the direct and Winograd kernels


@pytest.mark.parametrize("argv, message", [
    (["verify", "--kernel", "direct", "--param", "ISA=7"], "ISA=7"),
    (["verify", "--param", "ISA=1"], "give --kernel"),
    (["verify", "--layer", "conv9"], "unknown layer"),
    (["bench", "--rounds", "0"], "--rounds"),
    (["bench", "--engines", "nope"], "no nope"),
    (["bench", "--device", "gpu"], "only verify-gpu"),
    (["bench", "--plant", "tap"], "--plant"),
    (["bench", "--layer", "conv5", "--fp32", "implicitGemmBwdData"], "not a forward"),
    (["bench", "--layer", "conv5", "--fp32", "nosuchkernel"], "nosuchkernel"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    from convbench.commands import int8 as command
    assert command.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_profile_conv3d_refuses_int8_on_the_gpu(capsys):
    from convbench.commands import profile_conv3d
    assert profile_conv3d.main(["--dtype", "int8", "--verify", "--device", "gpu"]) == 2
    assert "forward pass on the CPU" in capsys.readouterr().err
    assert profile_conv3d.main(["--dtype", "int8", "--verify", "--math", "tf32"]) == 2
    assert "no math mode" in capsys.readouterr().err


def test_the_instruction_mix_reads_a_main_loop(tmp_path):
    """cpumix on assembled code: AVX-VNNI's ``{vex}`` prefix, address arithmetic and nops
    as "other", loads, stores and products from memory."""
    from convbench.build import cpumix
    if shutil.which("as") is None or shutil.which("objdump") is None:
        pytest.skip("binutils (as, objdump) is not installed")
    src = tmp_path / "loop.s"
    src.write_text(".text\nl:\n{vex} vpdpbusd %ymm2,%ymm1,%ymm0\nlea 0x10(%rax),%rdx\n"
                   "nopw 0x0(%rax,%rax,1)\nvpbroadcastd (%rax),%zmm1\nvmovups %zmm0,(%rdi)\n"
                   "vmovups (%rdi),%zmm3\nvpdpbusd (%rsi),%zmm1,%zmm2\njne l\n")
    obj = tmp_path / "loop.o"
    import subprocess
    subprocess.run(["as", str(src), "-o", str(obj)], check=True)
    assert cpumix.main_loop_mix(obj, "vpdpbusd") == {
        "product": 2, "load": 2, "store": 1, "broadcast": 1, "other": 3, "instructions": 8}


def test_the_bench_writes_samples_summary_and_metadata(tmp_path, write_csv, cachedir):
    from convbench.commands import int8 as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "small,2,6,32,5,6,8,3,3,3,1,1\n")
    assert command.main(["bench", "--paramscsv", str(sets), "--cachedir", str(cachedir),
                         "--rounds", "2", "--warmup", "1", "--engines", "x86",
                         "--fp32", "directConvNDHWCblocked", "--outdir", str(tmp_path)]) == 0
    samples = list(csv.DictReader(open(tmp_path / "samples.csv")))
    assert {r["contestant"] for r in samples} == {"dace-int8", "dace-int8-winograd",
                                                  "torch-int8-x86", "dace-fp32"}
    assert len(samples) == 8 and all(float(r["ms"]) > 0 for r in samples)
    summary = {r["contestant"]: r for r in csv.DictReader(open(tmp_path / "summary.csv"))}
    assert float(summary["dace-fp32"]["ratio_vs_dace-fp32"]) == 1.0
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["fp32_forward"] == {"small": "directConvNDHWCblocked"}
    assert meta["check_violations"] == {"small/directConvNDHWCint8": 0,
                                        "small/winogradF2int8": 0}
    assert all(k["isa"] != "none" for k in meta["kernels"].values())


@pytest.mark.full
@pytest.mark.parametrize("layer_set", ["cosmoflow", "cosmoflow_mlperf"])
def test_both_cosmoflow_sets_verify_exactly(layer_set, cachedir):
    from convbench.layersets.sets import load_layers
    for layer in load_layers(layer_set):
        for kernel in int8.KERNELS.values():
            if kernel.unsupported_reason(layer, kernel.resolve_params({})):
                continue  # the Winograd kernel: C = 1 (cosmoflow conv1)
            row = _verify(layer.with_batch(1), cachedir, kernel=kernel)
            assert row["ok"], (layer.name, kernel.name, row)


# -- the int8 tensor-core forward (GPU), in its CPU emulation ---------------------------------

#: Small tiles, so that the emulation is quick and the layers span several blocks.
IMMA_TILES = {"CTAtileM": 64, "CTAtileN": 32, "CTAtileK": 32, "warpTileM": 32,
              "warpTileN": 16, "stages": 3}
#: Taps packed into K tiles (C = 4, as MLPerf's conv1), and a strided layer whose K (48)
#: is not a multiple of the block's 32 channels.
IMMA_LAYERS = [Layer("packed", batch=1, in_channels=4, out_channels=32, in_d=4, in_h=4,
                     in_w=8, k_d=3, k_h=3, k_w=3, stride=1, pad=1),
               Layer("strided", batch=1, in_channels=8, out_channels=48, in_d=7, in_h=5,
                     in_w=9, k_d=3, k_h=3, k_w=3, stride=2, pad=1)]


@pytest.mark.parametrize("layer", IMMA_LAYERS, ids=lambda layer: layer.name)
def test_the_imma_emulation_is_exact(layer, cachedir):
    row = int8.verify_gpu(layer, IMMA_TILES, cachedir=cachedir)
    assert row["ok"] and row["int32_mismatches"] == 0, row


def test_imma_layout_plants_fail(cachedir, monkeypatch):
    """The 16-bit kernels' layout plants (A read unswizzled, B's ldmatrix matrices swapped)
    break the int8 kernel's bytes too: its emulation sees them."""
    from test_precision import MMA_PLANTS
    from convkernels.gpu.mma import layout as mma_layout
    for plant, functions in MMA_PLANTS.items():
        for function, planted in functions.items():
            monkeypatch.setattr(mma_layout, function, planted)
        row = int8.verify_gpu(IMMA_LAYERS[0], IMMA_TILES, cachedir=cachedir,
                              planted=f"imma_{plant}")
        assert not row["ok"], plant
        monkeypatch.undo()


def test_imma_refuses_channels_below_four_bytes():
    reason = int8.GPU_KERNEL.unsupported_reason(STRIDED, int8.GPU_KERNEL.resolve_params({}))
    assert "multiple of 4" in reason


@pytest.mark.skipif(shutil.which("nvcc") is None or sass.tool_dir() is None,
                    reason="nvcc or cuobjdump/nvdisasm is not installed")
def test_the_imma_main_loop_runs_on_int8_tensor_cores(tmp_path, write_csv):
    """sm_90 machine code: the main loop's tensor-core instructions are IMMA.16832 (int8
    operands, int32 sums), no spills."""
    from convbench.commands import int8 as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "deep,2,128,256,8,8,8,3,3,3,1,1\n")
    assert command.main(["sass", "--paramscsv", str(sets), "--outdir", str(tmp_path)]) == 0
    main, = [r for r in csv.DictReader(open(tmp_path / "sass.csv")) if r["main"] == "yes"]
    assert main["tensor_ops"].endswith("IMMA.16832.S8.S8") and main["spill_stores"] == "0", main


def test_verify_gpu_command(tmp_path, write_csv, cachedir):
    from convbench.commands import int8 as command
    sets = write_csv("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
                     "packed,1,4,32,4,4,8,3,3,3,1,1\nc1,1,1,16,4,4,4,3,3,3,1,0\n")
    argv = ["verify-gpu", "--paramscsv", str(sets), "--cachedir", str(cachedir),
            "--outdir", str(tmp_path)] + [f"--param={k}={v}" for k, v in IMMA_TILES.items()]
    assert command.main(argv) == 0
    rows = {r["layer"]: r for r in csv.DictReader(open(tmp_path / "verify_gpu.csv"))}
    assert rows["packed"]["status"] == "passed" and rows["c1"]["status"] == "unsupported"


@pytest.mark.full
def test_the_imma_emulation_verifies_the_cosmoflow_layers(cachedir):
    from convbench.layersets.sets import load_layers
    for layer in load_layers("cosmoflow_mlperf_s64"):
        row = int8.verify_gpu(layer.with_batch(1), cachedir=cachedir)
        assert row["ok"], (layer.name, row)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", IMMA_LAYERS, ids=lambda layer: layer.name)
def test_the_imma_kernel_on_the_gpu(layer, tmp_path):
    """The tensor cores themselves (a GPU campaign's test phase runs this): the int32 sums
    bit for bit, at the small tiles and at the defaults."""
    for params in (IMMA_TILES, {}):
        row = int8.verify_gpu(layer, params, target="gpu", cachedir=tmp_path)
        assert row["ok"], (params, row)
