"""Stress test: one very large convolution layer, a DaCe implementation against torch.

The layer's output is ``size^3`` (default: batch 1, 16 -> 32 channels, 3x3x3, 256^3,
about 464 GFLOP).  torch and the DaCe build run one after the other, each with its own
arrays, a first untimed call, ``--warmup`` and ``--iters`` timed calls with the
experiment's timer.  Reported per backend: median time, GFLOP/s and the peak memory of
its phase.  A layer whose estimated need exceeds 90% of the available memory is refused
with exit status 2, before the build and again with the SDFG's own transients.
``--check`` verifies the first and last output depth planes against torch float64 (the
output is poisoned with NaN first); exit status 1 if it fails.  The "Stress test" section
of docs/end2end.md has the details.
"""

import contextlib
import dataclasses
import gc
import math
import os
import time
import warnings
from pathlib import Path

from convbench.commands import flags
from convbench.base import tables
from convbench.timing.devices import synchronize
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.experiment.pipeline import Observer
from convbench.timing.memory import (GIB, PeakMemory, available_memory, check_regions,
                                     input_depth_range, memory_estimate,
                                     program_transient_bytes)

PROG = "stress_test.py"
DEFAULT_IMPLEMENTATION = "implicitGemm"
#: The estimate must stay within this share of the available memory.
MEMORY_MARGIN = 0.90
#: Off a terminal, a progress line at most this often while a backend runs, seconds.
PROGRESS_HEARTBEAT_S = 10.0


def build_parser(prog: str = PROG) -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_implementation_flag(p, f"a forward one; default: {DEFAULT_IMPLEMENTATION}")
    flags.add_device_flag(p)
    p.add_argument("--size", type=int, default=256, metavar="S",
                   help="edge of the cubic output (default 256); the input edge follows "
                   "from kernel, stride and padding")
    p.add_argument("--in-channels", type=int, default=16, metavar="C")
    p.add_argument("--out-channels", type=int, default=32, metavar="K")
    p.add_argument("--batch", type=int, default=1, metavar="N")
    p.add_argument("--kernel", type=int, default=3, metavar="KS", help="cubic kernel edge (3)")
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--pad", type=int, default=1)
    flags.add_timing_flags(p, warmup=0, iters=3, time_limit=False, heap=False)
    flags.add_threads_flag(p)
    flags.add_seed_flag(p)
    flags.add_param_flag(p)
    flags.add_cachedir_flag(p)
    p.add_argument("--rebuild", action="store_true",
                   help="compile afresh instead of loading a valid stored build")
    p.add_argument("--check", action="store_true",
                   help="verify the DaCe output on a sub-volume against torch float64")
    p.add_argument("--check-planes", type=int, default=2, metavar="P",
                   help="output depth planes checked at each end of the volume (default 2)")
    p.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                   help="pretend the device has at most this much memory available")
    p.add_argument("--skip-torch", action="store_true", help="do not run torch's conv3d")
    flags.add_out_flag(p, "results/<device>/stress_<impl>_<size>.json")
    return p


def _check_args(args) -> None:
    check_at_least(("--size", args.size, 1), ("--in-channels", args.in_channels, 1),
                   ("--out-channels", args.out_channels, 1), ("--batch", args.batch, 1),
                   ("--kernel", args.kernel, 1), ("--stride", args.stride, 1),
                   ("--pad", args.pad, 0), ("--warmup", args.warmupiter, 0),
                   ("--iters", args.totaliter, 1), ("--threads", args.threads, 1),
                   ("--check-planes", args.check_planes, 1))
    limit = args.memory_limit
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise UsageError(f"--memory-limit: must be a positive number of GiB, got {limit}")


def input_edge(size: int, kernel: int, stride: int, pad: int) -> int:
    """The input edge whose output edge is ``size``."""
    return (size - 1) * stride + kernel - 2 * pad


def make_layer(size, in_channels, out_channels, batch, kernel, stride, pad):
    from convbench.layersets.layer import Layer
    edge = input_edge(size, kernel, stride, pad)
    if edge < 1:
        raise UsageError(f"--size {size}: with --kernel {kernel}, --stride {stride} and --pad "
                         f"{pad} the input edge would be {edge}; give a larger --size or a "
                         f"smaller --pad")
    try:
        layer = Layer(f"stress{size}", batch, in_channels, out_channels, edge, edge, edge,
                      kernel, kernel, kernel, stride=stride, pad=pad)
    except ValueError as err:
        raise UsageError(f"layer: {err}") from None
    assert layer.out_d == size, (layer, size)
    return layer


