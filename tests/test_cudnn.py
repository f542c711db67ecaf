"""cudnn_bindings: loading, version, enums against the headers, descriptors (no GPU
needed), error reporting, object lifetimes; the three passes on a GPU (marked gpu)."""

import gc
import re
import subprocess

import pytest

import cudnn_bindings as cb
from conftest import ENV, PYTHON, ROOT
from convbench.commands import profile_conv3d as cli
from convbench.timing import devices
from convbench.layersets.layer import Layer
from cudnn_bindings import conv, enums, library

NO_GPU = pytest.mark.skipif(devices.gpu_usable(), reason="a GPU is usable here")


def lib_or_skip():
    try:
        return cb.load()
    except cb.CudnnNotFound as err:  # the project installs the wheel; a bare system may not
        pytest.skip(str(err))


def test_import_needs_no_gpu_and_no_cudnn():
    env = dict(ENV, CONVBENCH_CUDNN="/nonexistent/libcudnn.so.9", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([PYTHON, "-c", "import cudnn_bindings, sys; "
                           "print(cudnn_bindings.problem())"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "libcudnn not found" in proc.stdout and "$CONVBENCH_CUDNN" in proc.stdout


def test_version_matches_the_headers():
    lib = lib_or_skip()
    major, minor, patch = cb.version()
    assert major == 9 and lib.version == major * 10000 + minor * 100 + patch
    folders = library.include_dirs()
    if not folders:
        pytest.skip("no cuDNN headers next to the library")
    text = (folders[0] / "cudnn_version.h").read_text()
    defines = dict(re.findall(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", text))
    assert (major, minor, patch) == (int(defines["MAJOR"]), int(defines["MINOR"]),
                                     int(defines["PATCHLEVEL"]))


def header_values_or_skip():
    lib_or_skip()
    folders = library.include_dirs()
    if not folders:
        pytest.skip("no cuDNN headers next to the library")
    return library.header_values(folders[0])


def test_enum_values_match_the_headers():
    values = header_values_or_skip()
    assert library.enum_mismatches(values) == []
    assert sum(len(cls) for cls in enums.PREFIXES) > 50


def test_a_wrong_or_missing_enum_value_is_caught(tmp_path):
    """The comparison has teeth: headers with one value changed and one name removed."""
    values = dict(header_values_or_skip())
    values["CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM"] = 2
    del values["CUDNN_FMA_MATH"]
    assert library.enum_mismatches(values) == [
        "CUDNN_FMA_MATH: not in the headers",
        "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: headers say 2, the bindings 1"]


def test_search_order_and_env_override(monkeypatch):
    lib = lib_or_skip()
    monkeypatch.delenv(library.ENV_VAR, raising=False)
    found = library.candidates()
    where = [w for w, _ in found]
    # torch's wheel first (the project installs it), the system's last
    assert found[0] == ("torch's cuDNN wheel", str(lib.path)) and lib.source == found[0][0]
    assert where[-1] == "system" and where.index("system") > 0
    monkeypatch.setenv(library.ENV_VAR, str(lib.path.parent))  # a folder works
    assert library.candidates() == [(f"${library.ENV_VAR}", str(lib.path))]
    monkeypatch.setenv(library.ENV_VAR, "/nonexistent/libcudnn.so.9")  # no fallback
    library.load.cache_clear()
    try:
        with pytest.raises(cb.CudnnNotFound, match="CONVBENCH_CUDNN.*nonexistent"):
            library.load()
    finally:
        monkeypatch.delenv(library.ENV_VAR)
        library.load.cache_clear()


@NO_GPU
def test_handle_without_gpu_fails_clearly():
    lib_or_skip()
    with pytest.raises(cb.CudnnError) as info:
        cb.Handle()
    err = info.value
    assert err.call == "cudnnCreate" and err.status_name.startswith("CUDNN_STATUS_")
    assert "needs a usable CUDA device" in str(err)
    assert cb.live_objects().get("handle", 0) == 0
    assert "cudnnCreate failed" in cb.problem()


@pytest.mark.parametrize("layer", [
    Layer("a", 2, 3, 4, 6, 5, 7, 3, 3, 3, 1, 1),
    Layer("b", 1, 4, 6, 9, 8, 7, 3, 1, 5, stride=2, pad=1),
    Layer("c", 1, 1, 16, 130, 130, 130, 3, 3, 3),
    Layer("d", 3, 8, 2, 5, 5, 5, 1, 1, 1, stride=2),
    # the whole layer model: per-dimension stride and dilation, groups (and depthwise)
    Layer("e", 1, 6, 4, 9, 7, 8, 3, 2, 3, stride=2, pad=2, pad_d=1, stride_d=3, dilation=2,
          dilation_h=1, groups=2),
    Layer("f", 2, 6, 6, 6, 6, 6, 3, 3, 3, stride=2, stride_d=1, pad=1, groups=6),
], ids=lambda x: x.name)
@pytest.mark.parametrize("channels_last", [False, True])
def test_descriptors_give_the_layer_output_shape(layer, channels_last):
    """The Nd descriptors, built without a GPU, make cuDNN compute the same output shape
    as the layer model, for NCDHW and NDHWC strides."""
    lib_or_skip()
    n, c, d, h, w = layer.input_shape
    strides = (c * d * h * w, 1, h * w * c, w * c, c) if channels_last else (
        c * d * h * w, d * h * w, h * w, w, 1)
    fmt = enums.TensorFormat.NHWC if channels_last else enums.TensorFormat.NCHW
    with cb.TensorDescriptor(enums.DataType.FLOAT, layer.input_shape, strides) as x, \
            cb.FilterDescriptor(enums.DataType.FLOAT, fmt, layer.filter_shape) as wd, \
            cb.ConvolutionDescriptor(layer.pads, layer.strides, layer.dilations,
                                     enums.DataType.FLOAT, enums.MathType.FMA_MATH,
                                     groups=layer.groups) as cd:
        assert cb.output_dims(x, wd, cd) == layer.output_shape


def test_bad_descriptor_raises_with_call_and_status():
    lib_or_skip()
    before = cb.live_objects().get("tensor", 0)
    with pytest.raises(cb.CudnnError) as info:
        cb.TensorDescriptor(enums.DataType.FLOAT, (2, 3, -4, 5, 6), (360, 120, 30, 6, 1))
    assert info.value.call == "cudnnSetTensorNdDescriptor"
    assert "CUDNN_STATUS_BAD_PARAM" in str(info.value)
    del info
    gc.collect()
    assert cb.live_objects().get("tensor", 0) == before  # the half-made descriptor is freed


def test_no_leaks_across_thousands_of_descriptors():
    lib_or_skip()
    base = cb.live_objects()
    for i in range(3000):
        t = cb.TensorDescriptor(enums.DataType.FLOAT, (1, 2, 3, 4, 5), (120, 60, 20, 5, 1))
        if i % 2:
            t.close()
            t.close()  # idempotent
            assert t.closed
        # the even ones are released by garbage collection
    del t
    gc.collect()
    assert cb.live_objects() == base


@pytest.mark.parametrize("pass_, algo, expected", [
    ("fwd", "IMPLICIT_PRECOMP_GEMM", 1), ("fwd", "implicit_gemm", 0), ("fwd", 3, 3),
    ("bwd_data", "1", 1), ("bwd_data", "ALGO_FFT", 2), ("bwd_filter", "3", 3),
    ("fwd", "find", None), ("bwd_filter", "Heuristic", None)])
def test_parse_algo(pass_, algo, expected):
    assert conv.parse_algo(pass_, algo) == expected


def test_parse_algo_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown fwd algorithm 'FASTEST'.*IMPLICIT_GEMM"):
        conv.parse_algo("fwd", "FASTEST")
    with pytest.raises(ValueError):
        conv.parse_algo("fwd", "COUNT")


def test_cli_rejects_unknown_cudnn_algo(capsys):
    assert cli.main(["--verify", "--device", "cpu", "--cudnn-algo", "FASTEST"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cudnn-algo: unknown fwd algorithm 'FASTEST'" in err[0]


# -- on a GPU ---------------------------------------------------------------------------------

GPU_LAYERS = [Layer("g1", 2, 3, 5, 6, 7, 8, 3, 3, 3, pad=1),
              Layer("g2", 1, 4, 6, 9, 8, 7, 3, 1, 5, stride=2, pad=1),
              Layer("g3", 1, 6, 4, 9, 7, 8, 3, 2, 3, stride=2, pad=2, pad_d=1, stride_d=3,
                    dilation=2, dilation_h=1, groups=2),
              Layer("g4", 2, 6, 6, 6, 6, 6, 3, 3, 3, stride=2, stride_d=1, pad=1, groups=6)]


def _torch_passes(layer, x, w, dy):
    from convbench.check.references import torch_pass
    exact = {"x": x.double().cpu(), "w": w.double().cpu(), "y": dy.double().cpu()}
    return {p: torch_pass(layer, p, exact) for p in ("fwd", "bwd_data", "bwd_filter")}


@pytest.mark.gpu
@pytest.mark.parametrize("layer", GPU_LAYERS, ids=lambda x: x.name)
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("float16", 2e-2)])
@pytest.mark.parametrize("algo", ["find", "heuristic"])
def test_gpu_three_passes_match_torch(layer, dtype, tol, algo):
    import torch
    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    x = torch.rand(layer.input_shape, device="cuda").mul(2).sub(1).to(tdt)
    w = torch.rand(layer.filter_shape, device="cuda").mul(2).sub(1).to(tdt)
    dy = torch.rand(layer.output_shape, device="cuda").mul(2).sub(1).to(tdt)
    ref = _torch_passes(layer, x, w, dy)
    geo = dict(stride=layer.strides, padding=layer.pads, dilation=layer.dilations,
               groups=layer.groups, algo=algo)
    got = {"fwd": cb.conv3d_forward(x, w, **geo),
           "bwd_data": cb.conv3d_backward_data(dy, w, x.shape, **geo),
           "bwd_filter": cb.conv3d_backward_filter(x, dy, w.shape, **geo)}
    torch.cuda.synchronize()
    for name, out in got.items():
        err = (out.double().cpu() - ref[name]).abs().max() / ref[name].abs().max()
        assert err < tol, f"{name}: relative error {err:.2e}"


@pytest.mark.gpu
def test_gpu_channels_last_and_fixed_algorithm_and_plan_reuse():
    import torch
    layer = GPU_LAYERS[0]
    x = torch.randn(layer.input_shape, device="cuda").contiguous(
        memory_format=torch.channels_last_3d)
    w = torch.randn(layer.filter_shape, device="cuda").contiguous(
        memory_format=torch.channels_last_3d)
    ref = torch.nn.functional.conv3d(x.double(), w.double(), padding=layer.pad)
    y = cb.conv3d_forward(x, w, 1, layer.pad, algo="IMPLICIT_PRECOMP_GEMM")
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    assert (y.double() - ref).abs().max() < 1e-3
    before = cb.live_objects()
    for _ in range(50):
        cb.conv3d_forward(x, w, 1, layer.pad, algo="IMPLICIT_PRECOMP_GEMM", out=y)
    assert cb.live_objects() == before  # the cached plan is reused
    p = cb.plan("fwd", x, w, y, 1, layer.pad, 1, algo="find")
    info = p.info()
    assert info["method"] == "find" and info["table"] and info["find_ms"] >= 0
    assert info["math"] == "FMA_MATH"  # IEEE FP32 by default


@pytest.mark.gpu
def test_gpu_runs_on_torch_current_stream():
    import torch
    layer = GPU_LAYERS[1]
    x = torch.randn(layer.input_shape, device="cuda")
    w = torch.randn(layer.filter_shape, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = cb.conv3d_forward(x, w, layer.stride, layer.pad)
        assert cb.handle()._stream == stream.cuda_stream
    stream.synchronize()
    ref = torch.nn.functional.conv3d(x.double(), w.double(), stride=layer.stride,
                                     padding=layer.pad)
    assert (y.double() - ref).abs().max() < 1e-3
