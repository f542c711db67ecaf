"""The README and the manual stay true: short, linked, generated tables current, and the
commands they show accepted by the parsers they name."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATUS_BEGIN = "<!-- begin: convbench status --markdown -->"
STATUS_END = "<!-- end: convbench status --markdown -->"


def _pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "results").glob("*.md")),
            *sorted((ROOT / "results").glob("*/README.md")),
            *sorted((ROOT / "results" / "cpu").glob("*/README.md"))]


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; the manual goes into docs/"


def test_the_status_table_is_the_results():
    from convbench.commands import status
    readme = (ROOT / "README.md").read_text()
    assert STATUS_BEGIN in readme and STATUS_END in readme
    table = readme.split(STATUS_BEGIN, 1)[1].split(STATUS_END, 1)[0].strip("\n") + "\n"
    assert table == status.markdown(ROOT / "results"), \
        "regenerate it: .venv/bin/convbench status --markdown"


def _where_it_stands(readme: str) -> str:
    return readme.split("## Where it stands", 1)[1].split("\n## ", 1)[0]


def test_the_headline_figures_are_the_results():
    """The README's "Where it stands" is ``convbench status --headline`` of the committed
    results, and holds no ratio outside that generated block."""
    from convbench.commands import headline
    readme = (ROOT / "README.md").read_text()
    section = _where_it_stands(readme)
    assert headline.block(section) == headline.markdown(ROOT / "results"), \
        "regenerate it: .venv/bin/convbench status --headline"
    outside = section.split(headline.BEGIN)[0] + section.split(headline.END)[1]
    assert not re.findall(r"\d(?:\.\d+)?x\b", outside), \
        "a hand-typed ratio in Where it stands: it belongs in results/, quoted by the generator"


def test_the_headline_follows_a_changed_result(tmp_path):
    """A drift test that can fail: the worst forward layer's ratio changed in a copy of
    results/ moves the figure the headline prints, so the README's block no longer
    matches."""
    import csv
    import shutil

    from convbench.commands import headline
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results", results)
    before = headline.markdown(results)
    rounds = results / headline.CPU_BENCH / "fwd" / "rounds.csv"
    with open(rounds, newline="") as f:
        rows = list(csv.DictReader(f))
    worst, _ = headline.cpu_layers(results)
    for row in rows:
        if row["layer"] == worst["fwd"][1]:
            row["ratio"] = str(float(row["ratio"]) * 1.5)
    with open(rounds, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    after = headline.markdown(results)
    assert f"forward {worst['fwd'][0]:.2f}x" in before
    assert f"forward {worst['fwd'][0] * 1.5:.2f}x" in after
    assert headline.block(f"{headline.BEGIN}\n{before}{headline.END}") != after


def test_the_status_shows_every_gpu_implementations_main_loop():
    """The committed readings (``convbench sass --all``) cover every implementation with
    a GPU schedule on each reading layer: a new one without a reading fails here."""
    from convbench import registry
    from convbench.build import gpubuild
    from convbench.commands import status
    readings = gpubuild.load_readings(ROOT / "results" / "gpu" / "sass")
    header, rows, _ = status.table(ROOT / "results")
    column = header.index("GPU main loop: FMA share")
    for impl in registry.all_implementations().values():
        row = next(r for r in rows if r[0] == impl.name)
        if "gpu" not in impl.targets:
            assert row[column] == ""
            continue
        for layer_set, _, _ in gpubuild.READING_LAYERS:
            assert (impl.name, layer_set) in readings, f"{impl.name}: run convbench sass --all"
        if row[column] == "no FMA in its kernels":  # im2colGemm: its GEMM is cuBLAS's
            continue
        assert row[column].count("%") == len(gpubuild.READING_LAYERS), row
        assert row[column].split()[0] in ("FFMA", "HMMA", "HFMA2", "DFMA"), row


def test_spearman_ranks_with_ties():
    from convbench.results import writer as status
    assert status.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert status.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert status.spearman([1, 1, 2], [3, 3, 5]) == pytest.approx(1.0)
    assert status.spearman([1, 2], [1, 2]) is None and status.spearman([1, 1, 1], [1, 2, 3]) is None


def test_status_counts_a_case_as_its_newest_run_found_it(tmp_path):
    """A sweep run on its own (a subfolder) replaces the full tier's rows of the cases it
    ran; the full tier's other rows, repeated cases among them, all count."""
    import json
    from convbench.commands import status
    head = "implementation,pass,dtype,set,layer,geometry,batch,target,params,outcome,detail,seconds\n"
    old = tmp_path / "verify" / "cpu"
    (old / "sweep").mkdir(parents=True)
    (old / "coverage.csv").write_text(head + "k,fwd,float16,s,l1,g,1,cpu,,failed,,1\n"
                                      + "k,fwd,float16,s,l2,g,1,cpu,,verified,,1\n" * 2)
    (old / "metadata.json").write_text(json.dumps({"date": "2026-11-01 00:00 UTC"}))
    (old / "sweep" / "coverage.csv").write_text(head + "k,fwd,float16,s,l1,g,1,cpu,,verified,,1\n")
    (old / "sweep" / "metadata.json").write_text(json.dumps({"date": "2026-11-02 00:00 UTC"}))
    assert status.cpu_verification(tmp_path)[("k", "fwd", True)] == (3, 0)
    (old / "sweep" / "metadata.json").write_text(json.dumps({"date": "2026-10-01 00:00 UTC"}))
    assert status.cpu_verification(tmp_path)[("k", "fwd", True)] == (2, 1)
    # a table without a dtype column (before the precisions) holds float32 cases
    (old / "coverage.csv").write_text(head.replace("dtype,", "") + "k,fwd,s,l1,g,1,cpu,,failed,,1\n")
    (old / "sweep" / "coverage.csv").write_text(head + "k,fwd,float32,s,l1,g,1,cpu,,verified,,1\n")
    (old / "sweep" / "metadata.json").write_text(json.dumps({"date": "2026-11-02 00:00 UTC"}))
    assert status.cpu_verification(tmp_path)[("k", "fwd", False)] == (1, 0)