def _layer_of(args, size=None):
    return make_layer(args.size if size is None else size, args.in_channels, args.out_channels,
                      args.batch, args.kernel, args.stride, args.pad)


# -- Memory: refusing a layer that does not fit -------------------------------------------

def _largest_fitting_size(args, device, flush_bytes, usable):
    """The largest ``--size`` below the requested one whose estimate fits, or None."""
    lo, hi, best = 1, args.size - 1, None
    while lo <= hi:  # the estimate grows with the size
        mid = (lo + hi) // 2
        try:
            need = memory_estimate(_layer_of(args, mid), device, flush_bytes,
                                   args.check_planes if args.check else 0,
                                   args.skip_torch)["peak_bytes"]
        except UsageError:
            lo = mid + 1
            continue
        if need <= usable:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def refuse_if_too_big(estimate, available, device, args, flush_bytes, when=""):
    need, usable = estimate["peak_bytes"], MEMORY_MARGIN * available
    if need <= usable:
        return
    hint = "use --size to shrink it"
    if not when:
        smaller = _largest_fitting_size(args, device, flush_bytes, usable)
        if smaller is not None:
            hint = f"use --size {smaller} or less"
    raise UsageError(f"layer needs ~{need / GIB:.1f} GiB, only {available / GIB:.1f} GiB "
                     f"available on {device}{when} (keeping a {100 - 100 * MEMORY_MARGIN:.0f}% "
                     f"margin; {hint})")


# -- The sub-volume check ------------------------------------------------------------------

def input_slab(layer, x, o0: int, o1: int):
    """The sub-layer that computes output planes ``o0 .. o1-1`` of ``layer``, and its input:
    the matching depth slab of ``x`` (logical NCDHW), moved to the CPU, with the depth
    padding written out as zeros (the sub-layer pads height and width only)."""
    import torch
    lo, hi = input_depth_range(layer, o0, o1)
    a, b = max(lo, 0), min(hi, layer.in_d)
    slab = torch.zeros((layer.batch, layer.in_channels, hi - lo, layer.in_h, layer.in_w),
                       dtype=x.dtype)
    if b > a:
        slab[:, :, a - lo:b - lo] = x[:, :, a:b].to("cpu")
    _, ph, pw = layer.pads
    sub = dataclasses.replace(layer, name=f"{layer.name}_d{o0}_{o1}", in_d=hi - lo, pad_d=0,
                              pad_h=ph, pad_w=pw)
    assert sub.out_d == o1 - o0 and sub.out_h == layer.out_h and sub.out_w == layer.out_w
    return sub, slab


def check_subvolume(layer, x, w, y, planes: int = 2, unit_roundoff: float = 2.0 ** -24,
                    random_inputs: bool = True):
    """Check output ``y`` (logical NCDHW, any device or strides) of the forward pass of
    ``layer`` on inputs ``x``, ``w`` (logical, float32) against torch in float64, with the
    tolerance rule of :mod:`convbench.check.verify`, on the depth planes of
    :func:`check_regions`.  ``random_inputs``: x and w were drawn independently and
    uniformly on (-1, 1), as the stress run draws them (the l2 tolerance applies).
    Returns ``[((o0, o1), Check), ...]``."""
    from convkernels.layouts import Pass
    from convbench.check.verify import compare, truth_for
    if tuple(y.shape) != tuple(layer.output_shape):
        raise ValueError(f"output shape {tuple(y.shape)} != {tuple(layer.output_shape)}")
    results = []
    for o0, o1 in check_regions(layer.out_d, planes):
        sub, slab = input_slab(layer, x.detach(), o0, o1)
        truth = truth_for(sub, Pass.FWD, {"x": slab, "w": w},  # float64, on the CPU
                          random_inputs=random_inputs)
        check = compare(y[:, :, o0:o1], truth, unit_roundoff,
                        name=f"torch-fp64 planes {o0}..{o1 - 1}")
        results.append(((o0, o1), check))
        del truth, slab
    return results


# -- Phases --------------------------------------------------------------------------------

def _release(device):
    gc.collect()
    if device == "gpu":
        import torch
        torch.cuda.empty_cache()


