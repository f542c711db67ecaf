"""The GPU campaign kit (``scripts/gpu_campaign.py``, ``convbench.campaign``): its plan,
its CPU rehearsal with three planted failures, resume, pack, unpack and the ncu parser."""

import contextlib
import json
import subprocess
import tarfile
import types

import pytest

from conftest import assert_usage_error as _assert_usage_error
from conftest import in_process, load_script
from convbench import registry
from convbench import campaign
from convbench.campaign import cli, ncu
from convbench.campaign import worker

script = load_script("gpu_campaign.py")


@pytest.fixture
def main(capsys):
    return in_process(script, capsys)


def assert_usage_error(result, *words):
    return _assert_usage_error(result, *words, prefix="gpu_campaign.py: error: ")


# -- the plan -------------------------------------------------------------------------------------

def test_core_plan_covers_every_gpu_implementation_and_all_cosmoflow_layers():
    cases = campaign.plan_cases("core", "gpu", planted=False)
    gpu_impls = {n for n, i in registry.all_implementations().items() if "gpu" in i.targets}
    every = {(c.impl, c.layer_set, c.layer.name) for c in cases if c.group == "every-impl"}
    for layer_set, name, _ in campaign.REPRESENTATIVE:
        assert {i for i, s, n in every if (s, n) == (layer_set, name)} == gpu_impls
    for layer_set, batch in campaign.ORIGINAL_BATCH.items():
        layers = campaign.load_layers(layer_set)
        for impl in registry.members("best-of"):
            got = {c.layer.name for c in cases if c.impl == impl and c.layer_set == layer_set
                   and c.layer.batch == batch}
            assert got == {layer.name for layer in layers}, (impl, layer_set)
    assert len({c.id for c in cases}) == len(cases)
    # The references are timed once per layer, pass and precision.
    timed = [c.refs_key for c in cases if c.time_refs]
    assert len(timed) == len(set(timed)) == len({c.refs_key for c in cases})
    assert not [c for c in cases if c.group == "precision"]


def test_precision_plan_times_the_tensor_core_kernels_in_each_precision(main):
    """The precision tier: the Hopper tensor-core kernels in float16 and TF32 on every
    CosmoFlow layer and in bfloat16 on the training step's (the filter gradient in
    float16 and TF32 on the training step's), with their candidate tiles and stages on
    two MLPerf layers; no mma.sync kernel; each layer's references timed once per
    precision; it fits its budget."""
    cases = campaign.plan_cases("precision", "gpu", planted=False)
    only = campaign.plan.PRECISION_ONLY
    for impl in ("implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter",
                 "implicitGemmWGMMA", "implicitGemmWGMMABwdData",
                 "implicitGemmWGMMABwdFilter"):
        ran = {(c.precision, c.layer_set, c.layer.name) for c in cases
               if c.impl == impl and not c.params}
        assert ran == {(p, s, layer.name) for p in registry.get(impl).precisions
                       for s in campaign.ORIGINAL_BATCH for layer in campaign.load_layers(s)
                       if impl not in only or (s, p) in only[impl]}, impl
    assert {c.precision for c in cases if c.impl == "implicitGemmWGMMABwdFilter"} == {
        "float16", "float32-tf32"}
    assert not [c for c in cases if c.impl.startswith("implicitGemmMMA")]
    for impl, candidates in campaign.plan.PRECISION_CANDIDATES.items():
        tried = {(c.layer.name, c.params) for c in cases if c.impl == impl and c.params}
        assert tried == {(n, tuple(sorted(p.items()))) for p in candidates
                         for n in campaign.plan.PRECISION_CANDIDATE_LAYERS}, impl
        for c in cases:
            if c.impl == impl and c.params:
                assert registry.get(impl).check_params(dict(c.resolved_params())) is None
    assert {c.group for c in cases} == {"precision"}
    timed = [c.refs_key for c in cases if c.time_refs]
    assert len(timed) == len(set(timed)) == len({c.refs_key for c in cases})
    result = main("--dry-run", "--tier", "precision")
    assert result.returncode == 0 and "fits" in result.stdout, result.stdout
    assert not [c for c in cases if c.planted]


