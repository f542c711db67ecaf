"""Test tiers, the session's build cache, the coverage table and shared fixtures.

* **Tiers.** ``pytest`` (``make test``, what CI runs) is the fast tier.  ``pytest --full``
  (``make test-full``) runs the tests marked ``full`` too: the sweeps.
* **One build per session.** The ``builds`` fixture compiles each build once per session,
  into a cache folder of the session's own.  When a test first asks for it, it compiles
  every build that the collected tests (those not skipped) declare, in parallel
  (``--build-jobs``, default one per core): each :class:`cases.Case` parameter, and the
  cases of ``@pytest.mark.prebuild(...)``.  Planted bugs are built with
  ``make_spec(..., planted=...)``: another key, another entry.
* **Coverage.** Every verified case is recorded (verified, refused or failed); the table
  goes to ``--coverage-out=DIR`` (``make test-full`` writes ``results/verify/cpu/``).
"""

import csv
import functools
import importlib.util
import io
import json
import os
import platform
import shlex
import sys
import types
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Under pytest-xdist each worker takes its share of the cores for OpenMP (torch and the
# DaCe kernels; subprocesses inherit it), so that the workers do not oversubscribe the
# machine.  Set before anything starts OpenMP.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1)
                                            // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# The CPU blockings follow the machine's caches (convkernels.cpu.caches); the tests pin the
# reference ones, so that a test of a blocking does not depend on the machine it runs on
# (tests/test_caches.py reads a machine's and sets others).
from convkernels.cpu.caches import ENV as _CACHES_ENV, reference_setting  # noqa: E402
os.environ.setdefault(_CACHES_ENV, reference_setting())

from cases import Case  # noqa: E402
from convbench.timing import devices  # noqa: E402
from convbench.build.cache import BuildCache, fill  # noqa: E402
from convkernels.cpu.isa import widest_isa  # noqa: E402
from convbench.check.verify import make_truth  # noqa: E402

PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(ROOT))

_CASES = pytest.StashKey[list]()
_COVERAGE = pytest.StashKey["Coverage"]()
#: The coverage records as they are made, in the ``--coverage-out`` folder.
JOURNAL = "coverage.journal.jsonl"


def pytest_addoption(parser):
    group = parser.getgroup("convbench")
    group.addoption("--full", action="store_true",
                    help="the full tier: run the tests marked 'full' (sweeps) as well")
    group.addoption("--build-jobs", type=int, default=None, metavar="N",
                    help="processes that compile the session's builds up front "
                         "(default: one per core, shared among pytest-xdist's workers)")
    group.addoption("--build-cache", default=None, metavar="DIR",
                    help="keep the session's builds in DIR and reuse the valid ones on the "
                         "next run (default: a new temporary folder per session, as in CI)")
    # With "=": pytest takes a separate value that names an existing folder for a test path.
    group.addoption("--coverage-out", default=None, metavar="DIR",
                    help="write the verification coverage table (coverage.md, coverage.csv, "
                         "metadata.json) into DIR; give it as --coverage-out=DIR")