class Phases(Observer):
    """What the case runner does per backend, as the stress test needs it: each backend
    is one phase (its preparation, a first untimed call, warm-up and timed calls) under
    its own peak-memory sampler; with ``--check`` the DaCe output of the last timed call
    is checked before its arrays go.  ``records``: the per-backend records, torch first;
    ``checks``: the sub-volume checks (None without ``--check``)."""

    def __init__(self, build, inputs, args):
        self.impl, self.conv = build.spec.impl, build.spec.layer  # not .layer: a hook
        self.unit_roundoff = build.spec.dtype.unit_roundoff
        self.inputs, self.args = inputs, args
        self.records, self.checks = {}, None
        self._first, self._call = {}, None

    @contextlib.contextmanager
    def backend(self, exp, record, name):
        a = self.args
        what = (f"{self.impl.name} (DaCe, {self.impl.layout})" if name == "dace" else
                f"torch conv3d ({'channels_last_3d' if str(self.impl.layout) == 'NDHWC' else 'NCDHW'})")
        print(f"running {what}: 1 first call, {a.warmupiter} warm-up, {a.totaliter} timed",
              flush=True)
        with PeakMemory(exp.device) as memory:
            yield
            synchronize(exp.device)
        self.records[name] = memory.result()
        if name == "dace" and a.check:
            self._check(exp)
        self._call = None
        _release(exp.device)

    def prepared(self, exp, record, name, call):
        synchronize(exp.device)
        if name == "dace":
            first = call.first_ms
            self._call = call  # its output is checked after the timed calls
        else:  # the reference's first call, untimed by the case runner
            t0 = time.perf_counter()
            call()
            synchronize(exp.device)
            first = (time.perf_counter() - t0) * 1e3
        self._first[name] = first
        print(f"  {self.impl.name if name == 'dace' else name}: first call {first:.1f} ms",
              flush=True)

    def timing(self, exp, record, total_calls):
        from convbench.base.progress import Progress
        return Progress(total_calls, label=" ", heartbeat=PROGRESS_HEARTBEAT_S)

    def _check(self, exp):
        from convkernels.layouts import PASS_SIGNATURE, from_layout
        impl, layer, a = self.impl, self.conv, self.args
        out_role = PASS_SIGNATURE[impl.pass_][1]
        regions = check_regions(layer.out_d, a.check_planes)
        print(f"checking {impl.name} against torch float64 on output depth planes "
              f"{', '.join(f'{lo}..{hi - 1}' for lo, hi in regions)} ...", flush=True)
        t0 = time.perf_counter()
        with PeakMemory("cpu") as check_memory:
            self.checks = check_subvolume(
                layer, self.inputs["x"], self.inputs["w"],
                from_layout(self._call.keepalive[out_role], impl.layout, out_role),
                a.check_planes, self.unit_roundoff)
        self.records["dace"].update(check_seconds=time.perf_counter() - t0,
                                    check_peak_mem_bytes=check_memory.result()["peak_mem_bytes"])

    def backend_records(self, record):
        """The per-backend records of the case (torch first), from its measurements."""
        out = []
        for m in sorted(record.measurements, key=lambda m: m.backend == "dace"):
            stats = m.timing.stats()
            head = {"backend": "dace", "implementation": self.impl.name} \
                if m.backend == "dace" else {"backend": m.backend}
            out.append({**head, "first_call_ms": self._first[m.backend],
                        "warmup": m.timing.warmup, "samples_ms": m.timing.samples_ms, **stats,
                        "gflop_per_s": self.conv.flops() / (stats["median_ms"] * 1e-3) / 1e9,
                        **self.records[m.backend]})
        return out


# -- Reporting -----------------------------------------------------------------------------

def _num(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def _mem(nbytes) -> str:
    if nbytes is None:
        return "n/a"
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.1f} MiB"


def format_table(records) -> str:
    def gib(n):
        return "n/a" if n is None else f"{n / GIB:.3f}"
    return tables.aligned(
        ("backend", "first call ms", "median ms", "IQR/median", "GFLOP/s", "peak mem GiB",
         "process peak GiB"),
        [(r.get("implementation", r["backend"]), f"{r['first_call_ms']:.1f}",
          f"{r['median_ms']:.1f}", f"{100 * r['iqr_over_median']:.1f}%"
          if math.isfinite(r["iqr_over_median"]) else "n/a", f"{r['gflop_per_s']:.1f}",
          gib(r["peak_mem_bytes"]), gib(r.get("peak_rss_bytes", r.get("peak_used_bytes"))))
         for r in records])


