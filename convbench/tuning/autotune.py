"""Quick autotuning on the machine at hand (``convbench tune --quick SET``,
``cosmoflow_end2end.py --autotune``): per layer and pass, the candidate implementations
and a small neighbourhood of their parameters, each verified first and then timed; the
winners are stored under this machine's key in the tuning file, where later runs find
them without tuning (``best``: the fastest implementation of the pass; ``entries``: its
parameters and those of each candidate that was timed).

The candidates of a pass are the CPU implementations that declare a rule
(:class:`convkernels.declarations.Rule`), build in float32 (what it times) and support the
layer, whether their rule applies or not: the rules guess, the autotune measures.  The neighbourhood of one is its parameters
as they stand here (this machine's entry, else the nearest machine's), its defaults
(sized to this CPU's ISA) and the entries other machines stored for the layer, at most
:data:`NEIGHBOURS` in all, less those whose micro-tile would spill.

It is bounded by a budget in minutes: builds run first (in parallel, as the precompile
step does) and stop being started when :data:`BUILD_SHARE` of it is spent (the few
already running finish); timing then stops at the first layer and pass it cannot start
before the budget's end.  What was measured by then is stored, and
what was left is said.  docs/tuned.md describes it with the times measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from convbench import registry
from convbench.build import cache, toolchain, tuned
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convkernels.layouts import Pass

#: Parameter configurations per implementation and layer, at most.
NEIGHBOURS = 3
#: Default budget in minutes (the bound the issue set for MLPerf 64^3, batch 2, 2 cores).
DEFAULT_BUDGET_MIN = 10.0
#: Timed calls per configuration and round, after one warm-up call; rounds in turn.
SAMPLES, ROUNDS = 5, 2
#: The share of the budget builds may take; the rest is kept for timing.
BUILD_SHARE = 0.7


def parse_budget(text, flag: str = "--budget") -> float:
    """Minutes, a positive finite number (else a usage error naming ``flag``)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag}: expected minutes (a positive number), got {text!r}") from None
    if not (0 < value < float("inf")):
        raise UsageError(f"{flag}: expected minutes (a positive number), got {text!r}")
    return value


@dataclasses.dataclass
class Candidate:
    impl: registry.Implementation
    layer: Layer
    params: registry.Params
    built: bool = False
    ok: Optional[bool] = None
    samples_ms: List[float] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def median_ms(self) -> Optional[float]:
        return statistics.median(self.samples_ms) if self.samples_ms else None

    def label(self) -> str:
        return f"{self.impl.name} " + ",".join(f"{k}={v}" for k, v in self.params.items())


def candidates(layer: Layer, pass_: Pass, target: str = "cpu") -> List[Candidate]:
    """The implementations of ``pass_`` with a rule on ``target`` that support ``layer``,
    each with up to :data:`NEIGHBOURS` configurations (module docstring)."""
    found: List[Candidate] = []
    for impl in registry.all_implementations().values():
        if (impl.pass_ != Pass(pass_) or impl.rule(target) is None
                or "float32" not in impl.precisions):  # the autotune times float32
            continue
        configs = [tuned.tuned_params(impl, layer, target)]
        configs += [p for p in [impl.resolve_params(), *tuned.params_elsewhere(
            impl, layer, target)] if p not in configs]
        configs, _ = tuned.within_registers(impl, layer, [
            p for p in configs if not impl.unsupported_reason(layer, p)])
        found.extend(Candidate(impl, layer, p) for p in configs[:NEIGHBOURS])
    return found


