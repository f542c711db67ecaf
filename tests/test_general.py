"""Any 3D convolution: per-dimension stride and dilation, groups (depthwise included) and
transposed convolutions; the layer sources (CSV with a byte-order mark, CRLF and comments,
benchdnn descriptor files, a torch model's layers); bad input refused up front.

Fast tier: the general implementations (those that handle every feature) on two small
layers that together need all of it, in every pass; planted bugs that verification must
catch; refusals with reasons; the readers; and the layers of a small torch model,
extracted and verified.  Full tier (``--full``): the general implementations on every
general layer, and every implementation on the new sets (3D U-Net, V-Net, X3D-XS: their
spatial sizes capped, see :func:`capped`) and on oneDNN's shapes_3d suite as it is.
"""

import dataclasses
import types

import pytest

from cases import IMPLS, Case, case_params, cases, verify_case
from conftest import assert_usage_error, in_process
from convbench import registry
from convbench.commands import profile_conv3d as cli
from convbench.build import toolchain
from convbench.check import verify
from convbench.layersets.benchdnn import (descriptor_layer, parse_descriptor,
                                          parse_descriptors)
from convbench.base.errors import LayerFileError
from convbench.layersets.layer import FEATURES, Layer, format_csv, parse_layers
from convbench.layersets.sets import load_layers
from convkernels.layouts import Pass

#: Small layers that need the features (``all`` needs every one of them at once).
GENERAL = [
    Layer("all", 1, 6, 4, 9, 7, 8, 3, 2, 3, stride=2, pad=2, pad_d=1, stride_d=3, dilation=2,
          dilation_h=1, groups=2),
    Layer.transposed_of("up_g2", 1, 6, 4, (3, 3, 4), (3, 3, 3), (2, 2, 2), (1, 1, 1),
                        groups=2, output_pad=(1, 1, 1)),
    Layer("aniso_stride", 2, 4, 6, 5, 9, 8, 3, 3, 3, stride=2, pad=1, pad_d=0, stride_d=1),
    Layer("dilated", 1, 3, 5, 7, 8, 9, 3, 3, 2, pad=2, dilation=2, dilation_h=1),
    Layer("grouped", 1, 8, 12, 5, 6, 7, 3, 3, 3, pad=1, groups=4),
    Layer("depthwise_s122", 2, 6, 6, 6, 6, 6, 3, 3, 3, stride=2, stride_d=1, pad=1, groups=6),
    Layer.transposed_of("up_k2s2", 1, 8, 4, (3, 4, 5), (2, 2, 2), (2, 2, 2)),
]
GENERAL_IMPLS = sorted(n for n in IMPLS if set(registry.get(n).handles) == set(FEATURES))

#: The new layer sets (verified with their spatial sizes capped at NEW_SET_CAP) and the suite
#: of benchdnn descriptors (verified as it is).
NEW_SETS = ("unet3d", "vnet", "x3d_xs")
NEW_SET_CAP = 8
SUITE = "onednn_shapes_3d"


def capped(layer: Layer, limit: int = NEW_SET_CAP) -> Layer:
    """``layer`` with each input size cut to at most ``limit`` (not below what its dilated
    kernel spans): channels, kernel, stride, padding, dilation, groups and the transposed
    mark stay, so every code path the layer takes stays, at a cost a test tier can pay."""
    sizes = {}
    for d, k, p, e in zip("dhw", (layer.k_d, layer.k_h, layer.k_w), layer.pads, layer.dilations):
        size = getattr(layer, f"in_{d}")
        sizes[f"in_{d}"] = min(size, max(limit, e * (k - 1) + 1 - 2 * p))
    return dataclasses.replace(layer, **sizes)


def new_set_layers():
    return ([(s, capped(layer)) for s in NEW_SETS for layer in load_layers(s)]
            + [(SUITE, layer) for layer in load_layers(SUITE)])