def test_planted_cases_only_when_asked():
    kinds = sorted(c.planted for c in campaign.plan_cases("smoke", "cpu", planted=True)
                   if c.planted)
    assert kinds == sorted(campaign.PLANTED)
    assert not [c for c in campaign.plan_cases("smoke", "cpu", planted=False) if c.planted]


def test_dry_run_core_fits_the_device_budget(main):
    result = main("--dry-run", "--tier", "core")
    assert result.returncode == 0, result.stderr
    assert "budget 15 min: fits" in result.stdout, result.stdout
    cases = campaign.plan_cases("core", "gpu", planted=False)
    est = campaign.estimate(cases, "gpu", 16, 50, 5, 2.0, skip=campaign.plan.TIER_SKIPS["core"])
    assert est.total_s <= campaign.BUDGET_S["core"]
    assert all(sum(est.phases[p] for p in call) <= campaign.CALL_LIMIT_S for call in est.calls)
    assert "scripts/gpu_campaign.py run --tier core" in result.stdout
    assert "--archive $OUT/campaign.tar.gz" in result.stdout


def test_estimate_grows_with_build_time(tmp_path):
    """The build phase follows the measured build time found in a cache's manifests."""
    for i, seconds in enumerate((100.0, 120.0, 110.0)):
        entry = tmp_path / f"e{i}"
        entry.mkdir()
        (entry / "manifest.json").write_text(json.dumps(
            {"key": {"target": "gpu"}, "build_seconds": {"compile": seconds}}))
    assert campaign.measured_build_seconds("gpu", tmp_path)[0] == 110.0
    cases = campaign.plan_cases("smoke", "gpu", planted=False)
    slow = campaign.estimate(cases, "gpu", 16, 50, 5, 2.0, cachedir=tmp_path)
    fast = campaign.estimate(cases, "gpu", 16, 50, 5, 2.0)
    waves = slow.phases["builds"] / 110.0  # the median build time per wave of builds
    assert waves == int(waves) >= 1 and slow.phases["builds"] > fast.phases["builds"]


# -- bad input ----------------------------------------------------------------------------------

def test_bad_input_is_one_line(main, tmp_path):
    assert_usage_error(main("run", "--tier", "huge"), "--tier")
    assert_usage_error(main("run", "--target", "tpu", "--out", tmp_path / "x"), "--target")
    assert_usage_error(main("run", "--skip", "lunch", "--target", "cpu"), "--skip", "lunch")
    assert_usage_error(main("run", "--time-limit", "0", "--target", "cpu"), "--time-limit")
    assert_usage_error(main(), "pack, run or unpack")
    assert_usage_error(main("unpack", tmp_path / "none.tar.gz"), "no file")


def test_gpu_target_without_a_gpu_is_a_usage_error(main, tmp_path):
    from convbench.timing import devices
    if devices.gpu_usable():
        pytest.skip("a GPU is usable here")
    assert_usage_error(main("run", "--tier", "smoke", "--out", tmp_path / "g"),
                       "--target gpu", "--target cpu")


# -- the CPU rehearsal --------------------------------------------------------------------------

#: The implementations the CPU rehearsal runs: one of each pass, and the one the plants
#: are made from (its own build verifies beside its three planted failures).  The
#: rehearsal checks the campaign's harness; every implementation is verified on the
#: fast tier's layers by tests/test_impls_cpu.py, and the smoke tier's plan of every
#: implementation is checked by the plan tests above.
REHEARSED = ("implicitGemm", "implicitGemmPipelinedBwdData", "implicitGemmBwdFilter",
             campaign.plan.PLANTED_IMPL)


@contextlib.contextmanager
def rehearsed_only():
    """The registry as the campaign's plan sees it cut to :data:`REHEARSED`, and the planted
    hang's limit at 2 s (the hang sleeps at once; the worker's start is not counted)."""
    every = registry.all_implementations
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "all_implementations",
                   lambda: {n: i for n, i in every().items() if n in REHEARSED})
        mp.setattr(worker, "PLANTED_HANG_TIMEOUT_S", 2.0)
        yield


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, cachedir):
    """``run --target cpu --tier smoke`` once for the module, on :data:`REHEARSED`."""
    out = tmp_path_factory.mktemp("campaign") / "rehearsal"
    archive = out.parent / "campaign.tar.gz"
    with rehearsed_only():
        planned = campaign.plan_cases("smoke", "cpu", planted=True)
        status = script.main(["run", "--target", "cpu", "--tier", "smoke", "--out", str(out),
                              "--cachedir", str(cachedir), "--iterations", "3", "--warmup",
                              "1", "--time-limit", "0.5", "--archive", str(archive),
                              "--threads", "1"])
    return types.SimpleNamespace(status=status, out=out, archive=archive, planned=planned)


