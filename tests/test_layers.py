"""Layer model and layer-set CSV parsing, including every class of bad input."""

import pytest

from cases import FIRST_SMALL, Case, fast_layers
from convbench.base.errors import LayerFileError, UsageError
from convbench.layersets.layer import Layer, parse_layers
from convbench.layersets.sets import load_layers, select_layers

HEADER = "layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
LEGACY = ("InChannel,InputDepth,InputHeight,InputWidth,KernelDepth,KernelHeight,KernelWidth,"
          "OutputChannel,OutputDepth,OutputHeight,OutputWidth\n")


def test_cosmoflow_set():
    layers = load_layers("cosmoflow")
    assert [(l.in_channels, l.out_channels, l.in_d) for l in layers] == [
        (1, 16, 130), (16, 32, 66), (32, 64, 34), (64, 128, 18), (128, 256, 10),
        (256, 256, 6), (256, 256, 4)]
    for l in layers:
        assert (l.batch, l.k_d, l.k_h, l.k_w, l.stride, l.pad) == (16, 3, 3, 3, 1, 0)
        assert l.in_d == l.in_h == l.in_w
        assert l.out_d == l.in_d - 2
    assert layers[0].output_shape == (16, 16, 128, 128, 128)


def test_cosmoflow_mlperf_set():
    layers = load_layers("cosmoflow_mlperf")
    assert [(l.in_channels, l.out_channels, l.in_d) for l in layers] == [
        (4, 32, 128), (32, 64, 64), (64, 128, 32), (128, 256, 16), (256, 512, 8)]
    for l in layers:
        assert (l.batch, l.k_d, l.stride, l.pad) == (4, 3, 1, 1)
        assert l.out_d == l.in_d


def test_sizes_and_flops():
    l = Layer("a", 2, 3, 5, 9, 8, 7, 3, 1, 5, stride=2, pad=1)
    assert (l.out_d, l.out_h, l.out_w) == (5, 5, 3)
    assert l.gemm_m == 2 * 5 * 5 * 3 and l.gemm_n == 5 and l.gemm_k == 3 * 3 * 1 * 5
    assert l.flops() == 2 * l.gemm_m * l.gemm_n * l.gemm_k
    assert l.with_batch(4).batch == 4 and l.with_batch(4).name == "a"
    with pytest.raises(ValueError):
        Layer("b", 1, 1, 1, 2, 2, 2, 3, 3, 3)


def test_path_and_name(write_csv):
    path = write_csv(HEADER + "x,1,2,3,4,5,6,1,1,1,1,0\n")
    assert load_layers(str(path))[0].in_w == 6
    assert len(load_layers("cosmoflow.csv")) == 7


def test_legacy_header():
    layers = parse_layers(LEGACY + "1,130,130,130,3,3,3,16,128,128,128\n"
                          "16,66,66,66,3,3,3,32,64,64,64\n", "old.csv")
    assert [l.name for l in layers] == ["layer0", "layer1"]
    assert (layers[1].in_channels, layers[1].out_channels, layers[1].stride, layers[1].pad) == \
        (16, 32, 1, 0)


