"""convbench.plots and scripts/plot_results.py on small synthetic run directories."""

import csv
import json
import math
import subprocess

import pytest


from conftest import ENV, PYTHON, ROOT

from convbench import plots
from convbench.results import writer as results, schema

SCRIPT = ROOT / "scripts" / "plot_results.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_COLUMNS = ["layer_index", "layer", "geometry", "batch", "implementation", "backend",
                   "samples", "median_ms", "q1_ms", "q3_ms", "iqr_ms", "iqr_over_median",
                   "noisy", "min_ms", "mean_ms", "gflop", "gflops", "mbytes", "bandwidth_gbs",
                   "intensity", "ratio_vs_torch"]
CEILINGS = {"peak_gflops": 2500.0, "peak_method": "cores x FMA x clock",
            "bandwidth_gbs": 40.0, "bandwidth_method": "STREAM triad"}
IMPL = "directConvNCDHW"
# layer, geometry, gflop, mbytes, {backend: base time [ms]}; conv3 lacks the dace row
LAYERS = [("conv1", "1->16 @18^3 k3^3 s1 p0 b1", 0.0113, 0.37, {"dace": 3.0, "torch": 1.0}),
          ("conv2", "16->32 @10^3 k3^3 s1 p0 b1", 0.0071, 0.26, {"dace": 0.8, "torch": 1.1}),
          ("conv3", "32->64 @6^3 k3^3 s1 p0 b1", 0.0038, 0.24, {"torch": 0.4})]