def _records(out):
    return {json.loads(p.read_text())["id"]: json.loads(p.read_text())
            for p in (out / "cases").glob("*.json")}


def test_rehearsal_records_every_case_and_the_three_planted_failures(rehearsal):
    assert rehearsal.status == 0
    records = _records(rehearsal.out)
    planned = rehearsal.planned
    assert {c.impl for c in planned if not c.planted} == set(REHEARSED)
    assert set(records) == {c.id for c in planned}
    by_kind = {r["case"]["planted"]: r for r in records.values() if r["case"]["planted"]}
    crash, hang, wrong = by_kind["crash"], by_kind["hang"], by_kind["wrong"]
    assert crash["status"] == "crash" and "signal 11" in crash["detail"], crash
    assert "planted crash" in crash["log_tail"]
    assert hang["status"] == "timeout" and "2 s limit" in hang["detail"], hang
    assert wrong["status"] == "wrong", wrong
    assert [c["ok"] for c in wrong["checks"]] == [False]
    assert "timings" not in wrong  # a wrong result is not timed
    for rid, rec in records.items():
        if rec["case"]["planted"]:
            continue
        assert rec["status"] == "verified", (rid, rec.get("detail"))
        assert set(rec["timings"]) >= {"dace"}
        assert rec["timings"]["dace"]["samples"] == len(rec["timings"]["dace"]["samples_ms"]) >= 1
        assert (rehearsal.out / rec["log"]).is_file()
    # torch was timed once per pass on the layer, next to the first implementation of it.
    with_refs = [r for r in records.values() if "torch" in r.get("timings", {})]
    assert sorted(r["case"]["impl"] for r in with_refs) == sorted(
        c.impl for c in planned if c.time_refs)


def test_rehearsal_writes_the_layout_and_the_table(rehearsal):
    out = rehearsal.out
    for name in ("campaign.json", "state.json", "identity/versions.json", "ceilings.json",
                 "builds.json", "summary.csv", "README.md"):
        assert (out / name).is_file(), name
    state = json.loads((out / "state.json").read_text())["phases"]
    assert state["identity"]["status"] == state["cases"]["status"] == "done"
    assert state["tests"]["status"] == state["roofline"]["status"] == "skipped"
    ceilings = json.loads((out / "ceilings.json").read_text())
    assert ceilings["peak_gflops"] > 0 and ceilings["tf32_gflops"] is None
    assert ceilings["tensor_method"].startswith("not measured")
    readme = (out / "README.md").read_text()
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        assert f"| {pass_} |" in readme, pass_
    assert "1 crash" in readme and "1 timeout" in readme and "1 wrong" in readme
    assert "not measured" in readme  # the tensor-core ceilings
    with tarfile.open(rehearsal.archive) as tar:
        names = tar.getnames()
    assert f"{out.name}/README.md" in names and f"{out.name}/cases" in names


def test_resume_skips_what_is_recorded(rehearsal, main):
    before = {p.name: p.stat().st_mtime_ns for p in (rehearsal.out / "cases").iterdir()}
    with rehearsed_only():
        result = main("run", "--target", "cpu", "--tier", "smoke", "--out", rehearsal.out,
                      "--resume", "--cachedir", rehearsal.out.parent / "unused-cache")
    assert result.returncode == 0, result.stderr
    assert "[cases] recorded already" in result.stdout and "[ceilings] recorded already" in result.stdout
    after = {p.name: p.stat().st_mtime_ns for p in (rehearsal.out / "cases").iterdir()}
    assert after == before
    # Without --resume the folder is refused; with another tier too.
    assert_usage_error(main("run", "--target", "cpu", "--out", rehearsal.out), "--resume")
    assert_usage_error(main("run", "--target", "cpu", "--tier", "core", "--resume", "--out",
                            rehearsal.out), "smoke")