def summary_line(impl_name, dace, torch_rec, check_ok) -> str:
    text = (f"stress: {impl_name} {_num(dace['median_ms'])} ms "
            f"({_num(dace['gflop_per_s'])} GFLOP/s)")
    if torch_rec is not None:
        ratio = dace["median_ms"] / torch_rec["median_ms"]
        text += (f" vs torch {_num(torch_rec['median_ms'])} ms "
                 f"({_num(torch_rec['gflop_per_s'])} GFLOP/s), ratio {ratio:.1f}x, "
                 f"peak mem dace {_mem(dace['peak_mem_bytes'])} / torch "
                 f"{_mem(torch_rec['peak_mem_bytes'])}")
    else:
        text += f", torch skipped, peak mem dace {_mem(dace['peak_mem_bytes'])}"
    check = {None: "check not run", True: "check passed", False: "check FAILED"}[check_ok]
    return f"{text}, {check}"


# -- main ----------------------------------------------------------------------------------

def _check_writable(path: Path) -> None:
    """Fail now, not after a long run, if the result file cannot be written."""
    if path.is_dir():
        raise UsageError(f"--out: {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out: cannot create {path.parent}: {err.strerror or err}") from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"--out: {path.parent} is not writable")


def _setup(args):
    """Layer, implementation, experiment and parameters, every input checked: a
    UsageError before anything is built or allocated."""
    from convbench import registry
    from convbench.timing import timers as timing
    from convbench.timing.devices import resolve_device, set_threads
    from convbench.experiment.pipeline import (Experiment, TimingOptions,
                                               resolve_implementations)
    from convkernels.layouts import Pass
    layer = _layer_of(args)
    impl, = resolve_implementations([args.implementation or DEFAULT_IMPLEMENTATION])
    if impl.pass_ != Pass.FWD:
        forward = [i.name for i in resolve_implementations(None, Pass.FWD)]
        raise UsageError(f"--implementation: {impl.name} computes {impl.pass_}; the stress test "
                         f"runs forward implementations only ({', '.join(forward)})")
    overrides = registry.parse_param_overrides(args.param)
    threads = set_threads(args.threads)
    device = resolve_device(args.device)
    resolve_implementations([impl.name], Pass.FWD, device)  # a schedule for the device
    exp = Experiment([impl], [layer], device, overrides=overrides, seed=args.seed,
                     policy="rebuild" if args.rebuild else "reuse", cachedir=args.cachedir,
                     verify=False, threads=threads, timing=TimingOptions(
                         warmup=args.warmupiter, iterations=args.totaliter,
                         flush=not args.no_flush, heap="system"))
    params = exp.params(impl, layer)
    reason = impl.unsupported_reason(layer, params)
    if reason:
        raise UsageError(f"{impl.name} does not support this layer ({layer.describe()}): {reason}")
    # The timer's flush buffer, by size: the timer itself allocates it.
    flush_bytes = 0 if args.no_flush else (
        timing.GPU_FLUSH_BYTES if device == "gpu" else timing.cpu_flush_bytes())
    return layer, impl, exp, params, flush_bytes


