"""The command line of ``scripts/cosmoflow_end2end.py``: whole CosmoFlow networks with
DaCe convolutions, against the same network with torch's.

A run builds (or loads from the build cache) the DaCe programs it needs, then, each
optional: ``--check`` (:mod:`convbench.network.check`), ``--epochs`` of training on synthetic
data (:mod:`convbench.network.synthetic`), and timing: torch in both memory formats and DaCe
interleaved iteration by iteration, every convolution call a span, in ``--processes`` fresh
processes one after the other; the run compares DaCe with the faster torch
(:mod:`convbench.results.comparison`; docs/end2end.md has the details).
No caches are flushed between iterations: the network runs as it would in training.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from convbench.tuning.autotune import parse_budget
from convbench.build.chatter import LOG_NAME, set_run_log, set_verbose
from convbench.base.errors import UsageError, check_at_least, run_main
from convbench.commands.flags import check_heap_flag
from convbench.network import compiled, processes
from convbench.network.options import PROG, build_parser  # noqa: F401  (tests, docs)
from convbench.results import comparison
from convbench.results.comparison import TORCH_FORMATS
from convbench.results import schema
from convkernels.layouts import Pass

def main(argv: Optional[List[str]] = None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    check_at_least(("--size", args.size, 1), ("--batch", args.batch, 1),
                   ("--iters", args.iters, 0), ("--warmup", args.warmup, 0),
                   ("--processes", args.processes, 1),
                   ("--epochs", args.epochs, 0), ("--samples", args.samples, 1),
                   ("--threads", args.threads, 1))
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UsageError(f"--lr: must be a positive number, got {args.lr}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UsageError(f"--dropout: must be in [0, 1), got {args.dropout}")
    if args.epochs and not args.train:
        raise UsageError("--epochs: training needs --train")
    if args.epochs and args.samples < args.batch:
        raise UsageError(f"--samples {args.samples}: fewer than one batch of {args.batch}")
    if args.memory_format not in ("auto", "ncdhw", "ndhwc"):
        raise UsageError(f"--memory-format: unknown format '{args.memory_format}' (auto, "
                         "ncdhw, ndhwc)")
    check_heap_flag(args)
    if not (args.iters or args.check or args.epochs):
        raise UsageError("nothing to do: --iters 0 without --check or --epochs")
    from convbench import registry
    from convbench.network import cosmoflow
    from convbench.build import precision
    from convbench.timing.devices import resolve_device, set_threads

    if args.model not in cosmoflow.MODELS:
        raise UsageError(f"--model: unknown model '{args.model}' (choose from "
                         f"{', '.join(cosmoflow.MODELS)})")
    spec = cosmoflow.MODELS[args.model]
    layers = cosmoflow.conv_layers(spec, args.size, args.batch)
    if args.implementation is not None and args.implementation != cosmoflow.TORCH:
        impl = registry.get(args.implementation)
        if impl.pass_ != Pass.FWD:
            raise UsageError(f"--impl: {args.implementation} computes {impl.pass_}; name a forward "
                             "implementation (backward ones go in --impl-map)")
    device = resolve_device(args.device)
    dtype = precision.check_device(precision.from_args(args), device)
    budget = None if args.autotune is None or args.timing_worker else \
        parse_budget(args.autotune, "--autotune")
    if budget is not None and (device != "cpu" or dtype.label != "float32"):
        raise UsageError("--autotune: the CPU in float32 only (the GPU's tuning is the "
                         "campaign's tune tier)")
    if budget is not None and args.require_precompiled:
        raise UsageError("--autotune builds its candidates: not with --require-precompiled")
    set_verbose(args.verbose)
    params: Dict[str, Dict[str, str]] = {}  # IMPL:NAME=VALUE -> {impl: {name: value}}
    for item in args.param:
        impl_name, sep, rest = item.partition(":")
        if not sep or not impl_name.strip():
            raise UsageError(f"--param: expected IMPL:NAME=VALUE, got {item!r}")
        registry.get(impl_name.strip())
        params.setdefault(impl_name.strip(), {}).update(registry.parse_param_overrides([rest]))
    for name, values in params.items():
        registry.get(name).resolve_params(values, source=f"--param {name}")
    args.threads = set_threads(args.threads)
    if device == "cpu":
        from convbench.timing import heap
        heap.apply(args.heap)
    backward = bool(args.train or args.check)
    # the toolchain's warnings (of the autotune's builds too) go to the run's folder
    if not args.timing_worker:
        set_run_log(output_folder(args, device, dtype) / LOG_NAME, fresh=True)
    try:
        if budget is not None:
            from convbench.tuning.autotune import tune
            # the choice as it stands, so that bad input fails before the autotune
            cosmoflow.validate_choice(cosmoflow.choose(layers, args.implementation, args.impl_map,
                                                   need_backward=backward, device=device,
                                                   dtype=dtype), layers, device, dtype)
            work = [(layer, p) for i, layer in enumerate(layers) for p in Pass
                    if p == Pass.FWD or (backward and (p != Pass.BWD_DATA or i > 0))]
            tune(work, budget, cachedir=args.cachedir, threads=args.threads, heap=args.heap)
        choice, how = cosmoflow.choose_explained(layers, args.implementation, args.impl_map,
                                               need_backward=backward, device=device,
                                               dtype=dtype)
        cosmoflow.validate_choice(choice, layers, device, dtype)
        return Run(args, spec, layers, choice, params, device, how).run()
    finally:
        set_run_log(None)


def _train_step(model, opt, x, target):
    import torch
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    return loss


#: The backend name of torch's automatic mixed precision (float32 weights, convolutions
#: in the 16-bit type under ``torch.autocast``; a gradient scaler in float16).
AMP = schema.TORCH_AMP


def _amp_train_step(model, opt, scaler, x, target, dtype):
    """:func:`_train_step` as torch's mixed precision runs it: the forward pass under
    autocast, the loss in float32, the gradients scaled (float16) and unscaled by the
    step."""
    import torch
    opt.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype):
        out = model(x)
    loss = torch.nn.functional.mse_loss(out.float(), target)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    return loss


def output_folder(args, device: str, dtype) -> Path:
    """``--outdir``, else ``outputs/end2end_<model>_s<S>_b<N>_<device>[_<dtype>]``."""
    suffix = "" if dtype.label == "float32" else f"_{dtype.label}"
    return Path(args.outdir or Path("outputs") / f"end2end_{args.model}_s{args.size}"
                f"_b{args.batch}_{device}{suffix}")


class Run:
    """One end-to-end run: models, builds, check, training, timing, result files."""

    def __init__(self, args, spec, layers, choice, params, device, how=None):
        self.args, self.spec, self.layers, self.choice = args, spec, layers, choice
        #: layer -> pass -> how its implementation was chosen (cosmoflow.choose_explained)
        self.how = how or {}
        from convbench.build.precision import check_device, from_args
        self.params, self.device = params, device
        self.dtype = check_device(from_args(args), device)
        self.outdir = output_folder(args, device, self.dtype)
        self.summary: Dict[str, Any] = {}
        #: a 16-bit storage type: torch's automatic mixed precision is timed as well
        self.amp = self.dtype.label in ("float16", "bfloat16")
        self.amp_model = None
        self.compiled_model = None  # --torch-compile (convbench.network.compiled)

    @property
    def backends(self) -> List[str]:
        """The timed models: torch's in both memory formats, DaCe's, and torch's mixed
        precision in 16 bits."""
        return [*TORCH_FORMATS, "dace"] + ([AMP] if self.amp_model is not None else []) + (
            [compiled.COMPILED] if self.compiled_model is not None else [])

    def _models(self):
        import torch

        from convbench import registry
        from convbench.network import cosmoflow
        from convkernels.layouts import Layout
        a = self.args
        torch.manual_seed(a.seed)
        base = cosmoflow.build_model(self.spec, a.size, a.batch, dropout=a.dropout)
        self.format_name = a.memory_format
        if self.format_name == "auto":
            fwd = {per[Pass.FWD] for per in self.choice.values()} - {cosmoflow.TORCH}
            ndhwc = fwd and all(registry.get(n).layout == Layout.NDHWC for n in fwd)
            self.format_name = "ndhwc" if ndhwc else "ncdhw"
        self.fmt = (torch.channels_last_3d if self.format_name == "ndhwc"
                    else torch.contiguous_format)
        self.tdev = torch.device("cuda" if self.device == "gpu" else "cpu")
        dtype = self.dtype
        self.summary["precision"] = dtype.describe()
        if self.device == "gpu":  # the same math on both sides: torch's default is TF32
            from convbench.check.references import torch_gpu_math
            self.summary["torch_gpu_math"] = torch_gpu_math(allow_tf32=dtype.math == "tf32")
        # In 16 bits torch's mixed precision runs too: float32 weights, autocast.
        self.amp_model = (copy.deepcopy(base).to(self.tdev, dtype=torch.float32,
                                                 memory_format=self.fmt)
                          if self.amp and a.iters else None)
        # The models hold their weights and activations in the storage type; torch runs in
        # both memory formats (the faster one is the baseline), DaCe in its own.
        base = base.to(self.tdev, dtype=dtype.torch)
        self.formats = {"torch-ncdhw": torch.contiguous_format,
                        "torch-ndhwc": torch.channels_last_3d, "dace": self.fmt, AMP: self.fmt}
        self.torch_models = {name: copy.deepcopy(base).to(memory_format=self.formats[name])
                             for name in TORCH_FORMATS}
        if a.torch_compile and a.iters:
            self.formats[compiled.COMPILED] = self.fmt
            self.compiled_model = compiled.plain_model(base, self.fmt)
        #: torch in the DaCe model's format: the check's and the training's yardstick
        self.torch_model = self.torch_models[f"torch-{self.format_name}"]
        self.dace_model = copy.deepcopy(self.torch_model)
        self._initial_state = copy.deepcopy(self.torch_model.state_dict())
        print(f"builds ({'required from' if a.require_precompiled else 'from'} the "
              f"cache; missing ones are compiled, ~5-60 s each):", flush=True)
        t0 = time.perf_counter()
        cosmoflow.attach_backends(self.dace_model, self.choice, self.device, a.cachedir,
                                policy="require" if a.require_precompiled else "reuse",
                                params=self.params,  # the network's input needs no gradient:
                                skip=[(self.layers[0].name, Pass.BWD_DATA)], dtype=dtype)
        fused = []
        fuse = self.device == "cpu" if a.fuse is None else a.fuse  # the GPU's: when asked
        if fuse:
            from convbench.network.blocks import attach_epilogues
            fused = attach_epilogues(
                self.dace_model, self.device, a.cachedir,
                policy="require" if a.require_precompiled else "reuse", dtype=dtype)
        self.summary["fused_blocks"] = fused
        self.build_seconds = time.perf_counter() - t0

    def _to_device(self, x, y):
        t = self.dtype.torch
        return (x.to(self.tdev, t).contiguous(memory_format=self.fmt), y.to(self.tdev, t))

    def _batch(self, seed: int):
        from convbench.network.synthetic import make_dataset
        return self._to_device(*make_dataset(self.args.batch, self.args.size,
                                             self.spec.in_channels, seed=seed))

    def run(self) -> int:
        import torch
        a = self.args
        print(f"CosmoFlow {self.spec.name} ({self.spec.description}), input "
              f"{self.spec.in_channels}x{a.size}^3, batch {a.batch}, device {self.device}, "
              f"threads {torch.get_num_threads() if self.device == 'cpu' else '-'}")
        for layer in self.layers:
            print(f"  {layer.name}: {layer.describe():40s} " +
                  "  ".join(f"{p}={n}" + (f" [{self.how[layer.name][p]}]"
                                          if p in self.how.get(layer.name, {}) else "")
                            for p, n in self.choice[layer.name].items()))
        self._models()
        log = self.outdir / LOG_NAME
        print(f"memory format: {self.format_name}; builds ready in {self.build_seconds:.1f} s"
              + (f" (the toolchain's warnings: {log})" if log.is_file() else ""), flush=True)
        if self.device == "cpu":
            from convbench.timing.heap import describe
            print(f"outputs: torch and DaCe allocate theirs on every call, from the "
                  f"{describe()}", flush=True)
        if a.timing_worker:  # one process of the timing: its samples, nothing else
            phases = ["forward"] + (["train"] if a.train else [])
            from convbench.base.files import write_atomic
            write_atomic(Path(a.timing_worker), json.dumps(self._time_loop(phases)))
            return 0
        status = self._check() if a.check else 0
        if a.epochs:
            self._epochs()
        if a.iters:
            self._timing()
        print(self._last_line(status))
        return status

    def _check(self) -> int:
        from convbench.network.check import check_networks
        x, target = self._batch(self.args.seed + 1)
        result = check_networks(self.torch_model, self.dace_model, x, target, self.device,
                                self.dtype)
        self.summary["check"] = result
        calls, tensors = result["calls"], result["tensors"]
        for call in calls:
            if not call["ok"]:
                print(f"  FAIL call {call['layer']} {call['pass']} ({call['implementation']}): "
                      f"err/tol {call['worst_ratio']:.3g}")
        worst_call = max((c["worst_ratio"] for c in calls), default=0.0)
        blocks = sum(c["pass"].startswith("block.") for c in calls)
        print(f"check: {len(calls) - blocks} DaCe convolution calls"
              + (f" and {blocks} fused block epilogue calls" if blocks else "")
              + " vs float64 torch, worst "
              f"err/tol {worst_call:.3g}; max-pooling choices that differ from torch's: "
              f"{result['pool_flips']}")
        for row in tensors:
            print(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['name']:28s} rel err dace "
                  f"{row['rel_dace']:.2e}  torch {row['rel_torch32']:.2e}  "
                  f"bound {row['bound']:.2e}")
        print(f"check {'passed' if result['ok'] else 'FAILED'}: {len(tensors)} tensors "
              f"(output, loss, {len(tensors) - 2} parameter gradients), worst "
              f"error/bound {result['worst']:.3g}", flush=True)
        return 0 if result["ok"] else 1

    def _epochs(self) -> None:
        import torch

        from convbench.base.files import write_atomic
        from convbench.network.synthetic import make_dataset
        a = self.args
        x_all, y_all = make_dataset(a.samples, a.size, self.spec.in_channels, seed=a.seed + 7)
        nbatches = a.samples // a.batch
        # The DaCe model trains from the same initial weights as the torch copy.
        models = {"torch": copy.deepcopy(self.torch_model), "dace": self.dace_model}
        opts = {k: torch.optim.Adam(m.parameters(), lr=a.lr) for k, m in models.items()}
        history: List[Dict[str, Any]] = []
        print(f"training {a.epochs} epochs on {nbatches * a.batch} synthetic samples "
              f"({nbatches} steps per epoch, Adam lr {a.lr}):", flush=True)
        t0 = time.perf_counter()
        for epoch in range(1, a.epochs + 1):
            order = torch.randperm(a.samples, generator=torch.Generator().manual_seed(epoch))
            row = {"epoch": epoch}
            for name, model in models.items():
                model.train()
                total = 0.0
                for b in range(nbatches):
                    idx = order[b * a.batch:(b + 1) * a.batch]
                    x, y = self._to_device(x_all[idx], y_all[idx])
                    total += _train_step(model, opts[name], x, y).item()
                row[f"loss_{name}"] = total / nbatches
            history.append(row)
            print(f"  epoch {epoch:3d}  mean loss  torch {row['loss_torch']:.4f}  dace "
                  f"{row['loss_dace']:.4f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
        self.summary["training"] = history
        self.outdir.mkdir(parents=True, exist_ok=True)
        lines = ["epoch,loss_torch,loss_dace"] + [
            f"{r['epoch']},{r['loss_torch']:.6g},{r['loss_dace']:.6g}" for r in history]
        write_atomic(self.outdir / "training.csv", "\n".join(lines) + "\n")
        print(f"wrote {self.outdir / 'training.csv'}")
        # Timing below starts again from the common initial weights.
        self.dace_model.load_state_dict(self._initial_state)

    def _timing(self) -> None:
        from convbench.plots import plot_breakdown
        from convbench.results.writer import Measurement, RunWriter, run_metadata
        from convbench.timing.timers import Timing
        from convbench.build.toolchain import PROJECT_ROOT
        a = self.args
        phases = ["forward"] + (["train"] if a.train else [])
        if a.processes > 1:
            samples = processes.time_in_processes(a.argv, a.processes, self.outdir, phases)
        else:
            one = self._time_loop(phases)
            samples = {b: {ph: {part: [ms] for part, ms in per.items()} for ph, per in v.items()}
                       for b, v in one.items()}
        self.comparison = comparison.compare(samples, phases)
        meta = run_metadata(PROJECT_ROOT, self.device, a.threads)
        references = [b for b in self.backends if b != "dace"]
        meta.update(kind="end2end", model=self.spec.name, size=a.size, batch=a.batch,
                    memory_format=self.format_name, references=references,
                    torch_best={ph: c["torch"] for ph, c in self.comparison.items()},
                    comparison=self.comparison,
                    implementations={k: {str(p): n for p, n in v.items()}
                                     for k, v in self.choice.items()},
                    chosen_by={k: {str(p): why for p, why in v.items()}
                               for k, v in self.how.items()},
                    timing={"method": "perf_counter" if self.device == "cpu" else "cuda-events",
                            "warmup": a.warmup, "iterations": a.iters, "flush": False,
                            "interleaved": True, "processes": a.processes,
                            "median": "of the process medians" if a.processes > 1 else
                            "of the iterations", **self._heap()},
                    optimizer={"name": "Adam", "lr": a.lr}, loss="mse", **self.summary)
        if compiled.COMPILED in references:
            meta["torch_compile"] = {
                "backend": compiled.BACKEND, "memory_format": self.format_name,
                "first_call_ms": {ph: [run[0] for run in samples[compiled.COMPILED][ph]["compile"]]
                                  for ph in phases}}
        if AMP in references:
            meta["torch_amp"] = {"autocast": self.dtype.label, "weights": "float32",
                                 "grad_scaler": self.dtype.label == "float16"}
        writer = RunWriter(self.outdir, meta, references, columns=(
            "median_of_processes_ms", "spread_between_processes", "share_of_difference",
            "ratio_without"), ratio_of="median_of_processes_ms")
        index, per_process = 0, []
        for phase in phases:
            parts = {}  # part -> (implementation, geometry, flop)
            for layer in self.layers:
                parts[f"{layer.name}.fwd"] = (self.choice[layer.name][Pass.FWD],
                                              layer.describe(), layer.flops())
            for layer in self.layers if phase == "train" else ():
                first, per = layer is self.layers[0], self.choice[layer.name]
                # Backward filter, plus backward data but for the network's input.
                impl = "+".join(per[p] for p in (Pass.BWD_DATA, Pass.BWD_FILTER)
                                if p in per and not (first and p == Pass.BWD_DATA))
                parts[f"{layer.name}.bwd"] = (impl, layer.describe(),
                                              layer.flops() * (1 if first else 2))
            parts["other"] = ("-", "", None)
            parts["total"] = ("-", "", sum(flop for _, _, flop in parts.values() if flop))
            shares = self.comparison[phase].get("parts", {})
            for part, (impl, geometry, flop) in parts.items():
                # the backends that time this part (torch.compile's step is one span)
                timed = [b for b in self.backends if samples[b][phase].get(part)]
                ms = [Measurement(b, Timing([x for run in samples[b][phase][part] for x in run],
                                            a.warmup, "end2end"))
                      for b in timed]
                extra = {b: comparison.stats_columns(samples[b][phase][part]) for b in timed}
                if part in shares:
                    extra["dace"].update(share_of_difference=shares[part]["share"],
                                         ratio_without=shares[part]["ratio_without"])
                writer.add_entry(index, f"{phase}.{part}", impl, ms, geometry=geometry,
                                 batch=a.batch, flop=flop, columns=extra)
                for b in timed:
                    for k, run in enumerate(samples[b][phase][part]):
                        per_process.append({"layer": f"{phase}.{part}", "backend": b,
                                            "process": k, "samples": len(run),
                                            "median_ms": statistics.median(run)})
                index += 1
        writer.finish()
        from convbench.base.files import write_atomic
        from convbench.results.writer import csv_text
        write_atomic(self.outdir / "processes.csv", csv_text(
            ["layer", "backend", "process", "samples", "median_ms"], per_process))
        for line in comparison.table(self.comparison, [la.name for la in self.layers],
                                     self.backends):
            print(line)
        path = plot_breakdown(self.outdir, self.outdir / "runtimebreakdown.png")
        print(f"results: {self.outdir}/ (samples.csv, summary.csv, processes.csv, "
              f"metadata.json, {path.name})")

    def _heap(self) -> Dict[str, Any]:
        from convbench.timing import heap
        meta = heap.metadata(self.device)  # empty on the GPU
        return dict(outputs="torch and DaCe allocate theirs on every call", **meta) if meta else {}

    def _time_loop(self, phases) -> Dict[str, Dict[str, Dict[str, List[float]]]]:
        """Interleaved iterations: per model, phase and part, the milliseconds of each
        timed iteration."""
        import torch

        from convbench.timing.heap import section
        a = self.args
        x, target = self._batch(a.seed + 2)
        models = {**self.torch_models, "dace": self.dace_model, AMP: self.amp_model}
        if self.compiled_model is not None:
            models[compiled.COMPILED] = compiled.compile_model(self.compiled_model)
        models = {k: models[k] for k in self.backends}
        opts = {k: torch.optim.Adam(m.parameters(), lr=a.lr) for k, m in models.items()}
        out = {b: {ph: {} for ph in phases} for b in models}
        if compiled.COMPILED in models:  # its compilation, apart from its iterations
            from convbench.timing.devices import synchronize
            print(f"compiling {compiled.COMPILED} ({compiled.BACKEND})", flush=True)
            first = compiled.first_calls(
                models[compiled.COMPILED], opts[compiled.COMPILED],
                x.contiguous(memory_format=self.fmt), target, phases, _train_step,
                lambda: synchronize(self.device))
            for phase, ms in first.items():
                out[compiled.COMPILED][phase]["compile"] = [ms]
        total = a.warmup + a.iters
        print(f"timing {', '.join(phases)}: {a.warmup} warm-up + {a.iters} timed iterations "
              "per model, interleaved", flush=True)
        t0 = time.perf_counter()
        with section(self.device):  # the warm heap, on the CPU (convbench.timing.heap)
            self._iterations(models, opts, phases, x, target, total, out, t0)
        return out

    def _iterations(self, models, opts, phases, x, target, total, out, t0) -> None:
        import torch

        from convbench.network.cosmoflow import Recorder
        a = self.args
        # each model's input in its own memory format
        inputs = {b: (x.contiguous(memory_format=self.formats[b]), target) for b in models}
        if AMP in models:  # float32 in, convolutions in 16 bits under autocast
            inputs[AMP] = (x.float().contiguous(memory_format=self.fmt), target.float())
            scaler = torch.amp.GradScaler(self.tdev.type,
                                          enabled=self.dtype.label == "float16")
        for it in range(total):
            for phase in phases:
                for name, model in models.items():
                    rec = Recorder(self.device)
                    model.set_recorder(rec)
                    xb, tb = inputs[name]
                    autocast = torch.autocast(self.tdev.type, dtype=self.dtype.torch,
                                              enabled=name == AMP)
                    try:
                        if phase == "forward":
                            model.eval()
                            with torch.no_grad(), autocast, rec.span("total"):
                                model(xb)
                        elif name == AMP:
                            model.train()
                            with rec.span("total"):
                                _amp_train_step(model, opts[name], scaler, xb, tb,
                                                self.dtype.torch)
                        else:
                            model.train()
                            with rec.span("total"):
                                _train_step(model, opts[name], xb, tb)
                    finally:
                        model.set_recorder(None)
                    spans = rec.collect()
                    if it < a.warmup:
                        continue
                    if name != compiled.COMPILED:  # one span there: its parts are not split
                        spans["other"] = spans["total"] - sum(
                            v for k, v in spans.items() if k != "total")
                    for part, ms in spans.items():
                        out[name][phase].setdefault(part, []).append(ms)
            print(f"  iteration {it + 1}/{total} ({'warm-up' if it < a.warmup else 'timed'}, "
                  f"{time.perf_counter() - t0:.0f} s)", flush=True)

    def _last_line(self, status: int) -> str:
        a = self.args
        bits = [f"end2end {self.spec.name} {a.size}^3 b{a.batch} {self.device}"
                + ("" if self.dtype.label == "float32" else f" {self.dtype.label}")]
        if a.iters:
            for ph, c in self.comparison.items():
                best, step = c["torch"], c["step_ms"]
                t, d = step[best], step["dace"]
                other = next(f for f in TORCH_FORMATS if f != best)
                label = "forward" if ph == "forward" else "train step"
                bits.append(f"{label} torch {t:.1f} ms ({best[6:]}; {other[6:]} "
                            f"{step[other]:.1f}), dace {d:.1f} ms ({d / t:.2f}x)")
                for name, what in ((AMP, "torch AMP"), (compiled.COMPILED, "torch.compile")):
                    if name in step:
                        bits.append(f"{label} {what} {step[name]:.1f} ms (dace "
                                    f"{d / step[name]:.2f}x)")
                if ph == "train":
                    per_s = {b: 1e3 * a.batch / v for b, v in step.items()}
                    bits.append("samples/s " + ", ".join(f"{b} {v:.1f}"
                                                         for b, v in per_s.items()))
            if a.processes > 1:
                spread = max(self.comparison[ph]["spread_between"]["dace"]
                             for ph in self.comparison)
                bits.append(f"{a.processes} processes (DaCe's step spread {spread:.1%})")
        if a.epochs:
            h = self.summary["training"]
            bits.append(f"loss dace {h[0]['loss_dace']:.3f} -> {h[-1]['loss_dace']:.3f} in "
                        f"{a.epochs} epochs")
        if a.check:
            bits.append("check " + ("passed" if status == 0 else "FAILED") +
                        f" (worst error/bound {self.summary['check']['worst']:.3g})")
        return "; ".join(bits)


if __name__ == "__main__":  # the timing's worker processes (--timing-worker)
    sys.exit(main())
