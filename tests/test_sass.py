"""Reading SASS (``convbench.build.sass``): the listing's parser, loops and the main loop, what a
loop's instructions count as, on committed listings of small kernels (tests/data/sass/,
made by its make_listings.sh); ``convbench sass`` on a real build; its usage errors."""

import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_usage_error, in_process
from convbench.build import sass
from convbench.commands import sass as sass_cmd

DATA = Path(__file__).parent / "data" / "sass"


def reading(name, kernel):
    return sass.read_listing((DATA / name).read_text())[kernel]


# -- the committed listings -------------------------------------------------------------------

def test_a_loop_of_ffma_only():
    r = reading("ffma.sass", "ffma_only")
    assert (r.fma_kind, r.fma, r.instructions) == ("FFMA", 32, 35)
    assert r.fma_share == pytest.approx(32 / 35)
    assert not any(r.counts.get(w) for w in sass.LDS_WIDTHS)
    assert r.per_fma("LDS") == 0.0 and r.counts.get("LDG", 0) == 0
    row = r.row()
    assert row["fma_share"] == 0.914 and row["lds128_per_fma"] == 0.0


def test_lds128_loads_are_counted_by_width():
    r = reading("lds128.sass", "lds128")
    assert (r.fma_kind, r.fma, r.counts["LDS.128"]) == ("FFMA", 16, 8)
    assert r.per_fma("LDS.128") == 0.5 and r.per_fma("LDS") == 0.0
    assert r.row()["lds128_per_fma"] == 0.5 and r.row()["lds32_per_fma"] == 0.0


def test_ldmatrix_feeding_hmma():
    r = reading("ldsm_hmma.sass", "ldsm_hmma")
    assert (r.fma_kind, r.fma, r.counts["HMMA"], r.counts["LDSM"]) == ("HMMA", 16, 16, 32)
    assert r.counts.get("FFMA", 0) == 0 and r.row()["ldsm_per_fma"] == 2.0
    assert r.row()["lds16_per_fma"] == 0.0


def test_a_loop_without_fma_has_no_ratios():
    r = reading("nofma.sass", "copy_loop")
    assert (r.loops, r.fma, r.fma_kind, r.fma_share) == (1, 0, "", 0.0)
    assert r.instructions == 7 and r.counts["LDG"] == 1 and r.counts["IMAD.WIDE"] == 2
    assert r.per_fma("integer") is None
    row = r.row()
    assert row["int_per_fma"] == "" and row["lds32_per_fma"] == "" and row["ldg"] == 1
    assert "FMA 0%" in sass.describe(r)


def test_of_two_loops_the_one_with_the_most_fma_is_the_main_loop():
    fn = sass.parse_listing((DATA / "twoloops.sass").read_text())[0]
    found = sass.loops(fn)
    assert len(found) == 4  # each source loop: an unrolled body and its remainder
    main, n = sass.main_loop(fn)
    assert n == 4 and (main.start, main.end) == (0x420, 0x640)
    fmas = [sum(i.base == "FFMA" for i in lp.instructions) for lp in found]
    assert fmas[0] == 0 and max(fmas) == 32  # the summing loop adds, it does not FMA
    r = sass.read(fn)
    assert (r.loop, r.fma, r.instructions) == ("0x0420-0x0640", 32, 35)


def test_nvdisasm_listings_with_labels_read_the_same():
    by_address = sass.parse_listing((DATA / "twoloops.sass").read_text())[0]
    by_label = sass.parse_listing((DATA / "twoloops.nvdisasm").read_text())[0]
    assert by_label.name == "two_loops" and by_label.symbol.startswith("_Z9two_loops")
    assert [(lp.start, lp.end) for lp in sass.loops(by_label)] == \
        [(lp.start, lp.end) for lp in sass.loops(by_address)]
    assert sass.read(by_label) == sass.read(by_address)


LISTING = """\
\t\tFunction : _Z6kernelPf
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   HFMA2.MMA R2, -RZ, RZ, 0, 0 ;
        /*0020*/                   IMAD.MOV.U32 R3, RZ, RZ, 0x1 ;
        /*0030*/                   FFMA R4, R2, R3, R4 ;
        /*0040*/                   LDS.U16 R5, [R6] ;
        /*0050*/                   LDS.S8 R5, [R6+0x1] ;
        /*0060*/                   LDS.U.64 R8, [R6] ;
        /*0070*/                   LDSM.16.M88.4 R12, [R6] ;
        /*0080*/                   LDGSTS.E.BYPASS.128 [R7], desc[UR4][R10.64] ;
        /*0090*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*00a0*/                   IMAD.WIDE.U32 R10, R3, 0x4, R10 ;
        /*00b0*/                   ISETP.GE.AND P0, PT, R3, 0x10, PT ;
        /*00c0*/                   STL [R1], R4 ;
        /*00d0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00d8*/              @!PT LDS RZ, [RZ] ;
        /*00e0*/               @P0 BRA 0x30 ;
        /*00f0*/                   EXIT ;
        /*0100*/                   BRA 0x100;
        /*0110*/                   NOP;
"""