FAST = cases(GENERAL_IMPLS, [("general", GENERAL[0]), ("general", GENERAL[1])])
FULL = cases(GENERAL_IMPLS, [("general", layer) for layer in GENERAL]) + cases(
    IMPLS, new_set_layers())


@pytest.mark.parametrize("case", case_params(FAST, FULL))
def test_verifies(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


def test_every_pass_has_a_general_implicit_gemm_and_direct_implementation():
    by_pass = {p: [n for n in GENERAL_IMPLS if registry.get(n).pass_ == p] for p in Pass}
    for p, names in by_pass.items():
        assert any(n.startswith("implicitGemm") for n in names), (p, names)
        assert any(n.startswith("directConv") for n in names), (p, names)


@pytest.mark.parametrize("layer", GENERAL[2:5], ids=lambda layer: layer.name)
def test_the_others_refuse_with_the_reason(layer):
    """An implementation that does not handle a feature the layer needs refuses it, naming
    the feature and this layer's value of it."""
    needed = set(layer.features())
    assert needed
    for name in IMPLS:
        impl = registry.get(name)
        reason = impl.unsupported_reason(layer, impl.resolve_params())
        missing = needed - set(impl.handles)
        if missing:
            assert reason and "does not handle" in reason, (name, reason)
            assert any(f in reason for f in missing), (name, reason)
        else:
            assert reason is None or not reason.startswith("does not handle"), (name, reason)


# -- planted bugs ------------------------------------------------------------------------------

def _planted(monkeypatch, module_name, change):
    """Patch ``layer_constants`` in an implementation's module with ``change`` applied to
    its result (sizes stay: only what the program reads or sums goes wrong)."""
    import importlib
    module = importlib.import_module(module_name)
    real = module.layer_constants

    def wrong(layer, layout):
        return change(real(layer, layout))
    monkeypatch.setattr(module, "layer_constants", wrong)


def _drop_dilation(L):
    return dataclasses.replace(L, ED=1, EH=1, EW=1)


def _one_group(L):  # every filter reads the first group's channels
    return dataclasses.replace(L, G=1, KG=L.K)


PLANTED = [("implicitGemm", "convkernels.auto.implicit_gemm", _drop_dilation, GENERAL[0]),
           ("directConvNCDHWBwdData", "convkernels.auto.direct", _one_group, GENERAL[4]),
           ("implicitGemmBwdFilter", "convkernels.auto.implicit_gemm", _drop_dilation, GENERAL[3])]


@pytest.mark.parametrize("impl, module, change, layer", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_feature_bugs_are_caught(monkeypatch, builds, reference, impl, module, change,
                                         layer):
    """A kernel that ignores the dilation, or sums one group's channels for every filter,
    builds and runs; verification against torch float64 must fail it."""
    _planted(monkeypatch, module, change)
    spec = toolchain.make_spec(registry.get(impl), layer, planted=change.__name__)
    check = verify.verify_build(builds(spec), reference(layer, pass_=registry.get(impl).pass_))[0]
    assert not check.ok, check.summary()


# -- the layer model and its readers ------------------------------------------------------------

CANONICAL = "layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad"


def test_spreadsheet_csv_reads(tmp_path):
    """A byte-order mark, CRLF line ends, comment and blank lines: the layers of the plain file."""
    plain = CANONICAL + ",groups\nl1,1,4,8,5,6,7,3,3,3,1,1,2\n"
    saved = ("\ufeff# saved by a spreadsheet\r\n" + plain.replace("\n", "\r\n") + "\r\n"
             "  # a comment after the layers\r\n")
    path = tmp_path / "sheet.csv"
    path.write_bytes(saved.encode("utf-8"))
    assert load_layers(str(path)) == parse_layers(plain)
    assert load_layers(str(path))[0].groups == 2


def test_layer_model_sizes_match_torch():
    import torch
    for layer in GENERAL:
        x = torch.zeros(layer.input_shape)
        w = torch.zeros(layer.filter_shape)
        y = torch.nn.functional.conv3d(x, w, stride=layer.strides, padding=layer.pads,
                                       dilation=layer.dilations, groups=layer.groups)
        assert tuple(y.shape) == layer.output_shape, layer.name
        if layer.transposed:  # and the transposed convolution gives the input back
            t = torch.nn.functional.conv_transpose3d(
                y, w, stride=layer.strides, padding=layer.pads, dilation=layer.dilations,
                groups=layer.groups, output_padding=layer.output_pads)
            assert tuple(t.shape) == layer.input_shape, layer.name


def test_keys_of_the_basic_model_are_unchanged():
    """Tuning entries and caches are keyed by ``Layer.key()``: the basic model keeps its form."""
    layer = Layer("c", 2, 16, 32, 66, 66, 66, 3, 3, 3)
    assert layer.key() == "b2_c16_k32_i66x66x66_f3x3x3_s1_p0"
    assert GENERAL[0].key().endswith("_s3x2x2_p1x2x2_d2x1x2_g2")


def test_csv_round_trip_of_every_set():
    for name in ("cosmoflow", "unet3d", "vnet", "x3d_xs", SUITE):
        layers = load_layers(name)
        assert [x.normalized() for x in parse_layers(format_csv(layers))] == \
            [x.normalized() for x in layers], name
    assert [x.normalized() for x in parse_layers(format_csv(GENERAL))] == \
        [x.normalized() for x in GENERAL]


@pytest.mark.parametrize("row, words", [
    ("groups\na,1,6,4,5,5,5,3,3,3,1,0,4", "field 'groups': in_channels=6 is not a multiple"),
    ("groups\na,1,6,6,5,5,5,3,3,3,1,0,0", "field 'groups': must be a positive integer"),
    ("stride_d\na,1,2,2,5,5,5,3,3,3,1,0,0", "field 'stride_d': must be a positive integer"),
    ("dilation\na,1,2,2,5,5,5,3,3,3,1,0,0", "field 'dilation': must be a positive"),
    ("dilation\na,1,2,2,5,5,5,3,3,3,1,0,3", "field 'k_d': dilated kernel (3 taps, span 7)"),
    ("transposed,output_pad\na,1,2,2,5,5,5,3,3,3,2,0,1,2", "field 'output_pad': output "
     "padding 2 must be below the stride 2"),
    ("output_pad\na,1,2,2,5,5,5,3,3,3,2,0,1", "field 'output_pad': only a transposed layer"),
    ("transposed\na,1,2,2,5,5,5,3,3,3,2,0,2", "field 'transposed': must be 0 or 1"),
])
def test_bad_new_fields_are_one_line_errors(capsys, write_csv, row, words):
    path = write_csv(CANONICAL + "," + row + "\n")
    result = in_process(cli, capsys)("--verify", "--device", "cpu", "--paramscsv", path)
    line = assert_usage_error(result, words)
    assert str(path) in line


# -- benchdnn descriptors ----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    # only depth given: a cube; batch 2 by default
    ('g3_ic6oc6_id56kd3sd2_n"s2"', "6->6 @56^3 k3^3 s2 p0 g3 b2"),
    # benchdnn's dilation is the gap between taps: dd1 is dilation 2
    ("mb1ic4oc4id9ih9iw9kd3kh3kw3dd1dh1dw1", "4->4 @9^3 k3^3 s1 p0 d2 b1"),
    # no depth: a 2D problem, depth 1
    ("mb1ic2oc3ih5iw6kh3kw3ph1pw1", "2->3 @1x5x6 k1x3x3 s1 p0,1,1 b1"),
    # the output size given, the padding computed
    ("ic2oc2id8od8kd3", "2->2 @8^3 k3^3 s1 p1 b2"),
    ("g1ic32oc64_id64od32kd2sd2dd0pd0_ih64oh32kh2sh2dh0ph0_iw32ow16kw2sw2dw0pw0_n\"vnet:conv1\"",
     "32->64 @64x64x32 k2^3 s2 p0 b2"),
    ("ic4oc4_id10ih13iw50_kd3kh3kw3_sd1sh2sw2", "4->4 @10x13x50 k3^3 s1,2,2 p0 b2"),
    # an output size that symmetric padding does not give: benchdnn's right padding
    ("ic2oc2id8od5kd3sd2", "2->2 @8^3 k3^3 s2 p1/2 b2"),
])
def test_benchdnn_descriptors(text, expected):
    assert descriptor_layer(parse_descriptor(text)).describe() == expected


