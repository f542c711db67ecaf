"""scripts/stress_test.py (:mod:`convbench.commands.stress`): a small run end to end, the
memory refusal, bad flags, and the sub-volume check, which must catch a planted error."""

import json
import math
import subprocess
import time

import pytest
import torch
import torch.nn.functional as F

from conftest import ENV, PYTHON, ROOT, in_process
from conftest import assert_usage_error as _assert_usage_error
from convbench.timing import memory
from convbench.commands import stress
from convbench.layersets.layer import Layer

SCRIPT = ROOT / "scripts" / "stress_test.py"
PREFIX = "stress_test.py: error: "
SMALL = ["--size", "24", "--in-channels", "4", "--out-channels", "8", "--device", "cpu"]


@pytest.fixture(scope="module")
def stress_cache(tmp_path_factory):
    """One build cache for this module, so that the small layer is compiled once."""
    return tmp_path_factory.mktemp("stress_builds")


def run(*args, timeout=300):
    """The script in its own process."""
    return subprocess.run([PYTHON, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=timeout)


@pytest.fixture
def main(capsys):
    """The script's ``main`` in this process, returning what ``run`` returns."""
    return in_process(stress, capsys)


def assert_usage_error(result, *words):
    return _assert_usage_error(result, *words, prefix=PREFIX)


# -- a small run ---------------------------------------------------------------------------

def test_small_run_checks_and_writes_json(tmp_path, stress_cache):
    out = tmp_path / "stress.json"
    result = run(*SMALL, "--iters", "1", "--warmup", "0", "--check", "--cachedir", stress_cache,
                 "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("stress: implicitGemm ") and " vs torch " in last, last
    assert "GFLOP/s" in last and "peak mem dace " in last and last.endswith("check passed"), last
    for word in ("building implicitGemm", "running torch", "running implicitGemm", "median ms",
                 "check planes 0..1", "check planes 22..23"):
        assert word in result.stdout, word

    data = json.loads(out.read_text())
    meta, records = data["meta"], data["records"]
    assert [r["backend"] for r in records] == ["torch", "dace"]
    layer = stress.make_layer(24, 4, 8, 1, 3, 1, 1)
    for rec in records:
        assert rec["samples"] == 1 and rec["median_ms"] > 0 and rec["first_call_ms"] > 0
        assert rec["gflop_per_s"] == pytest.approx(layer.flops() / rec["median_ms"] / 1e6)
        assert isinstance(rec["peak_mem_bytes"], int) and rec["peak_mem_bytes"] >= 0
        assert rec["peak_mem_gib"] == pytest.approx(rec["peak_mem_bytes"] / 2 ** 30)
        assert rec["peak_rss_bytes"] >= rec["baseline_bytes"] > 0
        assert "VmHWM" in rec["method"] or "ru_maxrss" in rec["method"]
    # torch's output (442 KiB) at least is allocated within its phase.
    assert records[0]["peak_mem_bytes"] >= 4 * math.prod(layer.output_shape)
    est = meta["memory_estimate"]
    assert est["peak_bytes"] == max(est["torch_phase_bytes"], est["dace_phase_bytes"]) > 0
    assert est["sdfg_transient_bytes"] == 4 * 4 * 26 ** 3  # implicitGemm's padded input
    assert meta["memory_available"]["bytes"] > est["peak_bytes"]
    assert meta["layer"]["output_shape"] == [1, 8, 24, 24, 24]
    assert meta["check"]["ok"] is True
    assert [r["planes"] for r in meta["check"]["regions"]] == [[0, 1], [22, 23]]
    assert all(r["nonfinite"] == 0 and r["worst_ratio"] < 1 for r in meta["check"]["regions"])
    assert meta["summary"] == last


def test_check_fails_on_a_planted_error_in_the_dace_output(tmp_path, stress_cache,
                                                           monkeypatch, capsys):
    """End to end, in-process: every DaCe call leaves one wrong element at the far end of
    the stored output; the run must report the check as failed and exit 1."""
    from convbench.timing import timers
    real = timers.prepared_call

    def corrupting(build, arrays, fresh=None):
        assert fresh is None, "stress times DaCe in place"
        call = real(build, arrays)
        last = arrays["y"].view(-1)

        def bad():
            result = call()
            last[-1] += 1.0  # NDHWC: the last channel of the last pixel
            return result
        bad.keepalive = arrays
        bad.first_ms = call.first_ms
        return bad
    monkeypatch.setattr(timers, "prepared_call", corrupting)
    out = tmp_path / "bad.json"
    status = stress.main([*SMALL, "--iters", "1", "--warmup", "0", "--check", "--skip-torch",
                          "--cachedir", str(stress_cache), "--out", str(out)])
    text = capsys.readouterr().out
    assert status == 1, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("stress: implicitGemm ") and "torch skipped" in last, last
    assert last.endswith(", check FAILED"), last
    assert "check planes 22..23" in text and "FAIL" in text
    regions = json.loads(out.read_text())["meta"]["check"]["regions"]
    assert [r["ok"] for r in regions] == [True, False]


# -- memory ---------------------------------------------------------------------------------

def test_refuses_a_layer_that_does_not_fit_without_building(tmp_path, main):
    cache = tmp_path / "cache"
    t0 = time.perf_counter()
    result = main("--device", "cpu", "--memory-limit", "0.001", "--cachedir", cache,
                  "--out", tmp_path / "never.json")
    elapsed = time.perf_counter() - t0
    line = assert_usage_error(result, "layer needs ~", " GiB available on cpu",
                              "use --size to shrink it")
    needed = float(line.split("needs ~")[1].split(" GiB")[0])
    assert 6.0 < needed < 10.0, line  # the 256^3 default: 1 GiB in, 2 GiB out, per phase
    assert result.stdout == ""
    assert not cache.exists() and not (tmp_path / "never.json").exists()
    assert elapsed < 30, elapsed


def test_refusal_suggests_a_size_that_fits(tmp_path, main):
    from convbench.timing import timers
    # a limit 1.25 GiB above what the timer's flush buffer takes (4x the L3: 2 GB on a VM
    # that reports a 480 MiB L3), so that sizes between 100 and 256 are what fits
    flush = timers.cpu_flush_bytes()
    limit = round((flush / stress.MEMORY_MARGIN + 1.25 * 2 ** 30) / 2 ** 30, 1)
    result = main("--device", "cpu", "--memory-limit", limit, "--cachedir", tmp_path / "cache",
                  "--out", tmp_path / "never.json")
    line = assert_usage_error(result, f"only {limit:.1f} GiB available on cpu", "use --size ")
    size = int(line.split("use --size ")[1].split()[0])
    assert 100 < size < 256
    usable = stress.MEMORY_MARGIN * limit * 2 ** 30

    def need(s):
        return memory.memory_estimate(stress.make_layer(s, 16, 32, 1, 3, 1, 1), "cpu",
                                      flush)["peak_bytes"]
    assert need(size) <= usable < need(size + 1)


def test_memory_estimate_formula():
    layer = stress.make_layer(256, 16, 32, 1, 3, 1, 1)
    assert layer.input_shape == (1, 16, 256, 256, 256) and layer.output_shape == (1, 32, 256, 256, 256)
    X, W, Y = 2 ** 30, 4 * 32 * 16 * 27, 2 ** 31
    Xp = 4 * 16 * 258 ** 3
    flush = 128 << 20
    est = memory.memory_estimate(layer, "cpu", flush)
    assert est["torch_phase_bytes"] == flush + 2 * (X + W) + Y + Xp + Y
    assert est["dace_phase_bytes"] == flush + 2 * (X + W) + Y + Xp + Y
    with_check = memory.memory_estimate(layer, "cpu", flush, check_planes=2)
    assert with_check["dace_phase_bytes"] - est["dace_phase_bytes"] == memory.check_bytes(layer, 2)
    assert memory.check_bytes(layer, 2) < 2 ** 30
    # The SDFG's transients replace the allowance only where they are larger.
    assert memory.memory_estimate(layer, "cpu", flush, dace_transients=Xp)["dace_phase_bytes"] \
        == est["dace_phase_bytes"]
    big = memory.memory_estimate(layer, "cpu", flush, dace_transients=30 * 2 ** 30)
    assert big["dace_phase_bytes"] == flush + 2 * (X + W) + Y + 30 * 2 ** 30
    assert memory.memory_estimate(layer, "cpu", flush, skip_torch=True)["torch_phase_bytes"] == 0
    # On the GPU the check runs on the host: not counted.
    gpu = memory.memory_estimate(layer, "gpu", 256 << 20, check_planes=2)
    assert gpu["dace_phase_bytes"] == (256 << 20) + 2 * (X + W) + Y + Xp + Y


def test_refuses_after_building_when_the_sdfg_transients_do_not_fit(tmp_path, stress_cache, main):
    """im2colGemm's column buffer (C*27 x D*H*W floats) is far above the generic
    allowance: the estimate redone from its SDFG must refuse it."""
    result = main(*SMALL, "--implementation", "im2colGemm", "--no-flush", "--skip-torch",
                 "--memory-limit", "0.004", "--cachedir", stress_cache,
                 "--out", tmp_path / "never.json")
    assert_usage_error(result, "layer needs ~", "transients its SDFG declares")
    assert "built" in result.stdout or "loaded" in result.stdout
    assert "running" not in result.stdout and not (tmp_path / "never.json").exists()


# -- bad flags -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--size", "0"], ["--size: must be an integer >= 1, got 0"]),
    (["--iters", "0"], ["--iters: must be an integer >= 1"]),
    (["--warmup", "-1"], ["--warmup: must be an integer >= 0"]),
    (["--threads", "0"], ["--threads: must be an integer >= 1"]),
    (["--in-channels", "-3"], ["--in-channels"]),
    (["--size", "abc"], ["--size", "invalid int value"]),
    (["--memory-limit", "0"], ["--memory-limit: must be a positive number"]),
    (["--memory-limit", "nan"], ["--memory-limit"]),
    (["--bogus"], ["unrecognized arguments: --bogus"]),
    (["--size", "2", "--pad", "3"], ["--size 2", "input edge would be -2"]),
    (["--implementation", "nosuch"], ["unknown implementation 'nosuch'"]),
    (["--implementation", "implicitGemmBwdData"],
     ["implicitGemmBwdData computes bwd_data", "forward implementations only"]),
    (["--implementation", "implicitGemmBwdFilter"], ["computes bwd_filter"]),
    (["--param", "nosuch=1"], ["--param: implicitGemm has no parameter 'nosuch'"]),
    (["--implementation", "implicitGemmNCDHW", "--param", "CTAtileM=abc"],
     ["--param: CTAtileM must be an integer"]),
    (["--param", "noequals"], ["--param: expected NAME=VALUE"]),
    (["--device", "tpu"], ["--device: unknown device 'tpu'"]),
])
def test_bad_flags(tmp_path, args, words, main):
    result = main(*args, "--cachedir", tmp_path / "cache", "--out", tmp_path / "never.json")
    assert_usage_error(result, *words)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "never.json").exists()