def write_run(path, ceilings=CEILINGS, layers=LAYERS, samples=5, metadata=None):
    """A run directory like the profiler's: samples.csv, summary.csv, metadata.json."""
    path.mkdir(parents=True, exist_ok=True)
    srows, urows = [], []
    for index, (layer, geometry, gflop, mbytes, times) in enumerate(layers):
        medians = {}
        for backend, base in times.items():
            ts = [base * (1 + 0.05 * ((i * 7) % 5)) for i in range(samples)]
            srows += [[index, layer, IMPL, backend, i, f"{t:.6f}"] for i, t in enumerate(ts)]
            ts.sort()
            med = ts[len(ts) // 2]
            medians[backend] = med
            q1, q3 = ts[len(ts) // 4], ts[(3 * len(ts)) // 4]
            urows.append({"layer_index": index, "layer": layer, "geometry": geometry,
                          "batch": 1, "implementation": IMPL, "backend": backend,
                          "samples": samples, "median_ms": med, "q1_ms": q1, "q3_ms": q3,
                          "iqr_ms": q3 - q1, "iqr_over_median": (q3 - q1) / med,
                          "noisy": (q3 - q1) / med > 0.1, "min_ms": ts[0],
                          "mean_ms": sum(ts) / len(ts), "gflop": gflop,
                          "gflops": gflop / (med / 1e3), "mbytes": mbytes,
                          "bandwidth_gbs": mbytes / med, "intensity": gflop * 1e3 / mbytes})
        for row in urows[-len(times):]:
            row["ratio_vs_torch"] = row["median_ms"] / medians["torch"] if "torch" in medians \
                else ""
    with (path / "samples.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(plots.SAMPLE_COLUMNS)
        writer.writerows(srows)
    with (path / "summary.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(urows)
    if metadata is None:
        metadata = {"implementation": IMPL, "pass": "fwd",
                    "device": {"kind": "cpu", "name": "Test CPU (4 cores)"},
                    "layer_set": "tiny", "batch": 1, "references": ["torch"],
                    "timestamp": "2026-01-01T00:00:00",
                    "timing": {"method": "wall clock", "warmup": 1, "iterations": samples}}
        if ceilings is not None:
            metadata["ceilings"] = ceilings
    (path / "metadata.json").write_text(json.dumps(metadata))
    return path


def assert_pngs(paths, outdir):
    assert [p.name for p in paths] == ["violin.png", "medians.png", "roofline.png"]
    for p in paths:
        assert p.parent == outdir
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC, p
        assert len(data) > 10_000, (p, len(data))


@pytest.mark.parametrize("ceilings", [CEILINGS, None, {"peak_gflops": 2500.0}],
                         ids=["ceilings", "no-ceilings", "peak-only"])
def test_plot_run(tmp_path, ceilings):
    run_dir = write_run(tmp_path / "run", ceilings=ceilings)
    assert_pngs(plots.plot_run(run_dir), run_dir)


def test_plot_run_outdir_and_minimal_metadata(tmp_path):
    """Empty metadata, one sample per backend, a dace-only layer: still three plots."""
    layers = LAYERS + [("conv4", "", 0.002, 0.1, {"dace": 0.2})]
    run_dir = write_run(tmp_path / "run", layers=layers, samples=1, metadata={})
    out = tmp_path / "out" / "nested"
    assert_pngs(plots.plot_run(run_dir, out), out)
    assert not (run_dir / "violin.png").exists()


def test_load_run(tmp_path):
    run = plots.load_run(write_run(tmp_path / "run"))
    assert run.layers == ["conv1", "conv2", "conv3"]
    assert run.backends == ["dace", "torch"]
    assert run.implementation == IMPL
    assert run.label("dace") == IMPL and run.label("torch") == "torch"
    assert run.geometry["conv2"].startswith("16->32")
    assert len(run.samples[("conv1", "dace")]) == 5
    assert ("conv3", "dace") not in run.summary
    assert run.summary[("conv1", "torch")]["noisy"] in (True, False)
    assert run.ratio("conv1", "torch") == pytest.approx(3.0)
    assert math.isnan(run.ratio("conv3", "torch"))


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "summary.csv").unlink(), "missing summary.csv"),
    (lambda d: (d / "metadata.json").unlink(), "missing metadata.json"),
    (lambda d: (d / "samples.csv").write_text("layer,backend,time_ms\n"),
     "samples.csv: missing column 'layer_index'"),
    (lambda d: (d / "samples.csv").write_text(
        ",".join(plots.SAMPLE_COLUMNS) + "\n0,conv1,x,dace,0,fast\n"),
     "samples.csv:2: column 'time_ms': 'fast' is not a number"),
    (lambda d: (d / "metadata.json").write_text("[1, 2]"), "expected a JSON object"),
])
def test_load_run_errors(tmp_path, damage, words):
    run_dir = write_run(tmp_path / "run")
    damage(run_dir)
    with pytest.raises((FileNotFoundError, ValueError), match=words.replace("(", r"\(")):
        plots.load_run(run_dir)


def write_with_run_writer(path):
    """The LAYERS written by the profiler's own writer, three samples each."""
    from convbench.timing.timers import Timing
    writer = results.RunWriter(path, {"implementation": IMPL, "references": ["torch"]}, ["torch"])
    for index, (layer, geometry, gflop, mbytes, times) in enumerate(LAYERS):
        ms = [results.Measurement(b, Timing([t, 1.1 * t, 0.9 * t], 1, "test"))
              for b, t in times.items()]
        writer.add_entry(index, layer, IMPL, ms, geometry=geometry, batch=1, flop=gflop * 1e9,
                         nbytes=mbytes * 1e6)
    writer.finish()
    return path