@pytest.mark.parametrize("text, words", [
    ("ic2oc2id8od2kd3pd1", "od2 is not what id8 kd3 sd1 dd0 give with any padding of pd1"),
    ("ic2id8kd3", "oc is missing"),
    ("ic2oc2id8kd3xy4", "cannot read 'xy4'"),
    ("ic2oc2id8id9kd3", "id is given twice"),
    ("g4ic6oc8id8kd3", "not a multiple of groups=4"),
    ("--dir=BWD_D", "only problem descriptors are read"),
])
def test_bad_descriptors_name_the_line(text, words):
    with pytest.raises(LayerFileError) as err:
        parse_descriptors("# a suite\n\n" + text + "\n", path="suite")
    assert "suite:3" in str(err.value) and words in str(err.value), str(err.value)


def test_the_benchdnn_suite_reads_as_it_is():
    layers = load_layers(SUITE)
    assert len(layers) == 19
    by_name = {x.name: x for x in layers}
    assert by_name["3d_conv_pad:4"].output_shape == (2, 256, 13, 9, 11)  # 1x1x1 kernel, pad 1
    assert by_name["3d_gconv_channel-block-8"].groups == 8
    assert "onednn_shapes_3d" in cli_sets()


def cli_sets():
    from convbench.layersets.sets import available_layer_sets
    return available_layer_sets()