def test_unpack_and_index(rehearsal, main, tmp_path):
    into = tmp_path / "gpu"
    result = main("unpack", rehearsal.archive, "--into", into)
    assert result.returncode == 0, result.stderr
    assert (into / rehearsal.out.name / "README.md").is_file()
    index = (into / "README.md").read_text()
    assert f"[{rehearsal.out.name}]" in index and "| smoke | cpu |" in index
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(rehearsal.out / "README.md", arcname="../escape.md")
    assert_usage_error(main("unpack", evil, "--into", into), "not one campaign folder")
    assert not (tmp_path / "escape.md").exists()


# -- pack ---------------------------------------------------------------------------------------

@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.carry/\n")
    (root / "code.py").write_text("x = 1\n")
    from convbench.build import toolchain
    monkeypatch.setattr(toolchain, "PROJECT_ROOT", root)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("dace-1.0.2-py3-none-any.whl", "numpy-1.26.4-cp312-x.whl",
                 "networkx-3.4.2-py3-none-any.whl"):
        (wheels / name).write_bytes(b"w" * 1000)
    return types.SimpleNamespace(root=root, wheels=wheels)


def test_pack_fills_the_carry_folder_and_prints_the_host_command(repo, main):
    result = main("pack", "--wheels", repo.wheels)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (repo.root / ".carry" / "wheels").iterdir()) == sorted(
        p.name for p in repo.wheels.iterdir())
    assert "3 wheels" in result.stdout and "of 64 MiB" in result.stdout
    command = next(line for line in result.stdout.splitlines() if "pip install" in line)
    assert "--no-index" in command and "run --tier core" in command and "--resume" in command
    assert len(command.strip()) <= 2000  # the device tool's limit on a command


def test_pack_refuses_what_would_not_travel(repo, main):
    big = repo.root / "big.bin"
    with open(big, "wb") as f:
        f.truncate(65 << 20)  # untracked, not ignored: it travels
    result = main("pack", "--wheels", repo.wheels)
    assert result.returncode == 1 and "over the 64 MiB limit" in result.stdout
    big.unlink()
    (repo.wheels / "dace-1.0.2-py3-none-any.whl").unlink()
    assert_usage_error(main("pack", "--wheels", repo.wheels), "dace")
    (repo.root / ".gitignore").write_text("")
    (repo.wheels / "dace-1.0.2-py3-none-any.whl").write_bytes(b"w")
    assert_usage_error(main("pack", "--wheels", repo.wheels), "not ignored")


# -- the ncu parser -----------------------------------------------------------------------------

def _ncu_csv(rows):
    head = ['"ID"', '"Process ID"', '"Kernel Name"'] + [f'"{m}"' for m in ncu.METRICS]
    units = ['""', '""', '""'] + ['"inst"'] * 3 + ['"byte"'] * 3 + ['"nsecond"']
    lines = ["==PROF== Connected to process 1", "program output", ",".join(head),
             ",".join(units)]
    for i, (kernel, values) in enumerate(rows):
        lines.append(",".join([f'"{i}"', '"1"', f'"{kernel}"'] + [f'"{v}"' for v in values]))
    return "\n".join(lines) + "\n==PROF== Disconnected\n"


def test_ncu_segments_and_roofline_numbers():
    marker = (ncu.MARKER, [0, 0, 0, 0, 0, 0, 1000])
    text = _ncu_csv([marker, ("dace_kernel", [10, 20, 100, 1000, 2000, 4000, 1_000_000]),
                     marker, ("cudnn_a", [0, 0, 50, 100, 200, 400, 500_000]),
                     ("cudnn_b", [5, 5, 0, 100, 200, 400, 500_000])])
    rows = ncu.parse_csv(text)
    assert [r["kernel"] for r in rows] == [ncu.MARKER, "dace_kernel", ncu.MARKER, "cudnn_a",
                                           "cudnn_b"]
    parts = ncu.segments(rows, ["l.dace", "l.cudnn"])
    dace = ncu.summarize(parts["l.dace"])
    assert dace["flops"] == 10 + 20 + 2 * 100
    assert dace["dram_intensity"] == pytest.approx(230 / 1000)
    assert dace["l1tex_intensity"] == pytest.approx(230 / 4000)
    assert dace["gflops"] == pytest.approx(230 / 1e-3 / 1e9)
    cudnn = ncu.summarize(parts["l.cudnn"])
    assert cudnn["flops"] == 100 + 10 and cudnn["dram_bytes"] == 200
    assert cudnn["kernels"] == ["cudnn_a", "cudnn_b"]
    with pytest.raises(ValueError, match="marker"):
        ncu.segments(rows, ["only one"])