def pytest_configure(config):
    out = config.getoption("--coverage-out")
    journal = Path(out) / JOURNAL if out else None
    if journal is not None and not hasattr(config, "workerinput"):  # the controller starts it
        journal.parent.mkdir(parents=True, exist_ok=True)
        journal.write_text("")
    config.stash[_COVERAGE] = Coverage(journal)


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--full"):
        full = [item for item in items if item.get_closest_marker("full")]
        if full:
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if not item.get_closest_marker("full")]
    if not devices.gpu_usable():
        skip = pytest.mark.skip(reason=f"needs a GPU: {devices.gpu_problem()}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def item_cases(item):
    """The cases a collected test needs built: its Case parameters and its prebuild marks."""
    found = [v for v in getattr(getattr(item, "callspec", None), "params", {}).values()
             if isinstance(v, Case)]
    for mark in item.iter_markers("prebuild"):
        found.extend(mark.args)
    return found


def _skipped(item) -> bool:
    """Will ``item`` be skipped by a skip or skipif mark (no GPU, no nvcc)?"""
    try:
        from _pytest.skipping import evaluate_skip_marks  # what pytest itself evaluates
    except ImportError:
        return item.get_closest_marker("skip") is not None
    return evaluate_skip_marks(item) is not None


def pytest_collection_finish(session):
    needed = {}
    for item in session.items:
        if not _skipped(item):
            for case in item_cases(item):
                needed.setdefault(case.spec().name, case)
    session.config.stash[_CASES] = list(needed.values())


# -- the session's builds -------------------------------------------------------------------

@pytest.fixture(scope="session")
def cachedir(request, tmp_path_factory):
    """The session's build cache folder, outside the project cache (scripts the tests run
    in subprocesses share it, under the cache's locks); ``--build-cache`` names one that
    outlives the session."""
    kept = request.config.getoption("--build-cache")
    if kept:
        path = Path(kept).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    if _xdist_workers() > 1:  # one folder for the session's workers (each has its own basetemp)
        path = tmp_path_factory.getbasetemp().parent / "builds"
        path.mkdir(exist_ok=True)
        return path
    return tmp_path_factory.mktemp("builds")


def _xdist_workers() -> int:
    """How many pytest-xdist workers run this session (1 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _xdist_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


class SessionBuilds:
    """``builds(spec)``: the build of ``spec`` from the session cache, compiled on a miss.
    :meth:`fill` compiles the collected cases' builds up front, in parallel."""

    def __init__(self, root, cases, workers, report):
        self.cache = BuildCache(root)
        self._cases, self._workers, self._report = cases, workers, report

    def fill(self):
        jobs = [c.job() for c in self._cases if not (c.refused() or c.deferred())]
        if len(jobs) < 2:
            return
        # Under pytest-xdist every worker fills the shared folder, each starting at its own
        # share of the list: a build another worker finished is skipped, one it is
        # compiling is waited for (the cache's locks), so each build is compiled once.
        start = len(jobs) * _xdist_index() // _xdist_workers()
        jobs = jobs[start:] + jobs[:start]
        t0 = time.perf_counter()
        self._report(f"compiling {len(jobs)} builds with {self._workers} process(es)")
        step = max(1, len(jobs) // 10)
        try:
            for i, (job, outcome, _, message) in enumerate(
                    fill(jobs, self.cache.root, self._workers), 1):
                if outcome == "failed":  # the test that needs it builds again and reports
                    self._report(f"  build failed: {job.describe()}: {message}")
                if i % step == 0 or i == len(jobs):
                    self._report(f"  {i}/{len(jobs)} builds, {time.perf_counter() - t0:.0f}s")
        except Exception as err:  # a worker died: the tests build what is missing themselves
            self._report(f"  up-front builds stopped ({type(err).__name__}: {err}); "
                         "each test builds what it lacks")

    def __call__(self, spec, load=True):
        return self.cache.get(spec, policy="reuse", load=load)


@pytest.fixture(scope="session")
def builds(request, cachedir):
    """The session's :class:`SessionBuilds`; requesting it compiles the collected builds."""
    config = request.config
    workers = config.getoption("--build-jobs") or max(1, (os.cpu_count() or 1) // _xdist_workers())
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def report(line):  # to the terminal, past the test's output capture
        if reporter is not None:
            with capture.global_and_fixture_disabled():
                reporter.ensure_newline()
                reporter.write_line(f"[builds] {line}")
    builds = SessionBuilds(cachedir, config.stash[_CASES], workers, report)
    builds.fill()  # in the first test's set-up, where --durations shows it
    return builds


# -- references --------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)  # CosmoFlow references take up to ~1 GB each
def _reference(layer, seed, pass_, dtype):
    return make_truth(layer, pass_, seed=seed, dtype=dtype)


@pytest.fixture(scope="session")
def reference():
    """``reference(layer, seed=0, pass_="fwd", dtype="float32")``: float64 reference of a
    pass on inputs rounded to ``dtype``, shared between implementations (tests order
    implementations by pass, so that it is reused)."""
    return lambda layer, seed=0, pass_="fwd", dtype="float32": _reference(
        layer, seed, str(pass_), dtype)


# -- coverage ----------------------------------------------------------------------------

class Coverage:
    """Outcomes of the verified cases: ``verified``, ``refused`` or ``failed`` (``compiled``
    for GPU builds that were compiled but could not run)."""

    OUTCOMES = ("verified", "refused", "failed", "compiled", "deferred")
    #: Where :meth:`write` put the table, once it did.
    written = None
    #: pytest's exit status, set when the session finishes.
    exitstatus = None

    def __init__(self, journal=None):
        self.records, self.lost = [], []
        self.started = time.time()
        self.git = _git_state()  # at the start: edits made while the tests run do not count
        #: Every record is also appended here as it is made, so that the records of a
        #: worker that dies (killed for memory, say) are not lost with it.
        self.journal = journal
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "")

    def record(self, case, outcome, detail="", seconds=None):
        """One case's outcome; ``seconds``: what its build and check took."""
        assert outcome in self.OUTCOMES, outcome
        row = {
            "implementation": case.impl, "pass": str(case.pass_),
            "dtype": case.precision, "set": case.layer_set,
            "layer": case.layer.name, "geometry": case.layer.describe(),
            "batch": case.layer.batch, "target": case.target,
            "params": ",".join(f"{k}={v}" for k, v in case.params), "outcome": outcome,
            "detail": " ".join(str(detail).split())[:300],
            "seconds": "" if seconds is None else round(seconds, 1)}
        self.records.append(row)
        if self.journal is not None:
            with open(self.journal, "a") as f:  # one short line per write: appends stay whole
                f.write(json.dumps({"worker": self.worker, **row}) + "\n")

    def recover(self, worker):
        """The journalled records of a worker that died (its own report never came)."""
        self.lost.append(worker)
        if self.journal is None or not self.journal.exists():
            return
        for line in self.journal.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short when the worker died
                continue
            if row.pop("worker", None) == worker:
                self.records.append(row)

    def table(self):
        """Markdown: implementation x pass rows, one column per set, cells
        verified / refused / failed (GPU builds: compiled / failed)."""
        sets = sorted({_column(r) for r in self.records}, key=_set_order)
        rows = sorted({(_row_name(r), r["pass"]) for r in self.records},
                      key=lambda k: (k[1] != "fwd", k[1], k[0]))
        counts = {}
        for r in self.records:
            cell = counts.setdefault((_row_name(r), r["pass"], _column(r)), {})
            cell[r["outcome"]] = cell.get(r["outcome"], 0) + 1
        sizes = {}  # the distinct layers (geometry and batch) of each column
        for r in self.records:
            sizes.setdefault(_column(r), set()).add((r["layer"], r["geometry"]))
        lines = ["| implementation | pass | "
                 + " | ".join(f"{s} ({len(sizes[s])})" for s in sets) + " |",
                 "|---|---|" + "---:|" * len(sets)]
        for impl, pass_ in rows:
            cells = []
            for s in sets:
                c = counts.get((impl, pass_, s))
                if not c:
                    cells.append("")
                elif s == "nvcc":
                    cells.append(f"{c.get('compiled', 0)} / {c.get('failed', 0)}")
                else:
                    cells.append(f"{c.get('verified', 0)} / {c.get('refused', 0)} / "
                                 f"{c.get('failed', 0)}"
                                 + (f" ({c['deferred']} deferred)" if c.get("deferred") else ""))
            lines.append(f"| {impl} | {pass_} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def time_summary(self, slowest=10):
        """Markdown: where the tier's time went (build and check of each case)."""
        timed = [r for r in self.records if r.get("seconds") not in ("", None)]
        if not timed:
            return ""
        per_impl = {}
        for r in timed:
            key = (r["implementation"], r["pass"])
            per_impl[key] = per_impl.get(key, 0.0) + float(r["seconds"])
        total = sum(per_impl.values())
        lines = [f"\nTime: {total / 60:.1f} min of build and check over {len(timed)} cases "
                 "(summed over the workers). Per implementation, the most first: "
                 + ", ".join(f"{i} {p} {t / 60:.1f}" for (i, p), t in
                             sorted(per_impl.items(), key=lambda kv: -kv[1])) + " min.",
                 "", "Slowest cases:", ""]
        for r in sorted(timed, key=lambda r: -float(r["seconds"]))[:slowest]:
            lines.append(f"- {r['seconds']} s: {r['implementation']} on {r['set']}/"
                         f"{r['layer']} b{r['batch']} ({r['target']})")
        return "\n".join(lines) + "\n"

    def totals(self):
        out = {}
        for r in self.records:
            out[r["outcome"]] = out.get(r["outcome"], 0) + 1
        return out

    def write(self, folder, session):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "coverage.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.records[0]))
            writer.writeheader()
            writer.writerows(self.records)
        refusals = sorted({(r["implementation"], r["detail"]) for r in self.records
                           if r["outcome"] == "refused"})
        failures = [r for r in self.records if r["outcome"] == "failed"]
        meta = _metadata(session, self)
        text = io.StringIO()
        text.write("# Verification coverage\n\n")
        text.write(f"Written by `pytest {shlex.join(meta['args'])}` on {meta['date']}, commit "
                   f"{meta['git']['commit'][:10]}{' (dirty tree)' if meta['git']['dirty'] else ''}"
                   f", on {meta['device']} ({meta['cpu_vector_isa']}); {meta['minutes']:.1f} min."
                   "\n\n")
        if meta["exitstatus"] not in (0, 1) or meta["workers_lost"]:  # 1: a test failed
            text.write(f"**Incomplete**: pytest exit status {meta['exitstatus']}"
                       + (f", workers lost: {', '.join(meta['workers_lost'])}"
                          if meta["workers_lost"] else "") + ".\n\n")
        text.write("Each cell counts the layers (and batch sizes) of a set, whose number "
                   "heads its column: verified against "
                   "torch float64 / refused by the implementation (`supports`) / failed, and "
                   "in brackets the layers over the CPU budget of a slow CPU schedule "
                   "(deferred to the GPU campaign; `CPU_CHECK_GFLOP` in `tests/cases.py`). "
                   "The `nvcc` column counts GPU builds compiled for sm_90 / failed (compile "
                   "only where no GPU is usable). Sets: `cosmoflow` and `cosmoflow_mlperf` are "
                   "`convparams/`, the others are the tests' own shapes (`tests/cases.py`). "
                   "One row per case is in `coverage.csv`.\n\n")
        text.write(self.table() + "\n")
        totals = self.totals()
        text.write("\nTotals: " + ", ".join(f"{totals.get(o, 0)} {o}" for o in self.OUTCOMES)
                   + ".\n")
        if refusals:
            text.write("\nRefusals:\n\n")
            for impl, reason in refusals:
                text.write(f"- {impl}: {reason}\n")
        deferred = {}
        for r in self.records:
            if r["outcome"] == "deferred":
                deferred.setdefault(r["implementation"], []).append(r)
        if deferred:
            text.write("\nDeferred (over the CPU budget):\n\n")
            for impl, rows in sorted(deferred.items()):
                text.write(f"- {impl}: {len(rows)} cases, "
                           + ", ".join(f"{r['set']}/{r['layer']} b{r['batch']}" for r in rows)
                           + "\n")
        if failures:
            text.write("\nFailures:\n\n")
            for r in failures:
                text.write(f"- {r['implementation']} on {r['set']}/{r['layer']} "
                           f"b{r['batch']} ({r['target']}): {r['detail']}\n")
        text.write(self.time_summary())
        (folder / "coverage.md").write_text(text.getvalue())
        (folder / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
        return folder / "coverage.md"


def _column(record):
    """The table's column of a record: its set, on the GPU marked as such."""
    gpu = record["target"] == "gpu" and record["set"] != "nvcc"
    return f"{record['set']} (GPU)" if gpu else record["set"]


def _set_order(name):
    order = ["cosmoflow_mlperf", "cosmoflow", "odd", "aniso", "tuned", "border", "nvcc"]
    return (order.index(name) if name in order else len(order), name)


def _git_state():
    from convbench.results.writer import git_commit
    state = git_commit(ROOT)
    return dict(state, commit=state.get("commit") or "unknown")


def _row_name(record):
    """A table row's implementation: its name, with the precision where not float32."""
    dtype = record.get("dtype", "float32")
    return record["implementation"] + ("" if dtype == "float32" else f" ({dtype})")


def _metadata(session, coverage):
    import dace
    import torch
    return {"args": list(session.config.invocation_params.args),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "minutes": (time.time() - coverage.started) / 60,
            "git": coverage.git,
            "device": devices.describe("gpu" if devices.gpu_usable() else "cpu"),
            "cpu_vector_isa": widest_isa(),  # the kernels are compiled for it
            "host": platform.node(), "cores": os.cpu_count(),
            "versions": {"python": platform.python_version(), "dace": dace.__version__,
                         "torch": torch.__version__},
            "totals": coverage.totals(),
            # interrupted (2), an internal error (3) or workers lost: part of the tier only
            "exitstatus": coverage.exitstatus,
            "workers_lost": list(coverage.lost),
            # a raised CPU budget (tests/cases.py RAISE_BUDGET), where one was set
            "cpu_check_gflop": os.environ.get("CONVBENCH_CPU_CHECK_GFLOP")}


@pytest.fixture(scope="session")
def coverage(request):
    """The session's :class:`Coverage`: ``coverage.record(case, outcome, detail)``."""
    return request.config.stash[_COVERAGE]


def pytest_sessionfinish(session, exitstatus):
    cov = session.config.stash[_COVERAGE]
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its controller writes the table
        workeroutput["coverage"] = cov.records
        return
    out = session.config.getoption("--coverage-out")
    cov.exitstatus = int(exitstatus)
    if cov.records and out:
        cov.written = cov.write(out, session)
    if cov.journal is not None and cov.written:
        cov.journal.unlink(missing_ok=True)  # its records are in the table now


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker finished; keep its coverage records (a worker
    that died sends none: the table then says so)."""
    cov = node.config.stash[_COVERAGE]
    output = getattr(node, "workeroutput", None)
    if output is None:
        cov.recover(str(node.gateway.id))
    else:
        cov.records.extend(output.get("coverage", []))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    cov = config.stash[_COVERAGE]
    if cov.records:
        totals = cov.totals()
        line = "coverage: " + ", ".join(f"{totals[o]} {o}" for o in cov.OUTCOMES if o in totals)
        written = getattr(cov, "written", None)
        terminalreporter.write_line(line + (f" (table: {written})" if written else ""))


# -- helpers ----------------------------------------------------------------------------------

@pytest.fixture
def write_csv(tmp_path):
    def write(text, name="layers.csv"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


@functools.lru_cache(maxsize=None)
def load_script(name):
    """A script of ``scripts/`` as a module, so that tests call its ``main(argv)`` in this
    process instead of paying for a new interpreter and its imports."""
    path = ROOT / "scripts" / name
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process(module, capsys):
    """``call(*args)``: ``module.main(args)`` in this process, with its exit status and
    what it printed, as ``subprocess.run`` would return them."""
    def call(*args):
        status = module.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return types.SimpleNamespace(returncode=status, stdout=out, stderr=err)
    return call


def assert_usage_error(result, *words, prefix=""):
    """Exit status 2 and one line on stderr (starting with ``prefix``, holding ``words``),
    no traceback anywhere; returns the line."""
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
