"""The plan of a campaign: tiers, cases, and the device-time estimate."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from convbench.base.errors import UsageError, check_choice
from convbench.layersets.layer import Layer
from convbench.experiment.case import LayerCase
from convbench.layersets.sets import load_layers
from .folder import _load


TIERS = ("smoke", "core", "full", "tune", "precision", "steps")
#: The precision tier's cases of these implementations, to fit its 15 device-minutes:
#: (layer set, precision).  The Hopper kernels of the forward and the data gradient
#: (``implicitGemmWGMMA*``) run in float16 and TF32 on every layer, in bfloat16 (the
#: float16 code with another MMA type) on the training step's; the Hopper filter gradient
#: in float16 and TF32 on the training step's layers (its transposed 16-bit staging and
#: its K-major TF32 one are different code).  The mma.sync kernels, which an earlier
#: campaign timed in every precision (``results/gpu/2026-11-28_NVIDIA-H200``), are left
#: to the full tier, which times every precision of every tensor-core kernel on every
#: layer.
PRECISION_ONLY = {"implicitGemmMMA": set(), "implicitGemmMMABwdData": set(),
                  "implicitGemmMMABwdFilter": set(),
                  **{name: {(s, p) for s in ("cosmoflow", "cosmoflow_mlperf")
                            for p in ("float16", "float32-tf32")}
                     | {("cosmoflow_mlperf", "bfloat16")}
                     for name in ("implicitGemmWGMMA", "implicitGemmWGMMABwdData")},
                  "implicitGemmWGMMABwdFilter": {("cosmoflow_mlperf", "float16"),
                                                 ("cosmoflow_mlperf", "float32-tf32")}}
#: The precision tier's candidates beside the defaults: other tiles and stages of the
#: Hopper kernels (their tune space, ``search_space``), in float16 on these MLPerf layers
#: (as many as fit beside the three passes' defaults: the data gradient runs the forward's
#: main loop, so it tries one tile of the forward's two).
PRECISION_CANDIDATES = {
    "implicitGemmWGMMA": ({"CTAtileN": 256, "stages": 4}, {"CTAtileN": 128, "stages": 3}),
    "implicitGemmWGMMABwdData": ({"CTAtileN": 256, "stages": 4},),
    "implicitGemmWGMMABwdFilter": ({"CTAtileN": 256, "stages": 3},),
}
PRECISION_CANDIDATE_LAYERS = ("conv3", "conv4")
PHASES = ("identity", "ceilings", "builds", "cases", "end2end", "tests", "roofline", "table")
TARGETS = ("gpu", "cpu")
PLANTED = ("crash", "hang", "wrong")

#: The smoke tier's layer: 256 channels on 4^3 (one output tile), cheap on both targets.
SMOKE_LAYER = ("cosmoflow", "conv7", 1)
#: The core tier's layer for every implementation x pass: the smallest spatial size (256
#: channels on 4^3 at the original batch), so that each costs about its build.  The
#: padded and few-channel layers come with the ``best-of`` implementations, which run on
#: every CosmoFlow layer (MLPerf conv1 at batch 2, the second layer here until the device
#: time shrank to 15 minutes in all, is in the full tier).
REPRESENTATIVE = (("cosmoflow", "conv7", 16),)
#: The batch sizes of the original work (V100).
ORIGINAL_BATCH = {"cosmoflow": 16, "cosmoflow_mlperf": 8}
# The core tier also runs the implementations that declare ``best-of`` on every CosmoFlow
# layer at the original batch; the best of them that verifies is "the best DaCe
# implementation" of the layer.
PLANTED_IMPL = "implicitGemmNCDHW"
#: A planted hang's time limit: long enough to start, short enough for a rehearsal.
PLANTED_HANG_TIMEOUT_S = 8.0

#: The original work's forward ratios, DaCe time over cuDNN time on a V100 (thesis
#: "Optimizing GPU Convnets", DaCe 0.14): the range it reports per set and batch.
V100_RATIOS = {"cosmoflow_mlperf": "2.2x-4.9x (batch 8)", "cosmoflow": "2.5x-48x (batch 16)"}

#: Seconds per build where no cache has measured them: on this project's 2-core
#: development machine (README, "Measured here").
DEFAULT_BUILD_SECONDS = {"cpu": 5.0, "gpu": 50.0}
#: Assumed rates for the run-time estimate (GFLOP/s): pessimistic for DaCe (the original
#: work was up to 48x slower than cuDNN), the vendor libraries at a fraction of peak.
ESTIMATE_GFLOPS = {"gpu": {"dace": 1000.0, "ref": 15000.0},
                   "cpu": {"dace": 15.0, "ref": 80.0}}
#: Per-case overhead (s): loading the build, the reference, verification, the result file.
CASE_OVERHEAD_S = {"gpu": 1.5, "cpu": 0.5}
WORKER_START_S = 4.0
#: The end-to-end phase (tune tier): the builds its layers miss (one round of the host's
#: cores: the winners are in the cache already), the check of both models, and the timed
#: steps.  The CPU rehearsal runs it at 32^3.
END2END_S = {"gpu": 150.0, "cpu": 120.0}
#: Device set-up per call (machine start, wheel install), from the device tool's notes.
CALL_SETUP_S = 120.0
#: One call's command limit, and the share of it the plan fills.
CALL_LIMIT_S = 600.0
CALL_FILL = 0.9
#: Phases a tier leaves out: smoke is the quick check; tune times configurations, then the
#: training step with the winners (end2end).  precision times the tensor-core kernels in
#: each of their precisions, then the training step in float16 (:data:`END2END_DTYPE`).
#: core leaves out the GPU tests and the roofline too (about 5 of its minutes): full runs
#: them.
TIER_SKIPS = {"smoke": ("end2end", "tests", "roofline"), "core": ("end2end", "tests", "roofline"),
              "full": ("end2end",), "tune": ("tests", "roofline"),
              "precision": ("tests", "roofline"),
              "steps": ("ceilings", "builds", "cases", "tests", "roofline")}
#: The training step's precision per tier (float32 where absent): the precision tier's
#: runs on the tensor cores in float16, against torch in float16 and torch's automatic
#: mixed precision.
END2END_DTYPE = {"precision": "float16"}
#: The steps tier: the training step alone, in FP32 (with torch.compile beside torch's
#: eager formats, and the fused blocks: not yet the GPU's default), FP16 and BF16 (each
#: with torch's mixed precision beside), the project's tuned entries and the network's
#: default kernels; each run its own folder (``end2end``, ``end2end_float16``,
#: ``end2end_bfloat16``), resumed run by run.
STEPS_RUNS = (("float32", ("--torch-compile", "--fuse")), ("float16", ()), ("bfloat16", ()))
#: What ``--torch-compile`` adds to a run: TorchInductor compiling the forward pass and
#: the training step in each of its processes (the first cold, the others from its
#: on-disk cache).  A guess until a GPU run records it (``torch_compile.first_call_ms``).
TORCH_COMPILE_S = {"gpu": 120.0, "cpu": 240.0}


def end2end_runs(tier: str) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """The training-step runs of ``tier``'s end2end phase: (precision, extra flags)."""
    if tier == "steps":
        return STEPS_RUNS
    return ((END2END_DTYPE.get(tier, "float32"), ()),)