def test_campaign_cli_names_every_phase_in_its_help():
    text = cli.build_parser().format_help()
    assert "--dry-run" in text and "pack|run|unpack" in text


def test_resume_runs_only_what_is_missing(rehearsal, main, tmp_path, cachedir):
    """A run cut off keeps its recorded cases: resume runs the missing ones only."""
    import shutil
    out = tmp_path / "cut"
    shutil.copytree(rehearsal.out, out)
    missing = sorted((out / "cases").glob("*.json"))[:2]
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")
            if p not in missing}
    for p in missing:
        p.unlink()
    # The phase reads done (as after a call whose plan grew); a phase an earlier call
    # measured stays done under a later call's --skip.
    state = json.loads((out / "state.json").read_text())
    assert state["phases"]["cases"]["status"] == "done"
    state["phases"]["tests"] = dict(state["phases"]["tests"], status="done", detail="measured")
    (out / "state.json").write_text(json.dumps(state))
    with rehearsed_only():
        result = main("run", "--target", "cpu", "--tier", "smoke", "--out", out, "--resume",
                      "--cachedir", cachedir, "--iterations", "2", "--warmup", "0",
                      "--skip", "tests")
    assert result.returncode == 0, result.stderr
    tests = json.loads((out / "state.json").read_text())["phases"]["tests"]
    assert (tests["status"], tests["detail"]) == ("done", "measured")
    assert f"[cases] 2 to run ({len(kept)} recorded already)" in result.stdout
    assert {p.name for p in missing} <= {p.name for p in (out / "cases").glob("*.json")}
    assert {p.name: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")
            if p.name in kept} == kept


def test_time_budget_leaves_work_for_resume(main, tmp_path, cachedir, monkeypatch):
    identity = campaign.identity

    def slow_identity(*args):  # the budget is spent before the first phase, however fast
        import time
        time.sleep(0.05)
        return identity(*args)
    monkeypatch.setattr(campaign, "identity", slow_identity)
    result = main("run", "--target", "cpu", "--tier", "smoke", "--out", tmp_path / "b",
                  "--cachedir", cachedir, "--skip", "ceilings,builds", "--time-budget", "0.01")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "time budget spent" in result.stdout and "--resume" in result.stdout
    assert not list((tmp_path / "b" / "cases").glob("*.json"))


def test_index_keeps_the_text_written_by_hand(tmp_path):
    from convbench import campaign
    sub = tmp_path / "2026-01-01_GPU"
    (sub / "cases").mkdir(parents=True)
    (sub / "campaign.json").write_text(json.dumps({"tier": "core", "target": "gpu", "device": "GPU"}))
    (sub / "cases" / "a.json").write_text("{}")
    readme = tmp_path / "README.md"
    readme.write_text(f"# old index\n\n{campaign.INDEX_KEEP_MARKER}\n\n## Analysis\nwhy it is slow\n")
    campaign.update_index(tmp_path)
    text = readme.read_text()
    assert "# old index" not in text and "[2026-01-01_GPU]" in text and "| 1 |" in text
    assert text.endswith(f"{campaign.INDEX_KEEP_MARKER}\n\n## Analysis\nwhy it is slow\n")
    readme.write_text("# no marker\n")
    campaign.update_index(tmp_path)
    assert "no marker" not in readme.read_text()


def test_a_busy_gpu_is_named_against_the_recorded_ceilings(tmp_path):
    """A campaign whose SGEMM ceiling falls well under the same device's recorded ones says
    so (an H200 read 0.46x after a hung kernel of a killed process); other devices and
    this campaign's own folder do not count."""
    import json
    from convbench.campaign.phases import against_recorded
    for name, device, peak in (("a", "H200", 51000.0), ("b", "H200", 51400.0),
                               ("c", "H100", 10.0), ("now", "H200", 1.0)):
        (tmp_path / name / "identity").mkdir(parents=True)
        (tmp_path / name / "identity" / "versions.json").write_text(json.dumps({"device": device}))
        (tmp_path / name / "ceilings.json").write_text(json.dumps({"peak_gflops": peak}))
    busy = against_recorded({"peak_gflops": 23678.0}, "H200", tmp_path, exclude=tmp_path / "now")
    assert busy["recorded_campaigns"] == 2 and busy["peak_vs_recorded"] == 0.462
    assert "likely busy" in busy["warning"]
    idle = against_recorded({"peak_gflops": 51200.0}, "H200", tmp_path, exclude=tmp_path / "now")
    assert "warning" not in idle and idle["peak_vs_recorded"] == 1.0
    assert against_recorded({"peak_gflops": 1.0}, "V100", tmp_path) == {}