@pytest.mark.parametrize("text, line, field, words", [
    # missing column
    ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride\n"
     "a,1,1,1,4,4,4,3,3,3,1\n", 1, None, "missing column 'pad'"),
    # unknown column
    (HEADER.strip() + ",bias\na,1,1,1,4,4,4,3,3,3,1,0,1\n", 1, None, "unknown column 'bias'"),
    # non-integer
    (HEADER + "a,1,1,1,4,4.5,4,3,3,3,1,0\n", 2, "in_h", "not an integer"),
    (HEADER + "a,1,x,1,4,4,4,3,3,3,1,0\n", 2, "in_channels", "not an integer"),
    # zero and negative sizes
    (HEADER + "a,1,1,1,0,4,4,3,3,3,1,0\n", 2, "in_d", "positive"),
    (HEADER + "a,1,1,-2,4,4,4,3,3,3,1,0\n", 2, "out_channels", "positive"),
    (HEADER + "a,0,1,1,4,4,4,3,3,3,1,0\n", 2, "batch", "positive"),
    (HEADER + "a,1,1,1,4,4,4,3,3,0,1,0\n", 2, "k_w", "positive"),
    # kernel larger than the padded input
    (HEADER + "a,1,1,1,4,4,2,3,3,3,1,0\n", 2, "k_w", "larger than the padded input"),
    # stride 0, negative padding
    (HEADER + "a,1,1,1,4,4,4,3,3,3,0,0\n", 2, "stride", "positive"),
    (HEADER + "a,1,1,1,4,4,4,3,3,3,1,-1\n", 2, "pad", "non-negative"),
    # wrong number of fields
    (HEADER + "a,1,1,1,4,4,4,3,3,3,1\n", 2, None, "expected 12 fields"),
    # duplicated layer name
    (HEADER + "a,1,1,1,4,4,4,3,3,3,1,0\nb,1,1,1,4,4,4,3,3,3,1,0\na,1,1,1,5,5,5,3,3,3,1,0\n",
     4, "layer", "duplicated layer name 'a'"),
    # empty name
    (HEADER + ",1,1,1,4,4,4,3,3,3,1,0\n", 2, "layer", "empty layer name"),
    # empty file, header only
    ("", None, None, "empty file"),
    ("\n\n", None, None, "empty file"),
    (HEADER, 1, None, "no layers"),
    # legacy: inconsistent output size, bad value
    (LEGACY + "1,130,130,130,3,3,3,16,128,127,128\n", 2, "OutputHeight", "inconsistent"),
    (LEGACY + "1,130,0,130,3,3,3,16,128,128,128\n", 2, "InputHeight", "positive"),
    (LEGACY + "1,130,130,130,3,3,3,16,128,128\n", 2, None, "expected 11 fields"),
])
def test_bad_input(text, line, field, words):
    with pytest.raises(LayerFileError) as info:
        parse_layers(text, "bad.csv")
    err = info.value
    msg = str(err)
    assert msg.startswith("bad.csv"), msg
    assert err.line == line
    assert err.field == field
    if line is not None:
        assert msg.startswith(f"bad.csv:{line}")
    if field is not None:
        assert f"field '{field}'" in msg
    assert words in msg
    assert "\n" not in msg


def test_unknown_set():
    with pytest.raises(UsageError, match="no layer set or file named 'nosuchset'.*cosmoflow"):
        load_layers("nosuchset")


def test_select_layers():
    layers = load_layers("cosmoflow")
    assert [l.name for l in select_layers(layers, 2, 4)] == ["conv3", "conv4"]
    assert len(select_layers(layers, None, None)) == 7
    assert len(select_layers(layers, 6, None)) == 1
    for first, last in [(7, None), (-1, None), (3, 3), (3, 2), (0, 8)]:
        with pytest.raises(UsageError):
            select_layers(layers, first, last)


# -- padding that differs between the two ends of a dimension (issue 45) -------------------

ASYM_CSV = """layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad,dilation,groups,pad_w_end,stride_d
same_even,2,4,6,6,5,7,2,2,4,1,same,,,,
explicit,1,3,4,6,5,7,3,3,3,1,1,,,2,
same_stride2,1,3,4,8,7,6,3,3,2,2,same,,,,
same_dil,1,2,4,7,6,5,2,2,2,1,same,3,,,
same_groups,2,4,6,5,6,7,2,3,2,1,same,,2,,
valid,1,2,3,6,5,4,3,3,3,1,valid,,,,
"""


def test_same_valid_and_end_padding_columns():
    """``same`` pads to ceil(input / stride) outputs with an odd total's extra one at the
    back; ``valid`` pads nothing; ``pad_*_end`` sets the back alone.  A layer padded alike at
    both ends keeps its key; the file round-trips."""
    from convbench.layersets.layer import format_csv
    layers = {x.name: x for x in parse_layers(ASYM_CSV)}
    assert (layers["same_even"].pads, layers["same_even"].pads_end) == ((0, 0, 1), (1, 1, 2))
    assert layers["same_even"].output_shape[2:] == (6, 5, 7)
    assert layers["same_stride2"].output_shape[2:] == (4, 4, 3)
    assert (layers["same_dil"].pads, layers["same_dil"].pads_end) == ((1,) * 3, (2,) * 3)  # span 4
    assert layers["explicit"].key().endswith("_p1_pe1x1x2")
    assert layers["valid"].key() == "b1_c2_k3_i6x5x4_f3x3x3_s1_p0"
    assert Layer("s", 1, 2, 3, 6, 6, 6, 3, 3, 3, pad=1).key() == "b1_c2_k3_i6x6x6_f3x3x3_s1_p1"
    assert "asymmetric padding" in layers["explicit"].features()
    assert "asymmetric padding" not in layers["valid"].features()
    again = parse_layers(format_csv(list(layers.values())))
    assert [x.normalized() for x in again] == [x.normalized() for x in layers.values()]


