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