def test_run_flags_before_the_command_are_kept_or_refused(main):
    """`--dry-run --tier tune run --target cpu` is a dry run of the tune tier (the
    subcommand's defaults once replaced both, and a smoke campaign ran for real); a flag
    given twice with two values, or before another command, is a usage error."""
    result = main("--dry-run", "--tier", "tune", "run", "--target", "cpu")
    assert result.returncode == 0, result.stderr
    assert "run --tier tune" in result.stdout and "[cases]" not in result.stdout
    assert_usage_error(main("--tier", "tune", "run", "--tier", "core", "--target", "cpu"),
                       "--tier given twice", "tune", "core")
    assert_usage_error(main("--dry-run", "unpack", "x.tar.gz"), "--dry-run before `unpack`")


# -- the end-to-end phase (tune tier) -----------------------------------------------------------

def test_the_tune_and_precision_tiers_run_the_training_step(tmp_path, monkeypatch):
    """tune runs it in float32 with its winners, precision in float16 (on the tensor
    cores, against torch in float16 and torch's mixed precision): the command says so."""
    from convbench.campaign import phases
    from convbench.campaign.folder import Folder
    skips = campaign.plan.TIER_SKIPS
    assert [t for t in campaign.plan.TIERS
            if "end2end" not in skips.get(t, ())] == ["tune", "precision", "steps"]
    assert campaign.plan.END2END_DTYPE == {"precision": "float16"}
    ran = []
    monkeypatch.setattr(phases, "_run_group", lambda cmd, *a, **k: ran.append(cmd) or 0)
    for dtype in (None, "float16"):
        phases.run_end2end(Folder(tmp_path / str(dtype)), "cpu", None, 10.0, lambda _: None,
                           dtype)
        # a tier's (first) run is the report's: end2end.json, end2end/
        assert (tmp_path / str(dtype) / "end2end.json").is_file()
    assert "--dtype" not in ran[0]
    assert ran[1][ran[1].index("--dtype") + 1] == "float16"
    assert ran[1].index("--dtype") < ran[1].index("--outdir")  # the report shows it


def test_the_steps_tier_runs_three_training_steps(tmp_path, monkeypatch, main):
    """steps: FP32 with torch.compile, FP16 and BF16, each its own folder and record, with
    the project's tuned entries; a recorded run is not run again, and a run the time left
    cannot hold is left for --resume; its plan fits the device budget in two calls."""
    from convbench.campaign import phases
    from convbench.campaign.folder import Folder
    assert campaign.plan_cases("steps", "gpu", planted=False) == []
    ran = []

    def run_group(cmd, timeout, log, *a, env=None, **k):
        ran.append((cmd, env))
        log.write("end2end mlperf 128^3 b2 gpu; done\n")
        return 0
    monkeypatch.setattr(phases, "_run_group", run_group)
    folder = Folder(tmp_path)
    runs = campaign.plan.end2end_runs("steps")
    result = phases.run_end2end(folder, "gpu", None, 10.0, lambda _: None, runs=runs,
                                campaign_winners=False)
    assert result["status"] == "done" and len(ran) == 3
    assert {"--torch-compile", "--fuse"} <= set(ran[0][0]) and "--dtype" not in ran[0][0]
    assert [c[c.index("--dtype") + 1] for c, _ in ran[1:]] == ["float16", "bfloat16"]
    assert all("CONVBENCH_TUNING" not in env for _, env in ran)
    assert {p.name for p in tmp_path.iterdir() if p.is_dir()} >= {
        "end2end", "end2end_float16", "end2end_bfloat16"}
    assert phases.run_end2end(folder, "gpu", None, 10.0, lambda _: None, runs=runs)[
        "detail"].count("recorded already") == 3 and len(ran) == 3
    assert folder.read_json("end2end.json")["tuning"] == "the project's"
    # a run that timed out is run again; one that failed is a result, kept
    folder.write_json("end2end_float16.json", {"exit": "timeout", "command": []})
    folder.write_json("end2end.json", dict(folder.read_json("end2end.json"), exit=1))
    again = phases.run_end2end(folder, "gpu", None, 10.0, lambda _: None, runs=runs)
    assert len(ran) == 4 and "--dtype" in ran[3][0] and again["status"] == "failed"
    (tmp_path / "end2end_bfloat16.json").unlink()
    left = phases.run_end2end(folder, "gpu", None, 10.0, lambda _: None, runs=runs,
                              time_left=lambda: 30.0)
    assert left["status"] == "partial" and "bfloat16 and after" in left["detail"]
    plan = main("--dry-run", "--tier", "steps")
    assert plan.returncode == 0 and "budget 15 min: fits" in plan.stdout, plan.stdout
    assert "end2end (bfloat16)" in plan.stdout and "run --tier steps" in plan.stdout