@pytest.mark.parametrize("row, field, words", [
    ("a,1,2,3,6,6,6,2,2,2,1,same,1", "pad", "'same' sets every dimension's padding"),
    ("a,1,2,3,6,6,6,2,2,2,1,-1,", "pad", "non-negative"),
])
def test_bad_padding_cells(row, field, words):
    text = "layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad,pad_d\n"
    with pytest.raises(LayerFileError) as err:
        parse_layers(text + row + "\n", path="f.csv")
    assert "f.csv:2" in str(err.value) and words in str(err.value), str(err.value)


def test_asymmetric_references_agree():
    """torch's forward of a ``same`` layer is torch's own ``padding='same'``; the three
    passes of every asymmetric layer are adjoint to each other (<fwd(x), dy> = <x,
    bwd_data(dy)> = <w, bwd_filter(x, dy)>), so the explicit padding and the crop agree."""
    import torch
    from convkernels.layouts import Pass
    from convbench.check.references import CudnnReference, torch_pass
    g = torch.Generator().manual_seed(0)
    for layer in parse_layers(ASYM_CSV):
        x = torch.rand(layer.input_shape, generator=g, dtype=torch.float64) - 0.5
        w = torch.rand(layer.filter_shape, generator=g, dtype=torch.float64) - 0.5
        y = torch_pass(layer, Pass.FWD, {"x": x, "w": w})
        assert tuple(y.shape) == layer.output_shape, layer.name
        if layer.name == "same_even":
            want = torch.nn.functional.conv3d(x, w, padding="same")
            assert torch.allclose(y, want, rtol=0, atol=1e-12)
        dy = torch.rand(y.shape, generator=g, dtype=torch.float64) - 0.5
        dx = torch_pass(layer, Pass.BWD_DATA, {"y": dy, "w": w})
        dw = torch_pass(layer, Pass.BWD_FILTER, {"x": x, "y": dy})
        forward = float((y * dy).sum())
        assert abs(float((x * dx).sum()) - forward) < 1e-9 * abs(forward) + 1e-12, layer.name
        assert abs(float((w * dw).sum()) - forward) < 1e-9 * abs(forward) + 1e-12, layer.name
        assert (CudnnReference().layer_problem(layer) is None) == (not layer.asymmetric)


GENERAL = ("directConvNCDHW", "directConvNCDHWBwdData", "directConvNCDHWBwdFilter",
           "implicitGemm", "implicitGemmBwdData", "implicitGemmBwdFilter",
           "implicitGemmsplitKBwdFilter")


@pytest.mark.parametrize("name", GENERAL)
def test_general_implementations_verify_asymmetric_padding(name, builds, reference, request):
    """The direct and implicit-GEMM implementations, all three passes, on a layer padded
    differently at the ends, strided per dimension and grouped (their padded copy of the
    input is larger at the back); the full tier runs every row of the set above."""
    from convbench import registry
    from convbench.build import toolchain
    from convbench.check import verify
    impl = registry.get(name)
    layers = parse_layers(ASYM_CSV)
    for layer in (layers if request.config.getoption("--full") else [layers[0]]):
        result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                     reference(layer, pass_=impl.pass_))[0]
        assert result.ok, (layer.name, result.summary())


def test_others_refuse_asymmetric_padding_with_the_reason():
    from convbench import registry
    layer = parse_layers(ASYM_CSV)[1]
    for name, impl in registry.all_implementations().items():
        reason = impl.unsupported_reason(layer, {})
        if name in GENERAL:
            assert reason is None, (name, reason)
        elif "asymmetric padding" not in impl.handles:
            assert reason and "asymmetric padding" in reason and "1+2" in reason, (name, reason)