def test_what_each_instruction_counts_as():
    fn, = sass.parse_listing(LISTING)
    assert fn.name == "kernel"
    loops = sass.loops(fn)
    assert [(lp.start, lp.end) for lp in loops] == [(0x30, 0xe0)]  # BRA 0x100 is no loop
    r = sass.read(fn)
    assert (r.loop, r.loops, r.instructions, r.fma) == ("0x0030-0x00e0", 1, 12, 1)
    c = r.counts
    assert (c["LDS.U16"], c["LDS.64"], c["LDSM"], c["LDGSTS"]) == (2, 1, 1, 1)
    assert (c["integer"], c["IMAD.WIDE"], c["predicate"], c["local"], c["BAR"]) == (2, 1, 1, 1, 1)
    assert c.get("move", 0) == 0  # the moves are before the loop
    assert "LDS" not in c  # @!PT: never runs (the compiler's padding around cp.async)


def test_moves_are_no_fma_and_a_kernel_without_loop_is_read_whole():
    text = "\n".join(line for line in LISTING.splitlines() if "@P0 BRA" not in line)
    fn, = sass.parse_listing(text)
    r = sass.read(fn)
    assert (r.loops, r.loop) == (0, "whole kernel")
    assert r.instructions == 16  # every instruction but the NOP
    assert r.fma == 1 and r.counts["move"] == 2  # HFMA2.MMA -RZ, RZ and IMAD.MOV
    assert "no loop" in sass.describe(r)


def test_a_listing_without_functions_reads_nothing():
    assert sass.read_listing("Fatbin elf code:\n================\narch = sm_90\n") == {}


# -- the real tools ----------------------------------------------------------------------------

needs_tools = pytest.mark.skipif(shutil.which("nvcc") is None or sass.tool_dir() is None,
                                 reason="nvcc or cuobjdump/nvdisasm is not installed")


@needs_tools
@pytest.mark.full  # a check of the toolchain rather than of this project's code
def test_the_sources_compile_to_the_committed_readings(tmp_path):
    """nvcc and the disassembler installed here read the small kernels as the committed
    listings do (a newer toolchain that changes them shows here first)."""
    for cu in sorted(DATA.glob("*.cu")):
        obj = tmp_path / f"{cu.stem}.o"
        subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-rdc=true", "-c", "-o",
                        str(obj), str(cu)], check=True, capture_output=True, timeout=300)
        fresh = sass.read_listing(sass.disassemble(obj))
        committed = sass.read_listing((DATA / f"{cu.stem}.sass").read_text())
        assert {k: (r.fma_kind, r.fma, r.loops) for k, r in fresh.items()} == \
            {k: (r.fma_kind, r.fma, r.loops) for k, r in committed.items()}, cu.name