def test_the_end_to_end_section_reads_the_runs_files(tmp_path):
    from convbench.campaign.folder import Folder
    from convbench.campaign.report import end2end_section
    folder = Folder(tmp_path)
    assert "Not run" in "\n".join(end2end_section(folder))
    folder.write_json("end2end.json", {
        "exit": 0, "command": ["/x/scripts/cosmoflow_end2end.py", "--train", "--outdir", "o"],
        "summary": "end2end mlperf 128^3 b2 gpu; train step torch 25.0 ms, dace 30.0 ms"})
    (tmp_path / "end2end").mkdir()
    rows = ["layer,backend,implementation,batch,median_ms",
            "train.total,torch,-,2,25.0", "train.total,dace,-,2,30.0",
            "train.conv1.bwd,torch,-,2,4.0",
            "train.conv1.bwd,dace,implicitGemmPipelinedBwdFilter,2,6.0"]
    (tmp_path / "end2end" / "summary.csv").write_text("\n".join(rows) + "\n")
    text = "\n".join(end2end_section(folder))
    assert "`cosmoflow_end2end.py --train` with" in text  # no --outdir
    assert "| train.conv1.bwd | implicitGemmPipelinedBwdFilter | 4.00 | 6.00 | 1.50 |" in text
    assert "torch 80.0 samples/s, DaCe 66.7 samples/s (batch 2)" in text
    assert "AMP" not in text and "TF32 off" in text
    # a float16 run: torch's mixed precision beside both, in the table and the samples/s
    folder.write_json("end2end.json", dict(folder.read_json("end2end.json"), command=[
        "/x/scripts/cosmoflow_end2end.py", "--train", "--dtype", "float16", "--outdir", "o"]))
    rows += ["train.total,torch-amp,-,2,20.0", "train.conv1.bwd,torch-amp,-,2,3.0"]
    (tmp_path / "end2end" / "summary.csv").write_text("\n".join(rows) + "\n")
    text = "\n".join(end2end_section(folder))
    assert "`cosmoflow_end2end.py --train --dtype float16` with" in text
    assert "TF32 off" not in text
    assert "| train.conv1.bwd | implicitGemmPipelinedBwdFilter | 4.00 | 6.00 | 1.50 | 3.00 | 2.00 |" in text
    assert "DaCe 66.7 samples/s, torch AMP 100.0 samples/s (batch 2)" in text


def test_the_report_measures_each_precision_against_its_own_ceiling():
    """A 16-bit case's share of peak is of the FP16 tensor-core GEMM, a TF32 case's of the
    TF32 one, a float32 case's of SGEMM; DaCe's and the fastest vendor's side by side."""
    from convbench.campaign import report
    ceilings = {"peak_gflops": 50_000.0, "fp16_gflops": 800_000.0, "tf32_gflops": 400_000.0}
    assert report._peak(ceilings, "float16") == report._peak(ceilings, "bfloat16") == 800_000.0
    assert report._peak(ceilings, "float32-tf32") == 400_000.0
    assert report._peak(ceilings, "float32") == 50_000.0
    assert report._share(400.0, 1.0, 800_000.0) == "50.0"   # 400 GFLOP in 1 ms
    assert report._share(400.0, None, 800_000.0) == "—"
    assert report._peak({"peak_gflops": 1.0}, "float16") is None