def test_a_torch_same_padding_with_an_even_kernel_is_taken():
    """``padding='same'`` with even kernels (one dilated): one more at the back, and the
    torch reference computes what the module does."""
    import torch
    from convbench.commands.layers import module_layer
    from convkernels.layouts import Pass
    from convbench.check.references import torch_pass
    module = torch.nn.Conv3d(2, 3, (2, 3, 4), padding="same", dilation=(3, 1, 1)).double()
    layer = module_layer("m", module, (1, 2, 7, 6, 6))
    assert (layer.pads, layer.pads_end) == ((1, 1, 1), (2, 1, 2))
    x = torch.rand(1, 2, 7, 6, 6, dtype=torch.float64)
    want = torch.nn.functional.conv3d(x, module.weight, padding="same", dilation=(3, 1, 1))
    assert torch.allclose(torch_pass(layer, Pass.FWD, {"x": x, "w": module.weight}), want,
                          rtol=0, atol=1e-12)


# -- ONNX models as a layer source (issue 45) --------------------------------------------------

def _onnx_model(path, batch="N", with_2d=True, convs=True):
    """A small 3D U-Net-like model: a padded Conv with different pads at its ends, a
    strided SAME_UPPER Conv, a ConvTranspose back up; beside it a 2D Conv on a second
    input (skipped: not a 3D layer)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 2, 8, 8, 8])]
    if convs:
        inits += [weight("w1", (4, 2, 3, 3, 3)), weight("w2", (6, 4, 2, 2, 2)),
                  weight("w3", (6, 4, 2, 2, 2))]
        nodes += [helper.make_node("Conv", ["x", "w1"], ["a"], name="enc1",
                                   pads=[1, 1, 1, 1, 1, 2]),
                  helper.make_node("Relu", ["a"], ["b"]),
                  helper.make_node("Conv", ["b", "w2"], ["c"], name="down", strides=[2, 2, 2],
                                   auto_pad="SAME_UPPER"),
                  helper.make_node("ConvTranspose", ["c", "w3"], ["y"], name="up",
                                   strides=[2, 2, 2])]
    else:
        nodes.append(helper.make_node("Relu", ["x"], ["y"]))
    y_shape = [batch, 4, 8, 8, 10] if convs else [batch, 2, 8, 8, 8]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)]
    if with_2d:
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 2, 8, 8]))
        inits.append(weight("w4", (3, 2, 3, 3)))
        nodes.append(helper.make_node("Conv", ["x2", "w4"], ["y2"], name="flat"))
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 3, 6, 6]))
    graph = helper.make_graph(nodes, "unet", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_onnx_layers_take_every_3d_convolution(tmp_path):
    from convbench.layersets.onnx_layers import onnx_layers
    path = _onnx_model(tmp_path / "m.onnx", batch=2)
    layers, skipped = onnx_layers(path)
    by = {x.name: x for x in layers}
    assert sorted(by) == ["down", "enc1", "up"]
    assert (by["enc1"].pads, by["enc1"].pads_end) == ((1, 1, 1), (1, 1, 2))
    assert by["enc1"].output_shape == (2, 4, 8, 8, 9)
    assert by["down"].output_shape[2:] == (4, 4, 5) and by["down"].asymmetric  # SAME_UPPER
    assert by["up"].transposed and by["up"].input_shape[2:] == (8, 8, 10)
    assert [name for name, _ in skipped] == ["flat"] and "2D" in skipped[0][1]


def test_onnx_layers_need_a_shape_where_the_model_has_none(tmp_path, capsys):
    """A dynamic batch: every node is skipped with the reason, until --input-shape fixes
    it; then the written file verifies with profile_conv3d.py."""
    from convbench.commands import profile_conv3d as cli
    from convbench.commands import layers as layers_cmd
    path = _onnx_model(tmp_path / "m.onnx", with_2d=False)
    with pytest.raises(UsageError, match="no convolution node is a 3D layer .*dynamic"):
        layers_cmd._main(["--from-onnx", str(path)], "convbench layers")
    out = tmp_path / "m.csv"
    assert layers_cmd._main(["--from-onnx", str(path), "--input-shape", "1,2,8,8,8",
                             "--out", str(out)], "convbench layers") == 0
    assert [x.name for x in load_layers(str(out))] == ["enc1", "down", "up"]
    capsys.readouterr()
    assert cli.main(["--implementation", "implicitGemm", "--paramscsv", str(out),
                     "--verify", "--strict"]) == 0
    assert "3 passed, 0 failed, 0 unsupported (of 3 layers)" in capsys.readouterr().out


@pytest.mark.parametrize("make, words", [
    ("text", "is not an ONNX model"),
    ("relu", "no 3D convolution found"),
    ("missing", "no file"),
])
def test_bad_onnx_input_is_one_line(tmp_path, make, words):
    import subprocess
    import sys
    path = tmp_path / "m.onnx"
    if make == "text":
        path.write_text("not a model\n")
    elif make == "relu":
        _onnx_model(path, batch=1, with_2d=False, convs=False)
    proc = subprocess.run([sys.executable, "-m", "convbench.main", "layers", "--from-onnx",
                           str(path)], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


def test_a_torch_exported_3d_unet_verifies(tmp_path, capsys):
    """A small 3D U-Net, exported to ONNX by torch: its six convolutions (a SAME_UPPER
    one with an even kernel, a transposed one) come out of --from-onnx, and profile_conv3d
    verifies them."""
    import torch
    from convbench.commands import profile_conv3d as cli
    from convbench.commands import layers as layers_cmd
    nn = torch.nn

    class UNet3D(nn.Module):
        def __init__(self, c=2, f=4):
            super().__init__()
            self.enc1 = nn.Conv3d(c, f, 3, padding=1)
            self.down = nn.Conv3d(f, 2 * f, 2, stride=2)
            self.mid = nn.Conv3d(2 * f, 2 * f, 3, padding="same")
            self.up = nn.ConvTranspose3d(2 * f, f, 2, stride=2)
            self.dec = nn.Conv3d(2 * f, f, (2, 3, 4), padding="same")
            self.head = nn.Conv3d(f, 1, 1)

        def forward(self, x):
            a = torch.relu(self.enc1(x))
            b = torch.relu(self.mid(torch.relu(self.down(a))))
            return self.head(torch.relu(self.dec(torch.cat([a, self.up(b)], 1))))

    model = tmp_path / "unet.onnx"
    try:
        torch.onnx.export(UNet3D().eval(), (torch.rand(1, 2, 8, 8, 8),), str(model),
                          dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "N"}})
    except Exception as err:  # noqa: BLE001 - an exporter this torch lacks
        pytest.skip(f"torch cannot export to ONNX here: {type(err).__name__}")
    out = tmp_path / "unet.csv"
    assert layers_cmd._main(["--from-onnx", str(model), "--input-shape", "1,2,8,8,8",
                             "--out", str(out)], "convbench layers") == 0
    layers = load_layers(str(out))
    assert len(layers) == 6 and sum(x.transposed for x in layers) == 1
    dec = next(x for x in layers if "dec" in x.name)
    assert (dec.pads, dec.pads_end) == ((0, 1, 1), (1, 1, 2))
    capsys.readouterr()
    assert cli.main(["--implementation", "implicitGemm", "--paramscsv", str(out),
                     "--verify", "--strict"]) == 0
    assert "6 passed, 0 failed, 0 unsupported (of 6 layers)" in capsys.readouterr().out


#: torch_conv3d_samples' rows as torch's test suite calls conv3d (kwargs of F.conv3d).
TORCH_SAMPLES = {"same_k1": {"padding": "same"}, "stride2": {"stride": 2},
                 "dilation2": {"dilation": 2}, "valid": {"padding": "valid"},
                 "same_even": {"padding": "same"},
                 "same_even_dilation2": {"padding": "same", "dilation": 2},
                 "same_dilation3": {"padding": "same", "dilation": 3},
                 "groups3": {"groups": 3}, "groups3_stride2": {"stride": 2, "groups": 3}}


def test_torch_conv3d_samples_are_what_torch_computes():
    import torch
    from convkernels.layouts import Pass
    from convbench.check.references import torch_pass
    layers = load_layers("torch_conv3d_samples")
    assert sorted(x.name for x in layers) == sorted(TORCH_SAMPLES)
    assert any(x.asymmetric for x in layers)
    for layer in layers:
        x = torch.rand(layer.input_shape, dtype=torch.float64)
        w = torch.rand(layer.filter_shape, dtype=torch.float64)
        want = torch.nn.functional.conv3d(x, w, **TORCH_SAMPLES[layer.name])
        assert torch.allclose(torch_pass(layer, Pass.FWD, {"x": x, "w": w}), want,
                              rtol=0, atol=1e-12), layer.name


#: The fast tier's general implementations on the samples, one per pass: each verifies
#: every third sample (the n-th its n-th share), so that every sample is verified in
#: every run; the features each sample needs (stride, dilation, groups, 'same' padding
#: with even kernels) are verified for every general implementation by
#: tests/test_general.py and test_general_implementations_verify_asymmetric_padding.
SAMPLE_IMPLS = ("directConvNCDHW", "implicitGemmBwdData", "implicitGemmBwdFilter")


@pytest.mark.parametrize("name", GENERAL)
def test_torch_conv3d_samples_verify(name, builds, reference, request):
    """The fast tier: one general implementation per pass, on a third of the samples each
    (all of them between the three); the full tier: every implementation on every sample."""
    from convbench import registry
    from convbench.build import toolchain
    from convbench.check import verify
    samples = load_layers("torch_conv3d_samples")
    if not request.config.getoption("--full"):
        if name not in SAMPLE_IMPLS:
            pytest.skip("the full tier runs the other general implementations")
        samples = samples[SAMPLE_IMPLS.index(name)::len(SAMPLE_IMPLS)]
    impl = registry.get(name)
    for layer in samples:
        result = verify.verify_build(builds(toolchain.make_spec(impl, layer)),
                                     reference(layer, pass_=impl.pass_))[0]
        assert result.ok, (layer.name, result.summary())


MIXED_CSV = """layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad
good,1,2,3,6,6,6,3,3,3,1,1
too_large,1,2,3,6,6,6,9,3,3,1,0
good2,1,2,3,5,6,7,2,2,2,1,same
not_int,1,2,x,6,6,6,3,3,3,1,1
"""


#: The lines of MIXED_CSV again, the valid ones as layers of the fast tier's (their
#: implicitGemm builds are the session's): a layer per line, None where it is invalid.
MIXED_RUN = [FIRST_SMALL, None, fast_layers("implicitGemm")[-1][1], None]


@pytest.mark.prebuild(*[Case("implicitGemm", x, "mixed") for x in MIXED_RUN if x])
def test_skip_invalid_runs_the_valid_lines_and_lists_the_others(tmp_path, capsys, builds,
                                                                cachedir):
    from convbench.commands import profile_conv3d as cli
    from convbench.layersets.benchdnn import parse_descriptors
    with pytest.raises(LayerFileError, match=":3: field 'k_d'"):
        parse_layers(MIXED_CSV, path="m.csv")
    skipped = []
    assert [x.name for x in parse_layers(MIXED_CSV, path="m.csv", skipped=skipped)] == \
        ["good", "good2"]
    assert [(e.line, e.field) for e in skipped] == [(3, "k_d"), (5, "out_channels")]
    with pytest.raises(LayerFileError, match=":2:"):  # nothing valid: the first error
        parse_layers(MIXED_CSV.splitlines()[0] + "\n" + MIXED_CSV.splitlines()[2] + "\n" +
                     MIXED_CSV.splitlines()[4] + "\n", path="m.csv", skipped=[])
    skipped = []
    layers = parse_descriptors("ic2oc2id8kd3\nic2oc2id8od2kd3pd1\n", path="s", skipped=skipped)
    assert len(layers) == 1 and [e.line for e in skipped] == [2]
    fields = HEADER.strip().split(",")
    lines = MIXED_CSV.splitlines()
    text = "\n".join([lines[0]] + [line if x is None else ",".join(
        str(getattr(x, "name" if f == "layer" else f)) for f in fields)
        for x, line in zip(MIXED_RUN, lines[1:])]) + "\n"
    assert parse_layers(text, skipped=[]) == [x for x in MIXED_RUN if x]  # the same layers
    path = tmp_path / "m.csv"
    path.write_text(text)
    rc = cli.main(["--implementation", "implicitGemm", "--paramscsv", str(path), "--verify",
                   "--skip-invalid", "--cachedir", str(cachedir), "--loadprecompiled"])
    out, err = capsys.readouterr()
    assert rc == 0 and err.count("skipped: ") == 2 and ":5: field 'out_channels'" in err, err
    assert "2 passed, 0 failed" in out, out