def end2end_run_seconds(target: str, flags: Sequence[str]) -> float:
    return END2END_S[target] + (TORCH_COMPILE_S[target] if "--torch-compile" in flags else 0.0)
#: The whole campaign's device-time budget, set-up included: a lent GPU comes with 15
#: minutes in all, the machine's start counted.  full spans several windows.
BUDGET_S = {"smoke": 10 * 60.0, "core": 15 * 60.0, "full": 30 * 60.0, "tune": 15 * 60.0,
            "precision": 15 * 60.0, "steps": 15 * 60.0}
#: Tiers whose budget is shared with another tier's plan (the dry run adds that plan):
#: none since tune took the end-to-end run, which with it fills a window of its own.
BUDGET_WITH: Dict[str, str] = {}
#: The tune tier: the implementations it times (the pipelined kernel of each pass, NDHWC,
#: the network's layout), and how many configurations per layer, the best-ranked first
#: (:func:`convbench.tuning.gpuspace.rank`), besides the defaults and the incumbents.  The older
#: spaces (``implicitGemmNCDHW``, ``implicitGemmNCDHWinplace``, ``implicitGemmsplitK``,
#: ``implicitGemmPipelinedNCDHW``) keep their tables and their tuned entries.
TUNE_PER_LAYER = {"implicitGemmPipelined": 2, "implicitGemmPipelinedBwdData": 2,
                  "implicitGemmPipelinedBwdFilter": 2}