# -- layers from a torch model -----------------------------------------------------------------

def small_net():
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv3d(3, 8, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
        nn.Conv3d(8, 8, 3, padding=2, dilation=2, groups=8),
        nn.Conv3d(8, 16, 3, padding="same", groups=2),
        nn.ConvTranspose3d(16, 4, 3, stride=2, padding=1, output_padding=(0, 1, 1)),
        nn.Conv3d(4, 4, 2, stride=2))


TORCH_INPUT = (2, 3, 4, 10, 10)
TORCH_LAYERS = [
    "3->8 @4x10x10 k1x3x3 s1,2,2 p0,1,1 b2",
    "8->8 @4x5x5 k3^3 s1 p2 d2 g8 b2",
    "8->16 @4x5x5 k3^3 s1 p1 g2 b2",
    "4->16 @7x10x10 k3^3 s2 p1 (transposed: fwd is bwd_data) b2",
    "4->4 @7x10x10 k2^3 s2 p0 b2",
]


def torch_cases():
    from convbench.commands.layers import from_torch
    layers = from_torch(small_net(), TORCH_INPUT)
    # every layer forward; the transposed one (its forward is bwd_data) in that pass too
    return (cases(["implicitGemm"], [("torch", x) for x in layers])
            + cases(["directConvNCDHWBwdData"], [("torch", layers[3])]))


#: Fast tier: the anisotropic strided layer, the dilated depthwise one and the transposed
#: one in its own pass (the general layers above cover the others' features); full: all.
TORCH_FAST = [c for c in torch_cases() if c.layer.name in ("0", "1")
              or c.impl == "directConvNCDHWBwdData"]


def test_layers_of_a_torch_model():
    from convbench.commands.layers import from_torch
    layers = from_torch(small_net(), TORCH_INPUT)
    assert [x.describe() for x in layers] == TORCH_LAYERS
    assert [x.name for x in layers] == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("case", case_params(TORCH_FAST, torch_cases()))