def tune(work: Sequence[Tuple[Layer, Pass]], budget_min: float, cachedir=None,
         threads: Optional[int] = None, workers: int = 2, store: bool = True,
         heap: str = "warm", say: Callable[[str], None] = print) -> Dict[str, object]:
    """Autotune each ``(layer, pass)`` of ``work`` within ``budget_min`` minutes; store the
    winners (``store``) under this machine's key; time under the heap policy ``heap``
    (:mod:`convbench.timing.heap`, the run's own).  Returns a summary: ``seconds``,
    ``winners`` (``"<layer key>/<pass>" -> (implementation, params, ms)``), ``left`` (the
    layer-passes not measured) and ``candidates`` (every one, as records)."""
    import torch

    from convbench.experiment.pipeline import Experiment, TimingOptions
    from convbench.results.writer import device_metadata
    t0 = time.perf_counter()
    deadline = t0 + budget_min * 60
    build_deadline = t0 + BUILD_SHARE * budget_min * 60
    plan = [(layer, p, candidates(layer, p)) for layer, p in work]
    total = sum(len(c) for _, _, c in plan)
    say(f"autotune: {len(plan)} layer-passes, {total} candidates (implementations with a "
        f"rule x up to {NEIGHBOURS} configurations); budget {budget_min:g} min: builds, "
        f"then {ROUNDS} rounds of 1 + {SAMPLES} calls each, verified first")
    def key(impl_name, layer, params):
        return impl_name, layer.key(), tuple(sorted(params.items()))

    by_job: Dict[tuple, list] = {}
    jobs = []
    for _, _, cands in plan:
        for c in cands:
            k = key(c.impl.name, c.layer, c.params)
            if k not in by_job:
                jobs.append(cache.Job(c.impl.name, c.layer, "cpu", dict(c.params)))
            by_job.setdefault(k, []).append(c)
    done = 0
    builds = cache.fill(jobs, cachedir or toolchain.default_cachedir(), workers)
    try:
        for job, outcome, seconds, message in builds:
            done += 1
            for c in by_job[key(job.impl, job.layer, job.params)]:
                c.built, c.note = outcome != "failed", message if outcome == "failed" else ""
            say(f"  build {done}/{len(by_job)} {job.impl} {job.layer.name}: {outcome}"
                f" {seconds:.1f}s" + (f" ({message})" if outcome == "failed" else ""))
            if time.perf_counter() > build_deadline and done < len(by_job):
                say(f"  {BUILD_SHARE:.0%} of the budget spent building: the builds not "
                    f"started ({len(by_job) - done} at most) are left out")
                break
    finally:
        builds.close()
    exp = Experiment([], [], "cpu", policy="reuse", cachedir=cachedir, threads=threads,
                     timing=TimingOptions(warmup=1, iterations=SAMPLES, heap=heap))
    machine = {"cpu": device_metadata("cpu")["cpu"], "threads": torch.get_num_threads()}
    winners: Dict[str, object] = {}
    left: List[str] = []
    for i, (layer, p, cands) in enumerate(plan, 1):
        name = f"{layer.name} {p}"
        ready = [c for c in cands if c.built]
        if time.perf_counter() > deadline or not ready:
            left.append(name)
            continue
        truth = exp.truth(p, layer)
        try:
            for r in range(ROUNDS):
                for c in (ready if r % 2 == 0 else ready[::-1]):
                    if c.ok is False:
                        continue
                    case = exp.run_case(c.impl, layer, params=c.params, truth=truth,
                                        references=False, time_wrong=False, catch=True)
                    c.ok = bool(case.checks) and case.checks[0].ok and case.status != "error"
                    if c.ok:
                        c.samples_ms.extend(case.measurements[0].timing.samples_ms)
                    else:
                        c.note = case.reason or (case.checks[0].summary() if case.checks else "")
        finally:
            truth.drop()
        timed = [c for c in ready if c.ok and c.samples_ms]
        if not timed:
            say(f"  [{i}/{len(plan)}] {name}: no candidate verified")
            left.append(name)
            continue
        best = min(timed, key=lambda c: c.median_ms)
        shown = "  ".join(f"{c.impl.name} {c.median_ms:.2f}" for c in
                          sorted(timed, key=lambda c: c.median_ms)[:4])
        say(f"  [{i}/{len(plan)}] {name}: {best.label()} {best.median_ms:.2f} ms  "
            f"(ms: {shown})")
        winners[f"{layer.key()}/{p}"] = (best.impl.name, dict(best.params), best.median_ms)
        if store:
            for impl in {c.impl.name: c.impl for c in timed}.values():
                own = min((c for c in timed if c.impl is impl), key=lambda c: c.median_ms)
                tuned.store("cpu", impl.name, layer, dict(own.params), machine)
            tuned.store_best("cpu", str(p), layer, best.impl.name, machine)
    seconds = time.perf_counter() - t0
    say(f"autotune: {len(winners)} of {len(plan)} layer-passes measured in {seconds:.0f} s"
        + (f"; left (budget or no verified candidate): {', '.join(left)}" if left else "")
        + (f"; stored in {tuned.tuning_file('cpu')} under '{tuned.machine_id()}'"
           if store and winners else ""))
    records = [{"layer": c.layer.key(), "pass": str(c.impl.pass_), "implementation": c.impl.name,
                "params": dict(c.params), "built": c.built, "ok": c.ok,
                "median_ms": c.median_ms, "samples_ms": c.samples_ms, "note": c.note}
               for _, _, cs in plan for c in cs]
    return {"seconds": seconds, "budget_min": budget_min, "winners": winners, "left": left,
            "candidates": records}
