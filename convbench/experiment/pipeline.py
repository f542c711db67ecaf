"""The pipeline as a library: layers -> registry -> build (cached) -> run -> verify or time
-> result records (and files).

Every entry point drives this module: ``profile_conv3d.py`` and ``convbench verify|profile``
(:mod:`convbench.commands.profile_conv3d`), the benchmark, tuning and stress scripts, and the end-to-end
network (:mod:`convbench.network`).  Plain arguments go in, :class:`Record` objects come
out; an :class:`Observer` sees each step as it happens (the command line prints from one).

    from convbench.experiment import Experiment, TimingOptions
    exp = Experiment(["implicitGemm"], load_layers("cosmoflow")[:2], device="cpu",
                     verify=True, timing=TimingOptions(warmup=2, iterations=5))
    for record in exp.run():
        print(record.layer.name, record.status, record.rows)

One case, one implementation on one layer, is :meth:`Experiment.run_case`: build, check,
time the references, time the build; :meth:`Experiment.run` runs it over implementations
x layers and the GPU campaign's workers run it per case.  The steps are methods too, for
tools that arrange them differently (``bench_cpu`` times every implementation of a layer
in interleaved rounds; ``tune_cpu`` times many parameter sets): :meth:`Experiment.params`,
:meth:`~Experiment.build`, :meth:`~Experiment.truth`, :meth:`~Experiment.check`,
:meth:`~Experiment.call` and :meth:`~Experiment.time`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from convbench import registry
from convbench.build import cache, toolchain, tuned
from convbench.timing import devices
from convbench.base.errors import UsageError
from convbench.base.files import WriteError
from convbench.layersets.layer import Layer
from convkernels.layouts import Pass
from convbench.build.precision import check_device, get_dtype
from convbench.check.references import ReferenceOptions


@dataclasses.dataclass
class TimingOptions:
    """How each (layer, backend) is timed (see :mod:`convbench.timing`)."""

    warmup: int = 10
    iterations: int = 100
    #: Stop sampling a backend on a layer after this many seconds, warm-up included.
    time_limit: Optional[float] = None
    #: Flush the caches before each timed call.
    flush: bool = True
    #: GPU only: ``torch`` or ``cupy`` CUDA events.
    events: str = "torch"
    #: CPU only: the heap policy of the process (:mod:`convbench.timing.heap`).
    heap: str = "warm"


@dataclasses.dataclass(frozen=True)
class CaseOptions:
    """How :meth:`Experiment.run_case` checks and times one case (its keyword arguments
    after the build; the docstring there says what each does)."""

    references: Any = True
    layouts: Optional[Sequence] = None
    tamper: Optional[Callable[[Any], Any]] = None
    time_wrong: bool = True
    truth: Any = None
    inputs: Optional[Mapping[str, Any]] = None
    timed: bool = True
    dace_call: Optional[Mapping[str, Any]] = None


@dataclasses.dataclass
class Record:
    """What happened to one implementation on one layer."""

    index: int
    layer: Layer
    implementation: str
    pass_: Pass
    device: str
    params: Dict[str, int]
    #: ``unsupported``, ``error``, ``built``, ``skipped`` (screened out), ``passed`` or
    #: ``failed`` (verification).
    status: str = "pending"
    reason: str = ""
    build_name: str = ""
    build_origin: str = ""
    build_seconds: float = 0.0
    checks: List[Any] = dataclasses.field(default_factory=list)
    check_seconds: float = 0.0
    #: :class:`convbench.results.writer.Measurement` per backend (DaCe first).
    measurements: List[Any] = dataclasses.field(default_factory=list)
    #: Summary rows written for this layer (with ratios), when timed.
    rows: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Per reference: what it chose (cuDNN's algorithm and how long Find took).
    infos: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Per reference that could not be timed: why (the other backends are timed).
    errors: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def verified(self) -> Optional[bool]:
        return all(c.ok for c in self.checks) if self.checks else None

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "built")

    def median_ms(self, backend: str = "dace") -> Optional[float]:
        """The median milliseconds of ``backend`` (``dace``, or a reference's name) on this
        layer, or None where it was not timed."""
        for m in self.measurements:
            if m.backend == backend and m.timing.samples_ms:
                return m.timing.stats()["median_ms"]
        return None


class Observer:
    """Told about each step; the default does nothing.  Override what you need."""

    def started(self, exp: "Experiment") -> None: ...
    def profiling(self, exp: "Experiment", outdir: Path, ceilings: Dict[str, Any]) -> None: ...
    def layer(self, exp: "Experiment", record: Record) -> None: ...
    def built(self, exp: "Experiment", record: Record) -> None: ...
    def checked(self, exp: "Experiment", record: Record) -> None: ...
    def timing(self, exp: "Experiment", record: Record, total_calls: int) -> Any:
        """A progress context (:class:`convbench.base.progress.Progress`) for the timing, or None."""
        return None

    def backend(self, exp: "Experiment", record: Record, name: str):
        """A context around the preparation and timing of one backend (default: none)."""
        return contextlib.nullcontext()

    def prepared(self, exp: "Experiment", record: Record, name: str, call) -> None:
        """A backend's call is prepared, before it is timed (DaCe's has ``first_ms``)."""

    def timed(self, exp: "Experiment", record: Record) -> None: ...
    def finished(self, exp: "Experiment", record: Record) -> None: ...
    def plotted(self, exp: "Experiment", paths: List[Path]) -> None: ...


def resolve_implementations(names: Optional[Sequence[str]], pass_: Optional[Pass] = None,
                            device: Optional[str] = None, flag: str = "--implementation"):
    """Registered implementations by name (``None``: every one of ``pass_`` with a schedule
    for ``device``), as a list; an unknown name, or one of another pass or without a
    schedule for ``device``, is a :class:`UsageError` naming ``flag``."""
    every = registry.all_implementations()
    fits = {n: i for n, i in every.items()
            if (pass_ is None or i.pass_ == Pass(pass_)) and (device is None or device in i.targets)}
    if names is None:
        return [fits[n] for n in sorted(fits)]
    out = []
    for name in names:
        impl = registry.get(name)
        if pass_ is not None and impl.pass_ != Pass(pass_):
            same = sorted(n for n, i in every.items() if i.pass_ == Pass(pass_))
            raise UsageError(f"{flag}: {name} computes {impl.pass_}, not {Pass(pass_)} "
                             f"(implementations of {Pass(pass_)}: {', '.join(same) or 'none'})")
        if device is not None and device not in impl.targets:
            raise UsageError(f"{flag}: {name} has no schedule for {device} (targets: "
                             f"{', '.join(impl.targets)})")
        out.append(impl)
    return out


class Experiment:
    """Implementations x layers on one device: build, then verify and/or time.

    ``implementations``: names or :class:`~convbench.registry.Implementation` objects.
    ``overrides``: parameter values (``{"PIX": 16}``) over each layer's tuned ones.
    ``policy``: ``rebuild``, ``reuse`` or ``require`` (the build cache, in ``cachedir``).
    ``verify``: check every output against the float64 ground truth (and, on the GPU,
    torch float32 and cuDNN).  ``timing``: time DaCe and the references with these
    options, writing ``samples.csv``, ``summary.csv`` and ``metadata.json`` into
    ``outdir`` after every layer (None: do not time).  ``plots``: draw the plots from
    those files at the end.  ``metadata`` is added to the run's metadata.
    """

    def __init__(self, implementations, layers: Sequence[Layer], device: str = "cpu", *,
                 overrides: Optional[Mapping[str, Any]] = None, policy: str = "rebuild",
                 cachedir=None, seed: int = 0, verify: bool = True,
                 timing: Optional[TimingOptions] = None,
                 references: Optional[ReferenceOptions] = None, outdir=None,
                 plots: bool = False, threads: Optional[int] = None,
                 metadata: Optional[Dict[str, Any]] = None, observer: Optional[Observer] = None,
                 dtype="float32"):
        if isinstance(implementations, (str, registry.Implementation)):
            implementations = [implementations]
        self.impls = [registry.get(i) if isinstance(i, str) else i for i in implementations]
        if policy not in cache.POLICIES:
            raise UsageError(f"unknown build policy '{policy}' (choose from "
                             f"{', '.join(cache.POLICIES)})")
        self.layers, self.device, self.policy, self.cachedir = list(layers), device, policy, cachedir
        self.overrides = dict(overrides or {})
        self.seed, self.verify, self.timing, self.plots = seed, verify, timing, plots
        self.ref_options = references or ReferenceOptions()
        self.outdir = Path(outdir) if outdir is not None else None
        self.threads, self.extra_metadata = threads, dict(metadata or {})
        self.observer = observer or Observer()
        #: The precision of every build, input and reference (:mod:`convbench.build.precision`).
        self.dtype = check_device(get_dtype(dtype), device)
        if self.dtype.math == "tf32":  # timed against the vendors' TF32 paths
            self.ref_options = dataclasses.replace(self.ref_options, allow_tf32=True)
        self.records: List[Record] = []
        self.writer = None
        #: The arrays the last prepared DaCe call got: ``torch``, or ``cupy <version>``.
        self.array_library = "torch"
        self._params: Dict[tuple, registry.Params] = {}
        self._timer = self._refs = self._last_build = None

    # -- the steps -------------------------------------------------------------------------
    def params(self, impl, layer: Layer,
               overrides: Optional[Mapping[str, Any]] = None) -> registry.Params:
        """The implementation's defaults, updated by the tuned entry for the layer
        (:mod:`convbench.tuning`), updated by the overrides: resolved once per
        implementation, layer and overrides, and the same object from then on."""
        overrides = self.overrides if overrides is None else overrides
        key = (impl.name, layer, tuple(sorted((overrides or {}).items())))
        if key not in self._params:
            self._params[key] = tuned.tuned_params(impl, layer, self.device, overrides)
        return self._params[key]

    def build(self, impl, layer: Layer, params: Optional[Mapping[str, int]] = None):
        """The build of ``impl`` on ``layer`` in the experiment's precision, from the
        cache, per the policy (the last build is kept: asked for again, it is not loaded
        or compiled twice)."""
        params = self.params(impl, layer) if params is None else params
        spec = toolchain.make_spec(impl, layer, self.dtype, self.device, params)
        if self._last_build is not None and self._last_build.spec.name == spec.name:
            return self._last_build  # a caller that built the case before running it
        self._last_build = None  # its arrays and library may go before the next loads
        self._last_build = cache.build(spec, self.cachedir, policy=self.policy)
        return self._last_build

    def truth(self, pass_: Pass, layer: Layer, index: int = 0):
        """Random inputs (seed + index) in the experiment's precision and their float64
        ground truth."""
        from convbench.check.verify import make_truth
        return make_truth(layer, pass_, seed=self.seed + index, dtype=self.dtype,
                          device=self.device)

    def check(self, build, truth, tamper: Optional[Callable[[Any], Any]] = None) -> list:
        """Run ``build`` on the ground truth's inputs and check its output (``tamper``:
        applied to the output first)."""
        from convbench.check.verify import verify_build
        return verify_build(build, truth, self.device, self.ref_options.cudnn_algo, tamper)

    def call(self, build, inputs, fill: float = 0.0, fresh: Optional[bool] = None
             ) -> Callable[[], object]:
        """A prepared no-argument call of ``build`` on ``inputs`` (logical layout): the
        arrays converted once, the output filled with ``fill``; its first (initialising)
        call has run (``call.first_ms``), its arrays are ``call.keepalive``.

        ``fresh`` (default: on the CPU) gives every later call a newly allocated output,
        as torch's calls get theirs (:func:`convbench.timing.timers.prepared_call`); on the GPU
        torch's outputs come from its caching allocator, at no cost, and the DaCe call
        writes into the prepared buffer.  With CuPy's events on the GPU the program gets
        CuPy views of the arrays (DaCe takes any ``__cuda_array_interface__``; no copies),
        torch's arrays where that fails (``array_library`` says which)."""
        from convkernels.layouts import PASS_SIGNATURE
        from convbench.timing.timers import prepared_call
        from convbench.check.verify import program_arrays
        impl, layer = build.spec.impl, build.spec.layer
        arrays = program_arrays(impl, layer, inputs, self.device, build.spec.dtype.torch, fill)
        if fresh is None:
            fresh = self.device == "cpu"
        out = PASS_SIGNATURE[impl.pass_][1] if fresh else None
        if self.device == "gpu" and (self.timing or TimingOptions()).events == "cupy":
            import cupy
            try:
                call = prepared_call(build, {k: cupy.from_dlpack(v) for k, v in arrays.items()},
                                     out)
                self.array_library = f"cupy {cupy.__version__}"
                return call
            except Exception as err:  # noqa: BLE001 - recorded; torch's arrays instead
                print(f"DaCe on CuPy arrays failed ({type(err).__name__}: {err}); "
                      "using torch's", flush=True)
        self.array_library = "torch"
        return prepared_call(build, arrays, out)

    def output_rule(self) -> str:
        """How the timed calls get their output buffers (printed and in the metadata)."""
        if self.device != "cpu":
            return ("torch allocates its output from its caching allocator; DaCe writes "
                    "into a buffer prepared once")
        from convbench.timing import heap
        return f"torch and DaCe allocate their output on every call, from the {heap.describe()}"

    @property
    def timer(self):
        if self._timer is None:
            from convbench.timing.timers import make_timer
            t = self.timing or TimingOptions()
            if self.device == "cpu":
                from convbench.timing import heap
                heap.apply(t.heap)
            self._timer = make_timer(self.device, flush=t.flush, events=t.events)
        return self._timer

    @property
    def reference_backends(self):
        if self._refs is None:
            from convbench.check import references
            self._refs = references.available(self.device)
        return self._refs

    def time(self, calls: Mapping[str, Callable[[], Callable[[], object]]], progress=None,
             errors: Optional[Dict[str, str]] = None, record: Optional[Record] = None):
        """Time each backend in turn: ``calls`` maps a backend name to a function that
        prepares its call (outside the timed region).  Returns ``(measurements, infos)``.
        ``errors``: where a backend other than the first that fails goes (name: why), the
        others then still timed (None: it raises).  ``record``: the case the observer is
        told about, per backend.  On the CPU this is a timed section of
        :mod:`convbench.timing.heap`."""
        t = self.timing or TimingOptions()
        with self.timed_section():
            return self._time_each(calls, progress, getattr(progress, "label", ""),
                                   t.warmup + t.iterations, t, errors, record)

    def timed_section(self):
        """The heap's timed section on the CPU (:func:`convbench.timing.heap.timed`)."""
        from convbench.timing.heap import section
        return section(self.device)

    def _time_each(self, calls, progress, label, per_backend, t, errors=None, record=None):
        from convbench.results.writer import Measurement
        measurements, infos = [], {}
        for n, (name, prepare) in enumerate(calls.items()):
            if progress is not None:
                progress.label = f"{label} {name}"
            try:
                with (self.observer.backend(self, record, name) if record is not None
                      else contextlib.nullcontext()):
                    fn = prepare()
                    if getattr(fn, "info", None):
                        infos[name] = fn.info
                    if record is not None:
                        self.observer.prepared(self, record, name, fn)
                    measurements.append(Measurement(name, self.timer.measure(
                        fn, t.warmup, t.iterations, t.time_limit, progress=progress)))
                    del fn  # its arrays go before the next backend is prepared
            except Exception as err:  # noqa: BLE001 - recorded; the next backend is timed
                if errors is None or n == 0:
                    raise
                errors[name] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            if progress is not None:
                progress.done = per_backend * len(measurements)
        return measurements, infos

    # -- the whole pipeline ------------------------------------------------------------------
    def prebuild(self) -> List[str]:
        """Every supported case built into the cache (loaded from it when valid, under the
        policy ``reuse`` or ``require``), none loaded or run: per case ``built``,
        ``cached`` or ``unsupported``.  The first job array of a sweep's ``--build-first``."""
        out = []
        policy = "reuse" if self.policy == "require" else self.policy
        for impl in self.impls:
            for layer in self.layers:
                params = self.params(impl, layer)
                if (impl.unsupported_dtype(self.dtype, self.device)
                        or devices.arch_problem(impl.cuda_arch, self.device)
                        or impl.unsupported_reason(layer, params)):
                    out.append("unsupported")
                    continue
                spec = toolchain.make_spec(impl, layer, self.dtype, self.device, params)
                build = cache.build(spec, self.cachedir, policy=policy, load=False)
                out.append("built" if build.origin == "built" else "cached")
        return out

    def run(self) -> List[Record]:
        """Every implementation on every layer; the records, also in ``self.records``."""
        self.observer.started(self)
        if self.timing is not None:
            self.start_results()
        status = "interrupted"
        try:
            for impl in self.impls:
                for i, layer in enumerate(self.layers):
                    self.records.append(self.run_case(impl, layer, i))
            status = "complete"
        finally:
            if self.writer is not None:
                self.writer.finish(status)
                if self.plots and self.writer.summary:
                    from convbench import plots
                    self.observer.plotted(self, plots.plot_run(self.writer.outdir))
        return self.records

    def run_case(self, impl, layer: Layer, index: int = 0, *, params=None,
                 references=True, layouts: Optional[Sequence] = None,
                 tamper: Optional[Callable[[Any], Any]] = None, time_wrong: bool = True,
                 catch: bool = True, truth=None, inputs: Optional[Mapping[str, Any]] = None,
                 screen: Optional[Callable[[Any], Optional[str]]] = None, timed: bool = True,
                 dace_call: Optional[Mapping[str, Any]] = None) -> Record:
        """One implementation on one layer: build it, check it (``verify``), time the
        references and the build (``timing``); the :class:`Record`.

        ``params``: the resolved parameters (default :meth:`params`).  ``references``:
        time the references too (True), not (False), or those named; ``layouts``: in
        these memory formats (default the implementation's own; a reference in another is
        named ``<ref>-<layout>``).  A reference that cannot be timed is recorded in
        ``Record.errors`` and the others go on.  ``tamper``: applied to the output before
        it is checked (the harness's own planted failures).  ``time_wrong`` False: a build
        whose float64 check fails is not timed.  ``catch``: a build or run failure makes
        the record's status ``error`` (False: it propagates).

        Shared between cases (the bench checks every implementation of a layer against
        one ground truth; the stress test draws its inputs itself): ``truth``, a ground
        truth from :meth:`truth` (the caller drops it), or ``inputs``, the logical inputs
        timed when not verifying.  ``screen(build)``: a reason not to check and time the
        build (status ``skipped``), or None.  ``timed`` False: no timing here even with
        ``timing`` set (the bench times its calls in interleaved rounds).  ``dace_call``:
        keyword arguments of :meth:`call` for the timed DaCe call."""
        params = self.params(impl, layer) if params is None else impl.resolve_params(params)
        record = Record(index, layer, impl.name, impl.pass_, self.device, params)
        self.observer.layer(self, record)
        reason = (impl.unsupported_dtype(self.dtype, self.device)
                  or devices.arch_problem(impl.cuda_arch, self.device)
                  or impl.unsupported_reason(layer, params))
        if reason:
            record.status, record.reason = "unsupported", reason
            self.observer.finished(self, record)
            return record
        try:
            build = self.build(impl, layer, params)
            record.build_origin, record.build_seconds = build.origin, build.seconds
            record.build_name = build.spec.name
            record.status = "built"
            self.observer.built(self, record)
            skip = screen(build) if screen is not None else None
            if skip:
                record.status, record.reason = "skipped", skip
            else:
                self._check_and_time(record, build, index, CaseOptions(
                    references, layouts, tamper, time_wrong, truth, inputs, timed, dace_call))
        except (UsageError, WriteError):  # bad input, or results that cannot be written
            raise
        except Exception as err:  # a build or run failure fails this case, not the run
            if not catch:
                raise
            record.status = "error"
            record.reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        self.observer.finished(self, record)
        return record

    def _check_and_time(self, record, build, index: int, opts: CaseOptions) -> None:
        impl, layer = build.spec.impl, record.layer
        truth, shared = opts.truth, opts.truth is not None
        if self.verify:
            t0 = time.perf_counter()
            truth = truth if shared else self.truth(impl.pass_, layer, index)
            record.checks = self.check(build, truth, opts.tamper)
            record.check_seconds = time.perf_counter() - t0
            record.status = "passed" if record.verified else "failed"
            self.observer.checked(self, record)
        if not opts.timed or self.timing is None or not (
                opts.time_wrong or not record.checks or record.checks[0].ok):
            return
        inputs = opts.inputs
        if inputs is None:
            from convbench.check.verify import make_inputs
            inputs = truth.inputs if truth is not None else make_inputs(
                layer, impl.pass_, self.seed + index)
        if truth is not None and not shared:
            truth.drop()  # the float64 reference is not needed for timing
        self._time_case(record, build, inputs, opts)

    def _time_case(self, record: Record, build, inputs, opts: CaseOptions) -> None:
        from convkernels.layouts import Layout
        from convbench.check.references import torch_device
        impl, layer = build.spec.impl, record.layer
        device_inputs = {r: t.to(torch_device(self.device)) for r, t in inputs.items()}
        calls = {"dace": lambda: self.call(build, inputs, **(opts.dace_call or {}))}
        own = Layout(impl.layout)
        refs = [r for r in self.reference_backends if (opts.references is True or (
            opts.references and r.name in opts.references))
                and getattr(r, "layer_problem", lambda _layer: None)(layer) is None]
        for layout in opts.layouts or [own]:
            for ref in refs:  # torch, torch-ndhwc, cudnn-ncdhw, ...
                name = ref.name if Layout(layout) == own else \
                    f"{ref.name}-{str(layout).lower()}"
                calls[name] = (lambda ref=ref, layout=layout: ref.prepare(
                    layer, impl.pass_, layout, self.device, device_inputs, self.ref_options))
        t = self.timing
        progress = self.observer.timing(self, record, (t.warmup + t.iterations) * len(calls))
        with progress if progress is not None else contextlib.nullcontext():
            record.measurements, record.infos = self.time(calls, progress, record.errors,
                                                          record)
        if self.writer is None:
            self.observer.timed(self, record)
            return
        extra = {"build": record.build_origin, "build_seconds": round(record.build_seconds, 3),
                 "params": record.params}
        if self.verify:
            extra["verified"] = bool(record.verified)
            # which tolerance judged each check (verify.RULES), in the row and the run's
            # metadata.json (written when the run finishes)
            extra["rules"] = {c.reference: c.rule for c in record.checks}
            rules = self.writer.metadata.setdefault("verification_rules", {})
            for c in record.checks:
                rules.setdefault(c.reference, [])
                if c.rule not in rules[c.reference]:
                    rules[c.reference].append(c.rule)
        if record.infos:
            extra["references"] = record.infos
        if record.errors:
            extra["reference_errors"] = record.errors
        record.rows = self.writer.add_layer(record.index, layer, impl.name, record.measurements,
                                            extra)
        self.observer.timed(self, record)

    def start_results(self):
        """Measure the ceilings, write the run's metadata into ``outdir`` and return the
        :class:`~convbench.results.writer.RunWriter` (``self.writer``) that rows are added to."""
        from convbench.timing import ceilings, timers as timing
        from convbench.results import writer
        self.outdir = self.outdir or default_outdir(self.impls[0].name, self.layers, self.device)
        ceil = ceilings.measure(self.device)
        t = self.timing
        refs = self.reference_backends
        meta = writer.run_metadata(toolchain.PROJECT_ROOT, self.device, self.threads)
        impl = self.impls[0]
        meta.update({
            "implementation": impl.name if len(self.impls) == 1 else [i.name for i in self.impls],
            "pass": str(impl.pass_), "layout": str(impl.layout),
            "precision": self.dtype.describe(),
            "params": impl.resolve_params(self.overrides) if len(self.impls) == 1 else
            {i.name: i.resolve_params(self.overrides) for i in self.impls}, "seed": self.seed,
            "layers": [{"name": layer.name, "geometry": layer.describe(), "key": layer.key()}
                       for layer in self.layers],
            "references": [r.name for r in refs],
            "reference_settings": {r.name: r.settings(self.device, self.ref_options)
                                   for r in refs},
            "timing": {"method": self.timer.method, "warmup": t.warmup,
                       "iterations": t.iterations, "time_limit_s": t.time_limit,
                       "flush_bytes": self.timer.flush_bytes,
                       "outputs": self.output_rule(), **self.heap_metadata(),
                       "noisy_if_iqr_over_median_above": timing.NOISY_IQR},
            "ceilings": ceil,
            "dace_config": {"flags": toolchain.toolchain_flags(self.device),
                            "toolchain": toolchain.toolchain_versions(self.device)},
            "cache": {"dir": str(self.cachedir or toolchain.default_cachedir()),
                      "policy": self.policy},
        })
        meta.update(self.extra_metadata)
        self.writer = writer.RunWriter(self.outdir, meta, [r.name for r in refs])
        self.observer.profiling(self, self.outdir, ceil)
        return self.writer

    def heap_metadata(self) -> Dict[str, object]:
        from convbench.timing import heap
        return heap.metadata(self.device)

    # -- summary -----------------------------------------------------------------------------
    def counts(self) -> Dict[str, int]:
        out = {"passed": 0, "failed": 0, "unsupported": 0}
        for r in self.records:
            key = ("unsupported" if r.status == "unsupported" else
                   "passed" if r.ok else "failed")
            out[key] += 1
        return out


def default_outdir(impl_name: str, layers: Sequence[Layer], device: str) -> Path:
    batches = {layer.batch for layer in layers}
    batch = f"b{batches.pop()}" if len(batches) == 1 else "bcsv"
    return Path("outputs") / f"{impl_name}_{batch}_{device}"