def test_status_takes_each_gpu_implementation_from_its_newest_finished_campaign(tmp_path):
    """Per implementation: the newest campaign that finished its cases, else the newest
    that ran it (a call cut short still shows the fault it found); a tune campaign only
    for what no other campaign ran, each layer's fastest configuration its ratio; and a
    16-bit case's vendors never divide a float32 kernel's time."""
    import json
    from convbench.commands import status
    head = ("id,impl,layer_set,layer,batch,group,planted,status,dace_ms,cudnn_ms,torch_ms,"
            "cudnn_other_ms,torch_other_ms,gflop,detail\n")

    def campaign(name, tier, finished, rows):
        folder = tmp_path / "gpu" / name
        folder.mkdir(parents=True)
        (folder / "campaign.json").write_text(json.dumps({"options": {"tier": tier}}))
        (folder / "state.json").write_text(json.dumps(
            {"phases": {"cases": {"status": "done" if finished else "partial"}}}))
        (folder / "summary.csv").write_text(head + "".join(
            f"{impl}.s.l.b2{suffix},{impl},s,l,2,g,,{st},{dace},{vendor},{vendor},,,1,\n"
            for impl, suffix, st, dace, vendor in rows))

    campaign("2026-11-01_X", "core", True, [
        ("implicitGemm", "", "verified", 2.0, 1.0), ("implicitGemmMMA", ".float16", "verified", 0.3, 0.1)])
    campaign("2026-11-02_X", "core", False, [
        ("implicitGemm", "", "verified", 9.0, 1.0), ("winogradF2Tiled", "", "timeout", "", "")])
    campaign("2026-11-03_X_tune", "tune", True, [
        ("implicitGemm", "", "verified", 1.5, 1.0),
        ("implicitGemmPipelined", ".M1", "verified", 3.0, 1.0),
        ("implicitGemmPipelined", ".M2", "verified", 1.2, 1.0)])
    got = status.gpu_status(tmp_path)
    assert got["implicitGemm"] == ((1, 1, [2.0]), "2026-11-01_X")
    assert got["winogradF2Tiled"] == ((0, 1, []), "2026-11-02_X")
    assert got["implicitGemmMMA"][0][2] == [pytest.approx(3.0)]
    assert got["implicitGemmPipelined"] == ((2, 2, [pytest.approx(1.2)]), "2026-11-03_X_tune")
    assert status.sources(got) == ("2026-11-01_X; 2026-11-02_X (winogradF2Tiled); "
                                   "2026-11-03_X_tune (implicitGemmPipelined)")


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    """Every relative link of the page names a file or folder that exists."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line:
                yield line


def test_the_readme_commands_parse():
    """Each command of the README's shell blocks names a make target or a script whose
    parser accepts its flags as written."""
    from convbench.commands import profile_conv3d as cli
    from convbench.network import end2end
    parsers = {"profile_conv3d.py": cli.build_parser, "scripts/cosmoflow_end2end.py":
               end2end.build_parser}
    makefile = (ROOT / "Makefile").read_text()
    seen = 0
    for line in _readme_commands():
        words = shlex.split(line)
        if words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), line
        elif words[0] == ".venv/bin/python" and words[1] in parsers:
            parsers[words[1]]().parse_args(words[2:])  # SystemExit(2) on an unknown flag
        elif words[0] == ".venv/bin/convbench":
            from convbench import main
            assert words[1].startswith("-") or words[1] in main.SUBCOMMANDS, line
        else:
            pytest.fail(f"a README command this test does not know how to check: {line}")
        seen += 1
    assert seen >= 6
