"""A whole campaign: its options, its plan as text, and the run of every phase."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from convbench.base import tables
from convbench.base.errors import UsageError, check_at_least, check_choice
from .folder import Folder, _now
from .phases import (identity, measure_ceilings, roofline_rows, run_builds, run_end2end,
                     run_gpu_tests, run_roofline)
from .plan import (BUDGET_S, BUDGET_WITH, CALL_SETUP_S, DEFAULT_TIMING, PHASES, TARGETS, TIERS,
                   TIER_SKIPS, TUNE_TIMING, Case, estimate, plan_cases, end2end_runs)
from .report import update_index, write_table
from .worker import _project_root, run_cases


@dataclasses.dataclass
class Options:
    tier: str = "smoke"
    target: str = "gpu"
    out: Optional[str] = None
    resume: bool = False
    cachedir: Optional[str] = None
    workers: int = 0
    iterations: Optional[int] = None
    warmup: Optional[int] = None
    time_limit: float = 2.0
    case_timeout: float = 0.0
    planted: Optional[bool] = None
    isolate: bool = False
    events: str = "auto"
    skip: Sequence[str] = ()
    time_budget: Optional[float] = None
    archive: Optional[str] = None
    threads: Optional[int] = None
    seed: int = 0
    #: Where the tune tier reads the verdicts of the tune space (``space.json``).
    space: Optional[str] = None

    def resolved(self) -> "Options":
        o = dataclasses.replace(self)
        timing = TUNE_TIMING if o.tier == "tune" else DEFAULT_TIMING
        o.iterations = timing["iterations"] if o.iterations is None else o.iterations
        o.warmup = timing["warmup"] if o.warmup is None else o.warmup
        o.skip = tuple(dict.fromkeys(tuple(o.skip) + TIER_SKIPS.get(o.tier, ())))
        o.workers = o.workers or (os.cpu_count() or 1)
        o.case_timeout = o.case_timeout or (90.0 if o.target == "gpu" else 120.0)
        o.planted = (o.target == "cpu") if o.planted is None else o.planted
        if o.events == "auto":
            from convbench.timing.timers import cupy_problem
            o.events = "cupy" if o.target == "gpu" and cupy_problem() is None else "torch"
        o.cachedir = o.cachedir or str(_project_root() / ".cache" / f"campaign-{o.target}")
        return o


def default_out(target: str, tier: str = "core") -> Path:
    from convbench.timing import devices
    if target == "cpu":
        name = devices.describe(target).split(" (")[0]
    else:
        import torch
        name = torch.cuda.get_device_name()
    slug = "-".join("".join(ch if ch.isalnum() else " " for ch in name).split())
    base = Path("results/gpu") if target == "gpu" else Path("outputs/campaign")
    suffix = f"_{tier}" if tier in ("tune", "steps") else ""
    return base / f"{time.strftime('%Y-%m-%d')}_{slug}{suffix}"


def check_options(o: Options) -> None:
    check_choice("--target", o.target, TARGETS, "target")
    check_choice("--tier", o.tier, TIERS, "tier")
    bad = [p for p in o.skip if p not in PHASES]
    if bad:
        raise UsageError(f"--skip: unknown phase(s) {', '.join(bad)} (phases: {', '.join(PHASES)})")
    if o.events not in ("auto", "cupy", "torch"):
        raise UsageError(f"--events: choose from auto, cupy, torch, got '{o.events}'")
    check_at_least(("--iterations", 1 if o.iterations is None else o.iterations, 1),
                   ("--warmup", 0 if o.warmup is None else o.warmup, 0),
                   ("--workers", o.workers, 0))
    for flag, value in (("--time-limit", o.time_limit), ("--time-budget", o.time_budget),
                        ("--case-timeout", o.case_timeout or 1)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag}: must be a positive number of seconds, got {value}")


def _estimate(o: Options, cases: Sequence[Case], cores: int):
    layers = {(c.layer_set, c.layer.name, c.layer.batch, str(c.pass_)): None
              for c in cases if not c.planted}
    o = o.resolved() if o.iterations is None or o.warmup is None else o
    return estimate(cases, o.target, cores, o.iterations, o.warmup, o.time_limit, o.cachedir,
                    roofline_layers=len(roofline_rows(layers)),
                    skip=tuple(o.skip) + TIER_SKIPS.get(o.tier, ()), runs=end2end_runs(o.tier))


def format_plan(o: Options, cases: Sequence[Case]) -> str:
    """The dry run's text: cases, builds, estimated host minutes per phase and per call,
    and the device-time budget (for the tune tier, with the core tier's plan beside it)."""
    cores = o.workers or (16 if o.target == "gpu" else (os.cpu_count() or 1))
    est = _estimate(o, cases, cores)
    groups = Counter(c.group for c in cases)
    budget = BUDGET_S[o.tier]
    shared = BUDGET_WITH.get(o.tier)
    other = None
    if shared:
        other_o = dataclasses.replace(o, tier=shared, iterations=None, warmup=None, skip=())
        other = _estimate(other_o, plan_cases(shared, o.target, False), cores)
    minutes = [(p, f"{est.phases[p] / 60:.1f}") for p in PHASES]
    lines = [f"Campaign plan: tier {o.tier}, target {o.target}, {len(cases)} cases ("
             + ", ".join(f"{n} {g}" for g, n in groups.items()) + f"), {est.builds} builds.",
             f"Builds: {est.build_seconds:.0f} s each ({est.build_source}), {cores} at a time "
             f"on the host's {cores} cores.", "",
             tables.markdown(["phase", "estimated host minutes"],
                             minutes + [("**run**", f"**{est.run_s / 60:.1f}**")]), ""]
    lines += [f"call {i}: {', '.join(call)}" for i, call in enumerate(est.calls, 1)]
    total = est.total_s + (other.total_s if other else 0.0)
    lines += [f"device time: {len(est.calls)} call(s) x {CALL_SETUP_S / 60:.1f} min set-up "
              f"(machine start, wheel install) + {est.run_s / 60:.1f} min run = "
              f"{est.total_s / 60:.1f} min"
              + (f", plus the {shared} tier's {other.total_s / 60:.1f} min in "
                 f"{len(other.calls)} call(s) = {total / 60:.1f} min" if other else "")
              + f"; budget {budget / 60:.0f} min: "
              + ("fits" if total <= budget else "DOES NOT FIT"), "", "Cases:"]
    lines += [f"  {c.id}  [{c.group}]" for c in cases]
    return "\n".join(lines)


def run_campaign(o: Options, say: Callable[[str], None] = print) -> int:
    """Run (or resume) a campaign; 0 when every phase ran, 3 when the time budget left
    cases or phases for ``--resume``."""
    from convbench.timing import devices
    check_options(o)
    o = o.resolved()
    if o.target == "gpu" and devices.gpu_problem() is not None:
        raise UsageError(f"--target gpu: {devices.gpu_problem()} (rehearse with --target cpu)")
    cases = plan_cases(o.tier, o.target, o.planted, o.space)
    out = Path(o.out) if o.out else default_out(o.target, o.tier)
    if (out / "campaign.json").exists():
        if not o.resume:
            raise UsageError(f"--out {out}: a campaign is there already; add --resume to go on "
                             "with it, or name another folder")
        old = json.loads((out / "campaign.json").read_text())
        if (old.get("tier"), old.get("target")) != (o.tier, o.target):
            raise UsageError(f"--resume: {out} holds a {old.get('tier')} campaign on "
                             f"{old.get('target')}, not {o.tier} on {o.target}")
    folder = Folder(out)
    deadline = time.monotonic() + o.time_budget if o.time_budget else None
    opts = dict(dataclasses.asdict(o), worker_start_timeout=180.0,
                cases_per_worker=1 if o.isolate else 1 << 30)
    say(f"campaign: tier {o.tier}, target {o.target}, {len(cases)} cases -> {out}/")
    info = (folder.read_json("identity/versions.json", {}) if o.resume and folder.done("identity")
            else identity(folder, o.target))
    meta = folder.read_json("campaign.json") or {"tier": o.tier, "target": o.target,
                                                  "started": _now(), "runs": []}
    meta.update({"device": info.get("device"), "git": info.get("git"),
                 "cases": [c.id for c in cases], "options": dataclasses.asdict(o)})
    meta["runs"].append({"at": _now(), "command": sys.argv, "git": info.get("git")})
    folder.write_json("campaign.json", meta)
    folder.mark("identity", "done", info.get("device", ""))
    folder.archive(o.archive)

    def table() -> None:
        try:
            write_table(folder, o.target, meta)
        except Exception as err:  # noqa: BLE001 - the results are on disk; say why not
            say(f"[table] failed: {type(err).__name__}: {err}")

    def recorded(name: str) -> bool:
        # The cases phase is done while every planned case has its record: a plan that
        # grew (--planted on a later call) runs the new cases.
        return o.resume and folder.done(name) and not (
            name == "cases" and any(not folder.case_path(c).exists() for c in cases))

    def phase(name: str, body: Callable[[], dict]) -> None:
        if name in o.skip:
            if recorded(name):  # a later call's --skip keeps what an earlier call measured
                say(f"[{name}] recorded already; --skip leaves it as it is")
                return
            folder.mark(name, "skipped", f"the {o.tier} tier leaves it out"
                        if name in TIER_SKIPS.get(o.tier, ()) else "--skip")
            return
        if recorded(name):
            say(f"[{name}] recorded already")
            return
        if deadline is not None and time.monotonic() > deadline:
            say(f"[{name}] time budget spent: left for --resume")
            return
        say(f"[{name}] ...")
        t0 = time.perf_counter()
        try:
            result = body() or {}
            status, detail = result.get("status", "done"), result.get("detail", "")
        except Exception as err:  # noqa: BLE001 - a phase's failure is recorded
            status, detail = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
        folder.mark(name, status, detail, time.perf_counter() - t0)
        say(f"[{name}] {status} {detail}".rstrip())
        table()  # the table so far, so that a call cut off still brings one back
        folder.archive(o.archive)

    def limit(default: float) -> float:  # less where the budget ends sooner
        if deadline is None:
            return default
        return min(default, max(60.0, deadline + 60.0 - time.monotonic()))

    def ceilings_phase():
        c = measure_ceilings(folder, o.target)
        return {"detail": f"SGEMM {c['peak_gflops']:.0f} GFLOP/s, copy {c['bandwidth_gbs']:.0f} GB/s"
                + (f", TF32 {c['tf32_gflops']:.0f}, FP16 {c['fp16_gflops']:.0f} GFLOP/s"
                   if c.get("tf32_gflops") else ", tensor cores: not measured")
                + (f"; WARNING: {c['warning']}" if c.get("warning") else "")}

    def cases_phase():
        left = run_cases(folder, cases, build_failures, opts, say, deadline,
                         lambda: folder.archive(o.archive))
        counts = Counter(rec["status"] for rec in folder.records())
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        return {"status": "partial" if left else "done",
                "detail": detail + (f"; {left} left" if left else "")}

    phase("ceilings", ceilings_phase)
    # Builds are redone on every call, since a fresh host keeps nothing; not phase(), which
    # would skip them on --resume.  Recorded cases need none.
    build_failures: Dict[str, str] = {}
    if "builds" not in o.skip:
        t0 = time.perf_counter()
        say("[builds] ...")
        try:
            todo = [c for c in cases if not folder.case_path(c).exists()]
            planted = [c for c in todo if c.planted][:1]  # the planted cases share one build
            build_failures = run_builds(folder, [c for c in todo if not c.planted] + planted,
                                        o.cachedir, o.workers, say)
            if planted and planted[0].id in build_failures:
                build_failures.update(dict.fromkeys(
                    [c.id for c in cases if c.planted], build_failures[planted[0].id]))
            status, detail = "done", f"{len(build_failures)} case(s) without a build"
        except Exception as err:  # noqa: BLE001 - the workers build on a miss instead
            status, detail = "failed", f"{type(err).__name__}: {err}".splitlines()[0]
            say(f"[builds] failed ({type(err).__name__}: {err}); cases build on a miss")
        folder.mark("builds", status, detail, time.perf_counter() - t0)
    phase("cases", cases_phase)
    phase("end2end", lambda: run_end2end(folder, o.target, o.cachedir, limit, say,
                                         runs=end2end_runs(o.tier),
                                         campaign_winners=o.tier != "steps",
                                         time_left=None if deadline is None else
                                         lambda: deadline - time.monotonic()))
    phase("tests", lambda: run_gpu_tests(folder, o.target, limit(540.0), o.workers))
    phase("roofline", lambda: run_roofline(folder, o.target, o.cachedir, o.workers,
                                           limit(420.0), say))
    folder.mark("table", "done", "README.md, summary.csv")
    table()
    if out.parent.name == "gpu":
        update_index(out.parent)
    folder.archive(o.archive)
    phases = folder.state()["phases"]
    incomplete = [p for p in PHASES if p not in o.skip and phases.get(p, {}).get("status")
                  not in ("done", "not measured", "failed")]
    say(f"campaign: {out}/README.md" + (f"; not finished: {', '.join(incomplete)} "
                                         "(run again with --resume)" if incomplete else ""))
    return 3 if incomplete else 0
