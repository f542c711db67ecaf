"""--compareprof: timing statistics, result files, metadata, plots, interruption, flags."""

import csv
import json
import math
import time

import pytest

from cases import Case
from convbench.timing import ceilings, timers as timing
from convbench.commands import profile_conv3d as cli
from convbench.layersets.layer import Layer
from convbench.results.writer import SAMPLE_COLUMNS

IMPL = "implicitGemm"
#: A build of the session's (tests/conftest.py), for the tests that only run one.
PREPARED = Case(IMPL, Layer("tiny", 1, 3, 4, 6, 5, 7, 3, 3, 3, 1, 1), "odd")
CSV = ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
       "tiny,1,3,4,6,5,7,3,3,3,1,1\ntiny2,2,2,3,5,5,5,3,3,3,2,0\n")


# -- statistics and timers ------------------------------------------------------------------

def test_summarize_quartiles_and_noise():
    s = timing.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["median_ms"], s["q1_ms"], s["q3_ms"], s["iqr_ms"]) == (3.0, 2.0, 4.0, 2.0)
    assert s["min_ms"] == 1.0 and s["mean_ms"] == 3.0 and s["samples"] == 5
    assert s["noisy"]  # IQR is 67% of the median
    quiet = timing.summarize([10.0, 10.1, 10.2, 10.3, 10.4])
    assert not quiet["noisy"] and quiet["iqr_over_median"] == pytest.approx(0.2 / 10.2)
    # IQR/median of 0.4 flags, 0.05 does not
    assert timing.summarize([0.95, 1.0, 1.05])["noisy"] is False
    assert timing.summarize([0.6, 1.0, 1.4])["noisy"] is True


def test_summarize_interpolates_quartiles_linearly():
    # positions (n - 1) * q between sorted values, as numpy's default (linear) quantile
    s = timing.summarize([3.2, 1.5, 9.9, 4.4, 2.0, 7.7, 6.1])  # 1.5 2.0 3.2 4.4 6.1 7.7 9.9
    assert s["q1_ms"] == pytest.approx(2.6) and s["median_ms"] == 4.4
    assert s["q3_ms"] == pytest.approx(6.9) and s["iqr_ms"] == pytest.approx(4.3)
    s = timing.summarize([40.0, 10.0, 30.0, 20.0])
    assert (s["q1_ms"], s["median_ms"], s["q3_ms"]) == (17.5, 25.0, 32.5)
    assert all(type(s[k]) is float for k in ("q1_ms", "median_ms", "q3_ms", "iqr_ms"))
    one = timing.summarize([7.0])
    assert (one["q1_ms"], one["median_ms"], one["q3_ms"], one["iqr_ms"]) == (7.0, 7.0, 7.0, 0.0)
    empty = timing.summarize([])
    assert empty["samples"] == 0 and all(math.isnan(empty[k]) for k in
                                         ("q1_ms", "median_ms", "q3_ms", "min_ms", "mean_ms"))


def test_cpu_timer_measures_the_call_only():
    calls = []
    timer = timing.CpuTimer(flush=False)

    def fn():
        calls.append(1)
        time.sleep(0.004)
    t = timer.measure(fn, warmup=2, iterations=5)
    assert len(calls) == 7 and t.warmup == 2 and len(t.samples_ms) == 5
    assert all(3.9 <= s < 100 for s in t.samples_ms), t.samples_ms
    assert not t.limited


def test_time_limit_keeps_a_minimum_of_samples():
    timer = timing.CpuTimer(flush=False)
    t = timer.measure(lambda: time.sleep(0.02), warmup=10, iterations=100, time_limit=0.05)
    assert t.limited and len(t.samples_ms) == timing.MIN_SAMPLES
    assert t.warmup == 1  # warm-up stops after a fifth of the limit