def test_writer_and_reader_share_one_schema(tmp_path):
    assert results.SAMPLE_COLUMNS is schema.SAMPLE_COLUMNS is plots.SAMPLE_COLUMNS
    assert results.SUMMARY_COLUMNS is schema.SUMMARY_COLUMNS
    assert results.DACE is schema.DACE == "dace"
    # the files this test module writes by hand follow the schema too
    assert SUMMARY_COLUMNS == [*schema.SUMMARY_COLUMNS, schema.ratio_column("torch")]
    run = plots.load_run(write_with_run_writer(tmp_path / "run"))
    assert run.metadata["status"] == schema.COMPLETE
    assert run.layers == ["conv1", "conv2", "conv3"] and run.backends == ["dace", "torch"]
    assert run.implementation == IMPL and run.geometry["conv2"].startswith("16->32")
    assert run.samples[("conv1", "dace")].tolist() == pytest.approx([3.0, 3.3, 2.7])
    assert run.ratio("conv1", "torch") == pytest.approx(3.0)
    assert math.isnan(run.ratio("conv3", "torch"))
    assert run.summary[("conv2", "dace")]["intensity"] == pytest.approx(0.0071e9 / 0.26e6,
                                                                       rel=1e-5)


def test_a_name_changed_in_the_schema_changes_writer_and_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(schema, "SUMMARY", "stats.csv")
    monkeypatch.setattr(schema, "ratio_column", lambda ref: f"over_{ref}")
    run_dir = write_with_run_writer(tmp_path / "run")
    assert sorted(p.name for p in run_dir.iterdir()) == ["metadata.json", "samples.csv",
                                                         "stats.csv"]
    assert "over_torch" in (run_dir / "stats.csv").read_text().splitlines()[0].split(",")
    run = plots.load_run(run_dir)
    assert run.summary[("conv1", "dace")]["over_torch"] == pytest.approx(3.0)
    assert run.ratio("conv1", "torch") == pytest.approx(3.0)


def test_reading_needs_no_matplotlib():
    code = ("import sys\n"
            "import convbench.results.schema\n"
            "assert sorted(m for m in sys.modules if m.startswith('convbench')) == "
            "['convbench', 'convbench.results', 'convbench.results.schema'], "
            "'schema imports convbench modules'\n"
            "from convbench.plots import load_run, read_breakdown, RunData, SAMPLE_COLUMNS\n"
            "assert 'matplotlib' not in sys.modules, 'reading imported matplotlib'\n"
            "from convbench.plots import plot_breakdown\n"
            "import matplotlib\n"
            "assert matplotlib.get_backend().lower() == 'agg', matplotlib.get_backend()\n")
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def run_script(*args):
    return subprocess.run([PYTHON, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=120, check=False)


def assert_one_line_error(proc, words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("plot_results.py: error: "), lines[0]
    assert words in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_script_missing_dir(tmp_path):
    missing = tmp_path / "nosuchrun"
    assert_one_line_error(run_script(missing), str(missing))


def test_script_missing_file(tmp_path):
    run_dir = write_run(tmp_path / "run")
    (run_dir / "samples.csv").unlink()
    assert_one_line_error(run_script(run_dir, "--outdir", tmp_path / "out"), "samples.csv")
    assert not (tmp_path / "out").exists()


def test_script_writes_plots(tmp_path):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", ceilings=None)
    proc = run_script(a, b, "--outdir", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    written = proc.stdout.split()
    assert len(written) == 6
    for name in ("a", "b"):
        for png in ("violin.png", "medians.png", "roofline.png"):
            path = tmp_path / "out" / name / png
            assert str(path) in written
            assert path.read_bytes()[:8] == PNG_MAGIC


def test_titles_name_the_precision(tmp_path):
    """A 16-bit run's plots say so (and that it sums in float32); float32's say float32."""
    from convbench.plots._style import run_title
    from convbench.plots.reader import RunData
    for precision, expected in ((None, None), ({"dtype": "float32", "label": "float32",
                                                "accumulate": "float32"}, "float32"),
                                ({"dtype": "bfloat16", "label": "bfloat16",
                                  "accumulate": "float32"}, "bfloat16, sums in float32")):
        meta = {"implementation": "k", "pass": "fwd", "batch": 2,
                **({"precision": precision} if precision else {})}
        run = RunData(tmp_path, meta, {}, {}, [], [], "k")
        title = run_title(run, "Runtime")
        assert (expected in title) if expected else "float" not in title, title