#: The tune tier's layers on the GPU: those of the end-to-end training step
#: (``scripts/cosmoflow_end2end.py``'s defaults: MLPerf CosmoFlow at 128^3, batch 2), the
#: pass-layer pairs with the most work first, so that a window cut short has tuned what
#: weighs most in the step; the first layer's data gradient is left out, as the step
#: leaves it out (the network's input needs no gradient).
END2END = ("mlperf", 128, 2)
#: The tune tier's other layers: CosmoFlow v1 at its original batch, after the training
#: step's, with this many candidates per layer beside the defaults and incumbents.
TUNE_V1 = ("cosmoflow", 16)
TUNE_V1_PER_LAYER = 1
#: Timing of a tune case: fewer samples than core (a ranking, not the reported figure;
#: the winners are timed again by the next core campaign with the full count).
TUNE_TIMING = {"iterations": 20, "warmup": 3}
#: Timing of the other tiers' cases.
DEFAULT_TIMING = {"iterations": 50, "warmup": 5}


@dataclasses.dataclass(frozen=True)
class Case(LayerCase):
    """A campaign's case: its group in the plan, and how to run it."""

    group: str = "every-impl"
    #: Time the references (cuDNN, torch) too: once per layer and pass.
    time_refs: bool = True
    #: A planted failure: "crash", "hang" or "wrong" (the rehearsal's checks of the harness).
    planted: str = ""
    #: Parameters of a tune case, as sorted (name, value) pairs; empty: the tuned entry of
    #: this machine, else the implementation's defaults.
    params: Tuple[Tuple[str, int], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "params", tuple(sorted((str(k), int(v)) for k, v in self.params)))

    @property
    def id(self) -> str:
        text = f"{self.impl}.{self.layer_set}.{self.layer.name}.b{self.layer.batch}"
        if self.params:
            from convbench.tuning.gpuspace import tag
            text += f".{tag(dict(self.params))}"
        if self.precision != "float32":
            text += f".{self.precision}"
        return text + (f".planted-{self.planted}" if self.planted else "")

    def resolved_params(self):
        if self.params:
            return self.implementation.resolve_params(dict(self.params))
        return super().resolved_params()

    @property
    def refs_key(self) -> tuple:
        return self.layer_set, self.layer, self.pass_, self.precision



def _layer(layer_set: str, name: str, batch: int) -> Layer:
    for layer in load_layers(layer_set):
        if layer.name == name:
            return layer.with_batch(batch)
    raise UsageError(f"layer {name} is not in {layer_set}")