@needs_tools
def test_convbench_sass_reads_a_build(tmp_path, capsys):
    run = in_process(sass_cmd, capsys)
    csv_path, listing = tmp_path / "k.csv", tmp_path / "k.sass"
    r = run("implicitGemmNCDHWinplace", "--paramscsv", "cosmoflow", "--layer", "conv3",
            "--batch", "16", "--csv", csv_path, "--sass", listing)
    assert r.returncode == 0, r.stderr
    assert "implicitGemmNCDHWinplace on cosmoflow/conv3 at batch 16, float32" in r.stdout
    for word in ("FFMA", "LDS/FMA", "LDS.128/FMA", "LDSM/FMA", "LDS.U16/FMA", "LDGSTS",
                 "int/FMA", "pred/FMA", "IMAD.WIDE", "BAR", "main loop", "spills"):
        assert word in r.stdout, word
    rows = list(csv.DictReader(open(csv_path)))
    main = [row for row in rows if row["main"] == "yes"]
    assert len(main) == 1 and main[0]["fma_kind"] == "FFMA"
    assert 0.3 < float(main[0]["fma_share"]) < 0.9 and int(main[0]["registers"]) > 0
    # the listing written is the one read
    text = listing.read_text()
    assert sass.read_listing(text)[main[0]["kernel"]].row()["fma"] == int(main[0]["fma"])


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["directConvNDHWCblocked", "--layer", "conv3"], ["no GPU schedule"]),
    (["noSuchKernel", "--layer", "conv3"], ["IMPL", "noSuchKernel", "implicitGemmMMA"]),
    (["implicitGemmNCDHW", "--layer", "conv99"], ["conv99", "conv7"]),
    (["implicitGemmNCDHW"], ["--layer"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--paramscsv", "no_such_set"], ["no_such_set"]),
    (["implicitGemmMMA", "--layer", "conv3", "--dtype", "float32"], ["--dtype"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--param", "CTAtileM=7"], ["CTAtileM"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--batch", "0"], ["--batch"]),
    (["--all", "--layer", "conv3"], ["--all", "--layer"]),
    (["noSuchKernel,implicitGemm", "--all"], ["IMPL", "noSuchKernel"]),
    (["directConvNDHWCblocked", "--all"], ["IMPL", "directConvNDHWCblocked"]),
    (["--all", "--dtype", "float16", "--param", "CTAtileM=64"], ["--all", "--dtype", "--param"]),
    (["--all", "--out", "/proc/no/such/folder"], ["--out"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--csv", "/proc/x.csv"], ["--csv"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--sass", "/proc/x.sass"], ["--sass"]),
    (["implicitGemmNCDHW", "--layer", "conv3", "--jobs", "2"], ["--jobs", "--all"]),
    ([], ["IMPL", "--all"]),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    assert_usage_error(in_process(sass_cmd, capsys)(*args), *words)


def test_missing_tools_are_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(sass, "tool_dir", lambda: None)
    monkeypatch.setattr(sass_cmd.shutil, "which", lambda name: "/usr/bin/" + name)
    r = in_process(sass_cmd, capsys)("implicitGemmNCDHWinplace", "--layer", "conv3")
    assert_usage_error(r, "cuobjdump", "make setup")
    with pytest.raises(sass.UsageError):
        sass.disassemble(Path("x.o"))


def test_missing_nvcc_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(sass_cmd.shutil, "which", lambda name: None)
    r = in_process(sass_cmd, capsys)("implicitGemmNCDHWinplace", "--layer", "conv3")
    assert_usage_error(r, "nvcc")


def test_the_include_folders_of_daces_own_environments_and_the_projects():
    """DaCe's environments list their include folders, the project's compute them: both
    are taken, and an unknown name is passed over."""
    from convbench.build import gpubuild
    from convkernels import blas
    codes = [type("Code", (), {"environments": {
        "dace.libraries.blas.environments.cublas.cuBLAS",
        blas.ConvbenchCuBLAS.full_class_path(), "no.such.Environment"}})(),
             type("Code", (), {"environments": frozenset()})()]
    found = gpubuild.include_folders(codes)
    assert found == blas.ConvbenchCuBLAS.cmake_includes()


def test_the_tools_are_found_in_the_pypi_packages_folder(tmp_path, monkeypatch):
    folder = tmp_path / "nvidia" / "cu13" / "bin"
    folder.mkdir(parents=True)
    for tool in ("cuobjdump", "nvdisasm"):
        (folder / tool).write_text("#!/bin/sh\n")
        (folder / tool).chmod(0o755)
    monkeypatch.setattr(sass, "_package_dirs", lambda: [folder])
    monkeypatch.setattr(sass.shutil, "which", lambda name: None)
    sass.tool_dir.cache_clear()
    try:
        assert sass.tool_dir() == folder
        (folder / "nvdisasm").unlink()  # cuobjdump alone cannot disassemble
        sass.tool_dir.cache_clear()
        assert sass.tool_dir() is None
    finally:
        sass.tool_dir.cache_clear()


# -- the campaign: read when built, reported beside the times -----------------------------------

def _record(rid, impl, layer, dace, vendor=None, status="verified"):
    timings = {"dace": {"median_ms": dace}}
    if vendor is not None:
        timings["cudnn"] = {"median_ms": vendor}
    return {"id": rid, "status": status, "timings": timings,
            "case": {"impl": impl, "layer_set": "cosmoflow", "planted": "", "params": {},
                     "layer": {"name": layer, "batch": 16}}}


def test_the_campaign_report_puts_the_fma_share_beside_the_ratio():
    from convbench.campaign import report
    records = [_record("a1", "implicitGemmNCDHW", "conv3", 2.0, vendor=1.0),
               _record("a2", "implicitGemmNCDHW", "conv4", 3.0, vendor=1.0),
               _record("b1", "implicitGemmWarpTiled", "conv3", 3.0),
               _record("c1", "implicitGemm", "conv3", 9.0),
               _record("d1", "im2colGemm", "conv3", 5.0, status="wrong")]
    builds = {"x": {"cases": ["a1"], "sass": {"fma_kind": "FFMA", "fma_share": 0.62}},
              "y": {"cases": ["a2"], "sass": {"fma_kind": "FFMA", "fma_share": 0.60}},
              "z": {"cases": ["b1"], "sass": {"fma_kind": "FFMA", "fma_share": 0.50}},
              "w": {"cases": ["c1"], "sass": {"fma_kind": "FFMA", "fma_share": 0.20}},
              "v": {"cases": ["d1"], "sass": {"error": "cuobjdump/nvdisasm not found"}}}
    rows, sentence = report.machine_code(records, builds)
    by_impl = {r[0]: r for r in rows}
    assert "im2colGemm" not in by_impl  # wrong results are not compared
    assert by_impl["implicitGemmNCDHW"][3:] == ["FFMA 60-62%", 2, "2.00x", "2.50x", "3.00x"]
    assert by_impl["implicitGemm"][3:] == ["FFMA 20%", 1, "9.00x", "9.00x", "9.00x"]
    assert "3 float32 FFMA rows" in sentence and "-1.00" in sentence
    rows, sentence = report.machine_code(records[:1], {})
    assert rows[0][3] == "not read" and "Too few" in sentence


@needs_tools
def test_a_campaign_build_is_read_from_its_library(tmp_path, monkeypatch):
    """The builds phase disassembles each GPU build it made: here a cache entry whose
    library is the FFMA kernel's object file."""
    import json as _json
    from convbench.build import cache
    from convbench.campaign import phases
    obj = tmp_path / "lib.o"
    subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-rdc=true", "-c", "-o", str(obj),
                    str(DATA / "ffma.cu")], check=True, capture_output=True, timeout=300)

    class Job:
        target = "gpu"

        def spec(self):
            return type("Spec", (), {"name": "entry"})()
    entry = tmp_path / "cache" / "entry"
    entry.mkdir(parents=True)
    (entry / cache.MANIFEST).write_text(_json.dumps({"library": "../../lib.o"}))
    found = phases.read_build(Job(), tmp_path / "cache")
    assert found == {"kernel": "ffma_only", "fma_kind": "FFMA", "fma_share": 0.914,
                     "loop_instructions": 35}
    (entry / cache.MANIFEST).write_text(_json.dumps({"library": "missing.so"}))
    assert "error" in phases.read_build(Job(), tmp_path / "cache")
    monkeypatch.setattr(sass, "tool_dir", lambda: None)
    assert phases.read_build(Job(), tmp_path / "cache") == {
        "error": "cuobjdump/nvdisasm not found"}