def test_layers_of_a_torch_model_verify(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


def test_layers_command_writes_a_csv_from_a_torch_model(tmp_path, monkeypatch, capsys):
    from convbench.commands import layers as command
    (tmp_path / "mynet.py").write_text(
        "import torch.nn as nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Conv3d(2, 4, 3, stride=(1, 2, 2), padding=1), nn.ReLU(),\n"
        "                         nn.Conv3d(4, 4, 3, groups=4, dilation=(1, 2, 2)))\n")
    monkeypatch.chdir(tmp_path)  # MODULE is found in the current folder
    run = in_process(types.SimpleNamespace(main=command.main), capsys)
    out = tmp_path / "net.csv"
    result = run("--from-torch", "mynet:make", "--input-shape", "1,2,6,9,9", "--out", out)
    assert result.returncode == 0, result.stderr
    layers = load_layers(str(out))
    assert [x.describe() for x in layers] == ["2->4 @6x9x9 k3^3 s1,2,2 p1 b1",
                                              "4->4 @6x5x5 k3^3 s1 p0 d1,2,2 g4 b1"]
    for args, words in [(("--from-torch", "mynet:nosuch", "--input-shape", "1,2,6,9,9"),
                         "has no 'nosuch'"),
                        (("--from-torch", "mynet:make"), "needs --input-shape"),
                        (("--from-torch", "nonet.py:make", "--input-shape", "1,2,6,9,9"),
                         "cannot import 'nonet.py'"),
                        (("--from-torch", "mynet:make", "--input-shape", "1,2,6"),
                         "five positive integers"),
                        (("--from-torch", "mynet:make", "--input-shape", "1,3,6,9,9"),
                         "forward pass on (1, 3, 6, 9, 9) failed")]:
        assert_usage_error(run(*args), words)


# -- bad paths and runs that do nothing, refused up front --------------------------------------

def test_bad_paths_are_refused_before_any_work(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    run = in_process(cli, capsys)
    for args, words in [
            (("--compareprof", "--outdir", a_file / "sub"), "--outdir: "),
            (("--compareprof", "--outdir", a_file), "exists and is not a folder"),
            (("--verify", "--cachedir", a_file), "--cachedir: "),
            (("--verify", "--paramscsv", tmp_path), "is not a file")]:
        assert_usage_error(run("--device", "cpu", "--impl", "implicitGemm", *args), words)


def test_a_run_that_verifies_nothing_exits_2(capsys, write_csv):
    path = write_csv(format_csv(GENERAL[2:4]))
    result = in_process(cli, capsys)("--verify", "--device", "cpu", "--paramscsv", path,
                                     "--impl", "directConvNDHWCblocked")
    assert_usage_error(result, "nothing to be verified", "does not handle")


def test_run_metadata_counts_untracked_sources_as_dirty(tmp_path):
    """A result's commit line must not read clean when new source files are not committed
    yet; results and outputs are not sources; the hash tells two dirty trees apart."""
    import subprocess

    from convbench.results.writer import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "0")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git("add", "kernel.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "1")
    assert git_commit(tmp_path)["dirty"] is False
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text("{}")
    assert git_commit(tmp_path)["dirty"] is False
    (tmp_path / "new_impl.py").write_text("b = 2\n")
    first = git_commit(tmp_path)
    assert first["dirty"] is True and first["changed"] == ["new_impl.py"]
    (tmp_path / "new_impl.py").write_text("b = 3\n")
    second = git_commit(tmp_path)
    assert second["diff_sha256"] != first["diff_sha256"]
    (tmp_path / "new_impl.py").unlink()
    (tmp_path / "kernel.py").write_text("a = 2\n")
    third = git_commit(tmp_path)
    assert third["dirty"] is True and third["changed"] == ["kernel.py"]