def _main(argv, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    _check_args(args)
    warnings.simplefilter("ignore")
    from convbench.build import toolchain
    layer, impl, exp, params, flush_bytes = _setup(args)
    device = exp.device

    # Memory, before building or allocating anything.
    check_planes = args.check_planes if args.check else 0
    estimate = memory_estimate(layer, device, flush_bytes, check_planes, args.skip_torch)
    available, source = available_memory(device, args.memory_limit)
    refuse_if_too_big(estimate, available, device, args, flush_bytes)
    out = Path(args.out) if args.out else (toolchain.PROJECT_ROOT / "results" / device
                                           / f"stress_{impl.name}_{args.size}.json")
    _check_writable(out)

    import torch

    from convbench.timing import devices
    from convbench.results import writer as results
    gflop = layer.flops() / 1e9
    print(f"stress test: {impl.name} ({impl.layout}) against torch conv3d on {device}: "
          f"{devices.describe(device)}, threads {torch.get_num_threads()}")
    print(f"layer {layer.describe()} -> output {'x'.join(map(str, layer.output_shape))}, "
          f"{_num(gflop)} GFLOP per call, params {params or 'none'}")
    print(f"memory estimate: torch phase {_mem(estimate['torch_phase_bytes'])}, DaCe phase "
          f"{_mem(estimate['dace_phase_bytes'])}; {_mem(available)} available ({source})",
          flush=True)

    cachedir = Path(args.cachedir) if args.cachedir else toolchain.default_cachedir()
    print(f"building {impl.name} for {device} (cache {cachedir}, {exp.policy}) ...", end=" ",
          flush=True)
    build = exp.build(impl, layer, params)
    print(f"{build.origin} in {build.seconds:.1f} s", flush=True)
    if build.sdfg is not None:
        declared = program_transient_bytes(build.sdfg, torch.get_num_threads())
        estimate = memory_estimate(layer, device, flush_bytes, check_planes, args.skip_torch,
                                   dace_transients=declared)
        print(f"  the program's transients: {_mem(declared)}; DaCe phase "
              f"{_mem(estimate['dace_phase_bytes'])}", flush=True)
        refuse_if_too_big(estimate, available_memory(device, args.memory_limit)[0], device,
                          args, flush_bytes,
                          when=f" (with the {_mem(declared)} of transients its SDFG declares)")

    exp.timer.flush()  # allocate and touch the flush buffer now, so that no phase counts it
    tdev = torch.device("cuda" if device == "gpu" else "cpu")
    gen = torch.Generator(device=tdev).manual_seed(args.seed)
    inputs = {"x": torch.empty(layer.input_shape, device=tdev).uniform_(-1, 1, generator=gen),
              "w": torch.empty(layer.filter_shape, device=tdev).uniform_(-1, 1, generator=gen)}
    exp.observer = phases = Phases(build, inputs, args)
    # In place: a fresh output per call would hold two of them (the peak is measured);
    # with --check it starts as NaN, so what the calls leave unwritten fails.
    case = exp.run_case(impl, layer, params=params, inputs=inputs, catch=False,
                        references=() if args.skip_torch else ("torch",),
                        dace_call={"fill": math.nan if args.check else 0.0, "fresh": False})
    del inputs
    phases.inputs = None
    _release(device)
    records = phases.backend_records(case)
    torch_rec = records[0] if len(records) > 1 else None
    dace_rec, checks = records[-1], phases.checks

    check_ok = None if checks is None else all(c.ok for _, c in checks)
    print()
    print(format_table(records))
    print(f"peak mem: {dace_rec['method']}")
    for (o0, o1), c in checks or []:
        print(f"check planes {o0}..{o1 - 1}: {c.summary()}  {'PASS' if c.ok else 'FAIL'}")
    summary = summary_line(impl.name, dace_rec, torch_rec, check_ok)

    meta = results.run_metadata(toolchain.PROJECT_ROOT, device, exp.threads)
    meta.update({
        "script": prog, "implementation": impl.name, "pass": str(impl.pass_),
        "layout": str(impl.layout), "params": params, "seed": args.seed,
        "layer": {"geometry": layer.describe(), "key": layer.key(), "size": args.size,
                  "input_shape": layer.input_shape, "filter_shape": layer.filter_shape,
                  "output_shape": layer.output_shape, "flops": layer.flops(),
                  "gflop": gflop},
        "memory_estimate": estimate,
        "memory_available": {"bytes": available, "source": source,
                             "margin": MEMORY_MARGIN, "limit_gib": args.memory_limit},
        "peak_memory_method": dace_rec["method"],
        "timing": {"method": exp.timer.method, "first_call": "one untimed call per backend "
                   "before the warm-up", "warmup": args.warmupiter,
                   "iterations": args.totaliter, "flush_bytes": flush_bytes},
        "build": {"origin": build.origin, "seconds": build.seconds, "cachedir": str(cachedir),
                  "policy": exp.policy},
        "check": None if checks is None else {
            "ok": check_ok, "planes_per_end": args.check_planes,
            "reference": "torch float64 on the matching input slab",
            "regions": [{"planes": [o0, o1 - 1], **dataclasses.asdict(c)}
                        for (o0, o1), c in checks]},
        "summary": summary,
    })
    results.save_records(out, meta, records)
    print(summary)
    return 1 if check_ok is False else 0


def main(argv=None, prog: str = PROG) -> int:
    """The stress test on ``argv``; its exit status (2: bad input, 1: the check failed)."""
    return run_main(prog, lambda a: _main(a, prog), argv)