def test_the_main_kernel_is_the_one_whose_loop_holds_the_most_fma():
    """A loop-free transform with more FMAs than the GEMM's loop is not the main kernel
    (it runs its body once per thread); without any loop, the most FMAs win."""
    loop_free = sass.Reading("transform", "whole kernel", 0, 285, 26, "FFMA")
    gemm = sass.Reading("gemm", "0x2210-0x25d0", 3, 61, 16, "FFMA")
    copy = sass.Reading("copy", "0x0100-0x0200", 1, 7, 0, "")
    assert sass.main_reading({"t": loop_free, "g": gemm, "c": copy}) is gemm
    assert sass.main_reading({"t": loop_free, "c": copy}) is loop_free
    assert sass.main_reading({"c": copy}) is None
    from convbench.build import gpubuild
    kernels = [gpubuild.Kernel("transform", shared=0, sass=loop_free),
               gpubuild.Kernel("gemm", shared=17408, sass=gemm)]
    assert gpubuild.Probe("winogradF2Tiled", "s", "l", 1, {}, kernels=kernels).main.name == "gemm"


def test_a_build_reused_by_a_later_call_keeps_its_earlier_cases(monkeypatch):
    """builds.json maps each build to every case that ran it, over calls, so that the
    report finds the reading of a case recorded by an earlier call."""
    from convbench.build import cache
    from convbench.campaign import phases

    class Job:
        target = "gpu"

        def spec(self):
            return type("Spec", (), {"name": "build-a"})()

        def describe(self):
            return "build-a"

    class Case:
        def __init__(self, cid):
            self.id = cid

        def job(self):
            return Job()

    class Folder:
        data = {}

        def read_json(self, name, default=None):
            return self.data.get(name, default)

        def write_json(self, name, value):
            self.data[name] = __import__("copy").deepcopy(value)
    monkeypatch.setattr(cache, "fill", lambda jobs, cachedir, workers: (
        (j, "cached", 0.1, "") for j in jobs))
    monkeypatch.setattr(phases, "read_build", lambda job, cachedir: {"fma_kind": "FFMA",
                                                                     "fma_share": 0.5})
    folder = Folder()
    phases.run_builds(folder, [Case("first")], "unused", 1, lambda line: None)
    phases.run_builds(folder, [Case("second")], "unused", 1, lambda line: None)
    row = folder.data["builds.json"]["build-a"]
    assert row["cases"] == ["first", "second"] and row["sass"]["fma_share"] == 0.5