@pytest.mark.parametrize("sizes, expected", [
    ({"index0": "48K", "index1": "32K", "index2": "1024K", "index3": "32768K"}, 128 << 20),
    ({"index0": "32K", "index3": "256M"}, 1 << 30),                    # the largest level wins
    ({"index0": "48K", "index2": "2048K"}, timing.MIN_CPU_FLUSH_BYTES),  # no L3: the floor
    ({"index2": "garbage", "index3": "48M"}, 192 << 20),               # unreadable sizes skipped
    ({}, timing.MIN_CPU_FLUSH_BYTES),
])
def test_flush_size_follows_the_last_level_cache(tmp_path, sizes, expected):
    for index, size in sizes.items():
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert timing.cpu_flush_bytes(str(tmp_path)) == expected
    assert timing.cpu_flush_bytes(str(tmp_path / "missing")) == timing.MIN_CPU_FLUSH_BYTES


def test_flush_writes_the_whole_buffer():
    timer = timing.CpuTimer(flush=True)
    assert timer.flush_bytes == timing.cpu_flush_bytes()
    assert timer._buffer.numel() * timer._buffer.element_size() == timer.flush_bytes
    timer._buffer.zero_()
    timer.flush()
    assert bool((timer._buffer == 1.0).all())  # every element, not only the last
    assert timing.CpuTimer(flush=False).flush_bytes == 0


# -- the CLI --------------------------------------------------------------------------------

@pytest.fixture
def layer_csv(tmp_path):
    path = tmp_path / "layers.csv"
    path.write_text(CSV)
    return path


#: The layers of CSV, as the session's builds (for the runs that need not compile).
PROFILED = [Case(IMPL, Layer("tiny", 1, 3, 4, 6, 5, 7, 3, 3, 3, 1, 1), "odd"),
            Case(IMPL, Layer("tiny2", 2, 2, 3, 5, 5, 5, 3, 3, 3, 2, 0), "odd")]


def profile(tmp_path, layer_csv, *extra, cachedir=None):
    """--compareprof on CSV; compiled into a cache of the test's own, or loaded from
    ``cachedir`` (the session's builds)."""
    outdir = tmp_path / "run"
    cache = ["--cachedir", str(cachedir), "--loadprecompiled"] if cachedir else [
        "--cachedir", str(tmp_path / "cache")]
    args = ["--implementation", IMPL, "--device", "cpu", "--paramscsv", str(layer_csv),
            *cache, "--compareprof", "--warmupiter", "2", "--totaliter", "6",
            "--outdir", str(outdir), *extra]
    return cli.main(args), outdir


