"""Layer model and layer-set CSV parsing, including every class of bad input."""

import pytest

from convbench.errors import LayerFileError, UsageError
from convbench.layers import Layer, parse_layers
from convbench.layersets import load_layers, select_layers

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
    from convbench.layers import format_csv
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
    from convbench.layouts import Pass
    from convbench.references import CudnnReference, torch_pass
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
    from convbench import registry, toolchain, verify
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