def plan_cases(tier: str, target: str, planted: bool, space_dir: Optional[os.PathLike] = None
               ) -> List[Case]:
    """The cases of ``tier`` on ``target`` (with the three planted ones if ``planted``;
    the tune tier reads the verdicts of the tune space from ``space_dir``)."""
    from .. import registry
    check_choice("--tier", tier, TIERS, "tier")
    impls = [n for n, i in registry.all_implementations().items() if target in i.targets]
    every = [SMOKE_LAYER] if tier == "smoke" else list(REPRESENTATIVE)
    pairs = [(impl, s, _layer(s, n, b), "every-impl", "") for s, n, b in every for impl in impls]
    sets = [(s, layer.with_batch(ORIGINAL_BATCH[s])) for s in ORIGINAL_BATCH
            for layer in load_layers(s)]
    if tier == "core":
        pairs += [(impl, s, layer, "best-of", "") for s, layer in sets
                  for impl in registry.members("best-of") if target in registry.get(impl).targets]
    elif tier == "full":
        pairs += [(impl, s, layer, "every-layer", "") for s, layer in sets for impl in impls]
    if tier in ("precision", "full"):
        # the tensor-core kernels (no IEEE float32) in each of their precisions, on every
        # layer: each against the vendors in the same precision
        if tier == "precision":
            pairs = []
        pairs += [(impl, s, layer, "precision", dtype) for s, layer in sets for impl in impls
                  if "float32" not in registry.get(impl).precisions
                  for dtype in registry.get(impl).precisions
                  if tier == "full" or impl not in PRECISION_ONLY
                  or (s, dtype) in PRECISION_ONLY[impl]]
    if tier == "precision":
        pairs += [(impl, s, layer, "precision", "float16", params) for s, layer in sets
                  if s == "cosmoflow_mlperf" and layer.name in PRECISION_CANDIDATE_LAYERS
                  for impl, candidates in PRECISION_CANDIDATES.items()
                  for params in candidates]
    if tier == "tune":
        return tune_cases(target, space_dir)
    if tier == "steps":  # the training steps alone (end2end phase)
        return []
    cases, seen, timed = [], set(), set()
    for impl, layer_set, layer, group, dtype, *given in pairs:  # given: a candidate's params
        params = tuple(sorted(given[0].items())) if given else ()
        precision = dtype or registry.get(impl).precisions[0]
        if (impl, layer_set, layer, precision, params) not in seen:
            seen.add((impl, layer_set, layer, precision, params))
            case = Case(impl, layer, layer_set, target, group=group, dtype=dtype,
                        params=params)
            cases.append(dataclasses.replace(case, time_refs=case.refs_key not in timed))
            timed.add(case.refs_key)
    if planted:
        s, n, b = SMOKE_LAYER
        cases += [Case(PLANTED_IMPL, _layer(s, n, b), s, target, group="planted",
                       time_refs=False, planted=kind)
                  for kind in PLANTED]
    return cases


def tune_cases(target: str, space_dir: Optional[os.PathLike] = None) -> List[Case]:
    """The tune tier: on the layers of the end-to-end training step (:data:`END2END`; on
    the CPU, the rehearsal, on the smoke layer), most work first, per implementation of
    :data:`TUNE_PER_LAYER`, its defaults, the configurations already tuned for the layer
    on any GPU (the incumbents, so that a new winner is never one slower than the last),
    and its best-ranked configurations that passed the resource filter."""
    from convbench import registry
    from convbench.tuning import gpuspace
    from convbench.build import tuned
    from convkernels.layouts import Pass
    passed = gpuspace.passed(Path(space_dir) if space_dir else gpuspace.DEFAULT_OUT)
    if target == "gpu":
        layers = [("cosmoflow_mlperf", layer) for layer in end2end_layers()]
        v1 = [(TUNE_V1[0], layer.with_batch(TUNE_V1[1])) for layer in load_layers(TUNE_V1[0])]
    else:
        layers, v1 = [(SMOKE_LAYER[0], _layer(*SMOKE_LAYER))], []
    # the training step's pairs first, most work first; then the v1 set's
    pairs = [p for group in (layers, v1) for p in sorted(
        ((layer.flops(), layer_set, layer, impl_name) for layer_set, layer in group
         for impl_name in TUNE_PER_LAYER), key=lambda p: -p[0])]
    cases, timed = [], set()
    first = layers[0][1].name if target == "gpu" else None
    for _, layer_set, layer, impl_name in pairs:
        configs = passed.get(impl_name)
        impl = registry.get(impl_name)
        if configs is None or target not in impl.targets:
            continue
        if layer.name == first and impl.pass_ == Pass.BWD_DATA:
            continue
        ranked = gpuspace.rank(impl_name, layer, configs)
        if not ranked:
            continue
        # the defaults, the incumbents, then the best-ranked candidates: TUNE_PER_LAYER
        # cases beside the defaults, incumbents first
        # (every incumbent is kept, passed the resource filter or not: it is verified
        # and timed like the rest; one whose names the implementation no longer has
        # is left out)
        chosen = [dict(impl.resolve_params({}))]
        for incumbent in tuned.entries_anywhere(impl_name, layer, "gpu"):
            try:
                params = dict(impl.resolve_params(incumbent, source="tuning/gpu.json"))
            except UsageError:
                continue
            if params not in chosen:
                chosen.append(params)
        per_layer = TUNE_V1_PER_LAYER if layer_set == TUNE_V1[0] else TUNE_PER_LAYER[impl_name]
        room = max(0, 1 + per_layer - len(chosen))
        # resolved, as the defaults and incumbents are (a parameter added since the space
        # was compiled takes its default)
        ranked = [dict(impl.resolve_params(p)) for p in ranked]
        chosen += [p for p in ranked if p not in chosen][:room]
        # split-K where the defaults' tiles leave SMs idle (the rule of splitK=0)
        split = split_candidate(impl, layer, chosen[0])
        if split and split not in chosen:
            chosen.append(split)
        for params in chosen:
            case = Case(impl_name, layer, layer_set, target, group="tune",
                        params=tuple(params.items()))
            cases.append(dataclasses.replace(case, time_refs=case.refs_key not in timed))
            timed.add(case.refs_key)
    return cases