@pytest.fixture
def stand_in_ceilings(monkeypatch):
    """The ceilings (a large SGEMM, a copy and an FMA probe: about 7 s a run) as a
    stand-in, for the runs that check none of them (test_compareprof_writes_results_and_plots
    measures them)."""
    monkeypatch.setattr(ceilings, "measure", lambda device: {
        "peak_gflops": 100.0, "peak_method": "stand-in", "bandwidth_gbs": 10.0,
        "bandwidth_method": "stand-in"})


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.prebuild(*PROFILED)
def test_compareprof_writes_results_and_plots(tmp_path, layer_csv, capsys, cachedir, builds):
    rc, outdir = profile(tmp_path, layer_csv, "--enableplots", "--verify", cachedir=cachedir)
    out = capsys.readouterr().out
    assert rc == 0, out
    samples = read_csv(outdir / "samples.csv")
    assert list(samples[0]) == SAMPLE_COLUMNS
    assert len(samples) == 2 * 2 * 6  # layers x backends x iterations
    assert {(r["layer"], r["backend"]) for r in samples} == {
        (lay, b) for lay in ("tiny", "tiny2") for b in ("dace", "torch")}
    assert all(float(r["time_ms"]) > 0 for r in samples)
    summary = read_csv(outdir / "summary.csv")
    assert len(summary) == 4
    for row in summary:
        dace_med = next(float(r["median_ms"]) for r in summary
                        if r["layer"] == row["layer"] and r["backend"] == "dace")
        torch_med = next(float(r["median_ms"]) for r in summary
                         if r["layer"] == row["layer"] and r["backend"] == "torch")
        med = float(row["median_ms"])
        assert float(row["ratio_vs_torch"]) == pytest.approx(med / torch_med, rel=1e-4)
        assert float(row["gflops"]) == pytest.approx(float(row["gflop"]) / med * 1e3, rel=1e-4)
        assert float(row["q1_ms"]) <= med <= float(row["q3_ms"])
        assert row["implementation"] == IMPL and row["noisy"] in ("True", "False")
        assert dace_med > 0
    meta = json.loads((outdir / "metadata.json").read_text())
    assert meta["status"] == "complete"
    assert [x["layer"] for x in meta["layers_done"]] == ["tiny", "tiny2"]
    assert all(x["verified"] is True and x["build"] == "loaded" for x in meta["layers_done"])
    for key in ("git", "versions", "device", "threads", "dace_config", "params", "timestamp",
                "ceilings", "timing", "references"):
        assert key in meta, key
    assert set(meta["versions"]) >= {"dace", "torch", "numpy", "cudnn"}
    assert meta["device"]["kind"] == "cpu" and meta["device"]["cpu"]
    assert meta["ceilings"]["peak_gflops"] > 0 and meta["ceilings"]["bandwidth_gbs"] > 0
    assert meta["timing"]["warmup"] == 2 and meta["timing"]["iterations"] == 6
    assert "compiler.cpu.args" in meta["dace_config"]["flags"]["config"]
    for name in ("violin.png", "medians.png", "roofline.png"):
        data = (outdir / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    assert "x torch" in out  # the ratio is printed per layer


@pytest.mark.prebuild(*PROFILED)
def test_interrupted_run_keeps_finished_layers(tmp_path, layer_csv, monkeypatch, capsys,
                                               cachedir, builds, stand_in_ceilings):
    from convbench.experiment.pipeline import Experiment
    original = Experiment.run_case

    def layer_then_interrupt(self, impl, layer, i=0, **kwargs):
        if i == 1:
            raise KeyboardInterrupt
        return original(self, impl, layer, i, **kwargs)
    monkeypatch.setattr(Experiment, "run_case", layer_then_interrupt)
    rc, outdir = profile(tmp_path, layer_csv, cachedir=cachedir)
    assert rc == 130
    meta = json.loads((outdir / "metadata.json").read_text())
    assert meta["status"] == "interrupted"
    assert {r["layer"] for r in read_csv(outdir / "summary.csv")} == {"tiny"}
    assert {r["layer"] for r in read_csv(outdir / "samples.csv")} == {"tiny"}
    assert not list(outdir.glob(".*.tmp"))  # atomic writes leave no temporaries


@pytest.mark.prebuild(*PROFILED)
def test_threads_flag_sets_torch_threads(tmp_path, layer_csv, monkeypatch, cachedir, builds,
                                        stand_in_ceilings):
    import torch
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", str(before))
    try:
        rc, outdir = profile(tmp_path, layer_csv, "--threads", "1", "--totaliter", "2",
                             "--currlayer", "1", cachedir=cachedir)
        assert rc == 0
        meta = json.loads((outdir / "metadata.json").read_text())
        assert meta["threads"]["requested"] == 1 and meta["threads"]["torch"] == 1
        assert meta["reference_settings"]["torch"]["threads"] == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("args, words", [
    (["--compareprof", "--totaliter", "0"], "--totaliter: must be an integer >= 1"),
    (["--compareprof", "--warmupiter", "-1"], "--warmupiter: must be an integer >= 0"),
    (["--compareprof", "--time-limit", "0"], "--time-limit: must be a positive number"),
    (["--compareprof", "--threads", "0"], "--threads: must be an integer >= 1"),
    (["--verify", "--enableplots"], "--enableplots: plots are drawn from --compareprof"),
    (["--verify", "--outdir", "x"], "--outdir: only --compareprof writes result files"),
    (["--compareprof", "--totaliter", "many"], "argument --totaliter: invalid int value"),
])
def test_bad_profiling_flags(capsys, args, words):
    assert cli.main(["--device", "cpu", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profile_conv3d.py: error: ")
    assert words in lines[0], lines[0]
    assert "Traceback" not in out + err


def _prepared(builds, seed):
    """The tiny layer's build, its ground truth, and its program arrays with a NaN output."""
    import torch

    from convbench import registry
    from convbench.check import verify
    from convkernels.layouts import stored_shape, to_layout
    impl = registry.get(IMPL)
    ref = verify.make_truth(PREPARED.layer, seed=seed)
    arrays = {r: to_layout(ref.inputs[r], impl.layout, r) for r in ("x", "w")}
    arrays["y"] = torch.full(stored_shape(impl.layout, "y", PREPARED.layer.output_shape),
                             float("nan"))
    return builds(PREPARED.spec()), ref, arrays


def _output_ok(out, ref):
    from convbench import registry
    from convbench.check import verify
    from convkernels.layouts import from_layout
    check = verify.compare(from_layout(out, registry.get(IMPL).layout, "y"), ref, 2.0 ** -24)
    assert check.ok, check.summary()


@pytest.mark.prebuild(PREPARED)
def test_prepared_call_matches_the_checked_call(builds):
    build, ref, arrays = _prepared(builds, seed=3)
    call = timing.prepared_call(build, arrays)
    arrays["y"].fill_(float("nan"))
    call()  # the fast path writes into the same buffers
    _output_ok(arrays["y"], ref)


@pytest.mark.prebuild(PREPARED)
def test_fresh_output_call_allocates_like_torch(builds):
    """With ``fresh``, each call writes a new tensor (as torch's convolution returns one)
    and leaves the prepared buffer alone; the result is right."""
    import torch
    build, ref, arrays = _prepared(builds, seed=4)
    call = timing.prepared_call(build, arrays, fresh="y")
    assert call.fresh_output
    arrays["y"].fill_(float("nan"))
    first, second = call(), call()
    assert first.data_ptr() != arrays["y"].data_ptr() and second.data_ptr() != first.data_ptr()
    assert first.stride() == arrays["y"].stride()
    assert torch.isnan(arrays["y"]).all(), "a fresh-output call wrote the prepared buffer"
    for out in (first, second):
        _output_ok(out, ref)


def test_warm_heap_policy():
    """The warm heap is glibc's mmap off and no trimming; its settings say so, and an
    unknown policy is refused."""
    from convbench.timing import heap
    import ctypes

    settings = heap.apply(heap.WARM)
    if not settings["allocator"].startswith("glibc"):
        pytest.skip(f"not glibc: {settings['allocator']}")
    assert settings["policy"] == heap.WARM and "warm heap" in heap.describe()
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc before 2.33 has no mallinfo2")

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def fresh_block_is_mapped_anew():
        """glibc counts the bytes of blocks it mapped on their own in ``hblkhd``: a block
        above the mmap threshold adds to it under glibc's default and not under the warm
        heap.  glibc asks for new memory only when no free chunk fits, and earlier tests
        leave free chunks of any size, so the block is larger than all free bytes
        together (``fordblks``, the heap's top included); it is never touched, so it
        costs address space, not memory."""
        info = libc.mallinfo2()
        size = max(64 << 20, info.fordblks + (64 << 20))
        block = libc.malloc(size)
        assert block, f"malloc of {size >> 20} MiB failed"
        anew = libc.mallinfo2().hblkhd - info.hblkhd >= size
        libc.free(block)
        return anew

    with heap.timed():
        heap.reserve(1 << 20)
        assert heap._state["reserved_bytes"] >= 1 << 20
        assert not fresh_block_is_mapped_anew(), "the warm section still maps large blocks"
        # A free chunk of 128 MiB inside the heap, held there by a block above it: the
        # kind of hole that made a fixed 64 MiB probe read "not mapped" on a CI run.
        hole, pins = libc.malloc(128 << 20), []
        while not pins or pins[-1] < hole:  # lower free chunks take the first pins
            pins.append(libc.malloc(1 << 20))
        libc.free(hole)
    try:
        info = libc.mallinfo2()
        assert info.fordblks - info.keepcost >= 128 << 20, "the planted hole was trimmed"
        assert fresh_block_is_mapped_anew(), "the C library's policy did not come back"
    finally:
        for pin in pins:
            libc.free(pin)
    with pytest.raises(ValueError):
        heap.apply("hot")


def test_progress_bar_text_and_log_lines():
    import io

    from convbench.base.progress import Progress
    live = io.StringIO()
    with Progress(4, label="build", stream=live, enabled=True) as bar:
        bar.update(note="a")
        assert "build [######..................] 1/4" in bar.text()
        bar.update(3)
    assert "\r" in live.getvalue() and "\n" not in live.getvalue()  # redrawn in place
    assert "build [" in live.getvalue() and not _terminal_line(live.getvalue()).strip()  # erased
    log = io.StringIO()
    with Progress(2, stream=log, lines=True) as bar:  # not a terminal: one line per note
        bar.update(note="first done")
        bar.update()
    assert log.getvalue() == "[1/2] first done\n"
    quiet = io.StringIO()
    with Progress(2, stream=quiet, heartbeat=0.0) as bar:
        bar.update()
    assert quiet.getvalue().startswith("[############............] 1/2")
    assert "\r" not in quiet.getvalue() and quiet.getvalue().endswith("\n")


def _terminal_line(written):
    """What a terminal line shows once ``written`` (no newlines) is printed on it."""
    line = ""
    for part in written.split("\r"):  # back to the start of the line, then overwrite
        if part.startswith("\033[K"):  # erase the line
            line, part = "", part[len("\033[K"):]
        line = part + line[len(part):]
    return line


@pytest.mark.prebuild(*PROFILED)
def test_one_case_runner_records_what_fails_and_times_what_holds(cachedir):
    """``Experiment.run_case``: a reference that cannot be timed is recorded and the others
    are timed; with ``time_wrong`` False a build whose check fails (here: a tampered
    output) is not timed; ``layouts`` times the references in each memory format."""
    from convbench import registry
    from convbench.experiment.pipeline import Experiment, TimingOptions
    from convkernels.layouts import Layout

    class Broken:
        name = "broken"

        def prepare(self, *args, **kwargs):
            raise RuntimeError("no such library")
    case = PROFILED[0]
    impl = registry.get(case.impl)
    exp = Experiment(impl, [case.layer], "cpu", policy="reuse", cachedir=cachedir,
                     timing=TimingOptions(1, 3, flush=False))
    exp._refs = list(exp.reference_backends) + [Broken()]
    ok = exp.run_case(impl, case.layer)
    assert ok.status == "passed" and ok.build_name and ok.build_origin in ("built", "loaded")
    assert [m.backend for m in ok.measurements] == ["dace", "torch"]
    # the medians of docs/architecture.md's library example
    assert ok.median_ms() > 0 and ok.median_ms("torch") > 0 and ok.median_ms("broken") is None
    assert ok.errors == {"broken": "RuntimeError: no such library"}
    wrong = exp.run_case(impl, case.layer, tamper=lambda out: out * 2, time_wrong=False)
    assert wrong.status == "failed" and not wrong.checks[0].ok and wrong.measurements == []
    other = Layout.NCDHW if Layout(impl.layout) == Layout.NDHWC else Layout.NDHWC
    both = exp.run_case(impl, case.layer, layouts=[impl.layout, other])
    assert [m.backend for m in both.measurements] == [
        "dace", "torch", f"torch-{str(other).lower()}"]
    refs_off = exp.run_case(impl, case.layer, references=False)
    assert [m.backend for m in refs_off.measurements] == ["dace"] and not refs_off.errors