def test_unwritable_out_is_refused_before_building(tmp_path, main):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = main(*SMALL, "--cachedir", tmp_path / "cache", "--out", blocker / "sub" / "x.json")
    assert_usage_error(result, "--out: cannot create")
    assert not (tmp_path / "cache").exists()
    assert_usage_error(main(*SMALL, "--cachedir", tmp_path / "cache", "--out", tmp_path),
                       "is a folder")


def test_gpu_without_a_gpu_is_a_usage_error(tmp_path, main):
    from convbench.timing import devices
    if devices.gpu_usable():
        pytest.skip("a GPU is usable here")
    assert_usage_error(main("--device", "gpu", "--cachedir", tmp_path / "cache", "--out",
                           tmp_path / "never.json"), "--device gpu")


# -- the sub-volume check, in-process --------------------------------------------------------

LAYERS = [
    stress.make_layer(12, 3, 5, 1, 3, 1, 1),
    # batch 2, non-cubic, stride 2, padding 1: slabs reach into the depth padding.
    Layer("odd", 2, 3, 4, 11, 7, 9, 3, 3, 3, stride=2, pad=1),
    # no padding, kernel 5, anisotropic padding.
    Layer("k5", 1, 2, 3, 14, 8, 8, 5, 5, 5, stride=1, pad=0),
    Layer("aniso", 1, 2, 3, 10, 6, 8, 3, 3, 3, stride=1, pad=1, pad_d=2, pad_w=0),
]