def split_candidate(impl, layer: Layer, params) -> Optional[dict]:
    """``params`` with the automatic split (``splitK=0``) where ``impl`` has the parameter
    and its tiles on ``layer`` give fewer blocks than the rule aims at (so that the split
    changes the kernel), else None."""
    if "splitK" not in params or params["splitK"] == 0 or impl.pass_ == "bwd_filter":
        return None
    from convbench.tuning import gpuspace
    from convkernels.gpu.simt import tiles
    rows, cols, _ = gpuspace.gemm_shape(layer, impl.pass_)
    few = tiles.blocks(rows, cols, params["CTAtileM"], params["CTAtileN"]) < tiles.AUTO_BLOCKS
    return {**params, "splitK": 0} if few else None


def end2end_layers() -> List[Layer]:
    """The layers of the end-to-end training step the tune tier tunes for (:data:`END2END`),
    named as in ``cosmoflow_mlperf``."""
    from convbench.network import cosmoflow
    model, size, batch = END2END
    return cosmoflow.conv_layers(cosmoflow.MODELS[model], size, batch)


def measured_build_seconds(target: str, cachedir: Optional[os.PathLike]) -> Tuple[float, str]:
    """Median seconds per build of ``target``: in the manifests of ``cachedir`` (a build
    cache that has GPU builds in it, say), else (GPU) in the newest campaign folder under
    ``results/gpu/`` that recorded its builds (on the GPU host, all cores busy), else
    :data:`DEFAULT_BUILD_SECONDS`.  On the GPU the slowest host that recorded its builds
    counts: which GPU machine a task is lent is drawn by chance."""
    root = Path(cachedir) if cachedir else None
    manifests = (_load(m, {}) for m in (root.glob("*/manifest.json") if root else ()))
    times = sorted(sum(v for v in m.get("build_seconds", {}).values()
                       if isinstance(v, (int, float)))
                   for m in manifests if m.get("key", {}).get("target") == target)
    if len(times) >= 3:
        return times[len(times) // 2], f"median of {len(times)} builds in {root}"
    if target == "gpu":
        from convbench.build.toolchain import PROJECT_ROOT
        hosts = []
        for path in sorted((PROJECT_ROOT / "results" / "gpu").glob("*/builds.json")):
            times = sorted(b["seconds"] for b in (_load(path, {}) or {}).values()
                           if isinstance(b, dict) and b.get("outcome") == "built"
                           and isinstance(b.get("seconds"), (int, float)))
            if len(times) >= 3:
                hosts.append((times[len(times) // 2], len(times), path.parent.name))
        if hosts:
            median, count, name = max(hosts)
            return (median, f"median of {count} builds on the slowest GPU host of "
                    f"{len(hosts)} campaign(s), results/gpu/{name}")
    return DEFAULT_BUILD_SECONDS[target], "this project's measured build time (README)"


@dataclasses.dataclass
class Estimate:
    phases: Dict[str, float]
    calls: List[List[str]]
    build_seconds: float
    build_source: str
    cores: int
    builds: int

    @property
    def run_s(self) -> float:
        return sum(self.phases.values())

    @property
    def total_s(self) -> float:
        return self.run_s + CALL_SETUP_S * len(self.calls)


def _case_seconds(case: Case, iterations: int, warmup: int, time_limit: float) -> float:
    rates = ESTIMATE_GFLOPS[case.target]
    gflop = case.layer.flops() / 1e9
    refs = (2 if case.target == "gpu" else 1) if case.time_refs else 0
    timed = sum(min(time_limit, (warmup + iterations) * gflop / r)
                for r in [rates["dace"]] + [rates["ref"]] * refs)
    verification = gflop / rates["dace"]
    return CASE_OVERHEAD_S[case.target] + verification + timed


def estimate(cases: Sequence[Case], target: str, cores: int, iterations: int, warmup: int,
             time_limit: float, cachedir=None, roofline_layers: int = 0,
             skip: Sequence[str] = (), runs=None) -> Estimate:
    """Host seconds per phase, and the phases split into calls of at most
    ``CALL_FILL * CALL_LIMIT_S`` (a later call builds again what its cases need; the
    end2end phase's runs, :func:`end2end_runs`, may go to calls of their own)."""
    runs = end2end_runs("tune") if runs is None else runs
    per_build, source = measured_build_seconds(target, cachedir)
    builds = len({c.job().spec().name for c in cases})  # planted cases share a build
    gpu = target == "gpu"
    phases = {"identity": 5.0, "ceilings": 20.0 if gpu else 8.0,
              "builds": math.ceil(builds / max(1, cores)) * per_build,
              "cases": WORKER_START_S + sum(_case_seconds(c, iterations, warmup, time_limit)
                                            for c in cases)
              + sum(WORKER_START_S for c in cases if c.planted)
              + sum(PLANTED_HANG_TIMEOUT_S for c in cases if c.planted == "hang"),
              "end2end": sum(end2end_run_seconds(target, flags) for _, flags in runs),
              # test_gpu.py: 13 implementations x 3 shapes of GPU builds, then the runs.
              "tests": math.ceil(39 / max(1, cores)) * per_build + 60.0 if gpu else 0.0,
              # ncu: one profiled process, a few replays per kernel, two targets per layer.
              "roofline": 30.0 + 2 * roofline_layers * 5.0 if gpu else 0.0,
              "table": 2.0}
    phases.update(dict.fromkeys(skip, 0.0))
    calls, current, used = [], [], 0.0
    items = []  # (name in the plan, seconds): the phases, the end2end phase run by run
    for phase in (p for p in PHASES if p not in skip):
        if phase == "end2end" and len(runs) > 1:
            items += [(f"end2end ({dtype})", end2end_run_seconds(target, flags))
                      for dtype, flags in runs]
        else:
            items.append((phase, phases[phase]))
    for phase, seconds in items:
        if current and used + seconds > CALL_FILL * CALL_LIMIT_S:
            calls.append(current)
            current, used = [], 0.0
            # A fresh host keeps no builds: the cases' builds (those left) and the best
            # kernels' builds (roofline) are compiled again; the tests build their own.
            if phase == "cases":
                used += phases["builds"]
            elif phase == "roofline":
                used += math.ceil(roofline_layers / max(1, cores)) * per_build
        current.append(phase)
        used += seconds
    calls.append(current)
    return Estimate(phases, calls, per_build, source, cores, builds)