def _inputs(layer, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.empty(layer.input_shape).uniform_(-1, 1, generator=gen)
    w = torch.empty(layer.filter_shape).uniform_(-1, 1, generator=gen)
    y = F.conv3d(x, w, stride=layer.stride, padding=layer.pads)  # float32, correct
    return x, w, y


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_check_subvolume_passes_a_correct_output(layer):
    x, w, y = _inputs(layer)
    results = stress.check_subvolume(layer, x, w, y, planes=2)
    assert [r for r, _ in results] == memory.check_regions(layer.out_d, 2)
    assert all(c.ok and c.nonfinite == 0 for _, c in results), [c.summary() for _, c in results]
    # The regions cover exactly their planes, over everything else.
    assert sum(c.numel for _, c in results) == sum(
        (o1 - o0) * layer.batch * layer.out_channels * layer.out_h * layer.out_w
        for o0, o1 in memory.check_regions(layer.out_d, 2))


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
@pytest.mark.parametrize("where", ["far corner", "first plane", "far plane middle"])
def test_check_subvolume_catches_one_wrong_element(layer, where):
    x, w, y = _inputs(layer)
    index = {"far corner": (-1, -1, -1, -1, -1),
             "first plane": (0, 0, 0, layer.out_h // 2, layer.out_w // 2),
             "far plane middle": (layer.batch - 1, layer.out_channels // 2, layer.out_d - 2,
                                  layer.out_h // 2, 0)}[where]
    # 0.05, about a fifth of one product |x*w|, is far above the tolerance
    # (8 * sqrt(L) * 2^-24 * sum|x*w| is about 1e-4 here).
    y[index] += 0.05
    results = stress.check_subvolume(layer, x, w, y, planes=2)
    assert not all(c.ok for _, c in results)
    assert sum(not c.ok for _, c in results) == 1


def test_check_subvolume_catches_an_unwritten_element_and_ignores_the_middle():
    layer = stress.make_layer(16, 2, 3, 1, 3, 1, 1)
    x, w, y = _inputs(layer)
    poisoned = y.clone()
    poisoned[0, 1, 15, 15, 15] = math.nan
    (_, first), (_, last) = stress.check_subvolume(layer, x, w, poisoned, planes=2)
    assert first.ok and not last.ok and last.nonfinite == 1
    # Planes 2..13 are outside the sub-volume: the check does not look there (documented).
    middle = y.clone()
    middle[0, 0, 8] += 1.0
    assert all(c.ok for _, c in stress.check_subvolume(layer, x, w, middle, planes=2))
    with pytest.raises(ValueError):
        stress.check_subvolume(layer, x, w, y[:, :, :-1], planes=2)


def test_check_subvolume_on_a_stored_layout_view():
    """The script hands the check ``from_layout`` of the NDHWC output: a permuted view."""
    from convkernels.layouts import Layout, from_layout, to_layout
    layer = LAYERS[1]
    x, w, y = _inputs(layer)
    stored = to_layout(y, Layout.NDHWC, "y")
    stored[-1, -1, -1, -1, -1] -= 0.05
    view = from_layout(stored, Layout.NDHWC, "y")
    assert not view.is_contiguous()
    results = stress.check_subvolume(layer, x, w, view, planes=1)
    assert [c.ok for _, c in results] == [True, False]


def test_check_regions():
    assert memory.check_regions(256, 2) == [(0, 2), (254, 256)]
    assert memory.check_regions(4, 2) == [(0, 4)]
    assert memory.check_regions(1, 3) == [(0, 1)]
