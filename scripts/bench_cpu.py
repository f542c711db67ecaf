#!/usr/bin/env python3
"""CPU benchmark: torch's conv3d against every DaCe forward implementation, per layer.

    python scripts/bench_cpu.py --paramscsv cosmoflow_mlperf --paramscsv cosmoflow --batch 2
                                [--impls NAME,...] [--warmup 2] [--samples 7] [--threads 2]
                                [--skip-slower 20] [--no-flush] [--outdir DIR] [--cachedir DIR]

Per layer, in one process and with one thread count for all:

* torch's conv3d in both memory formats (NCDHW and channels_last_3d); the faster
  (by median) is "torch";
* every forward implementation with a CPU schedule, with its tuned parameters
  (``tuning/cpu.json``, see :mod:`convbench.tuning`);
* torch's first call, and each DaCe build's initialising call, screen: an implementation
  whose first call takes more than ``--skip-slower`` times torch's is not sampled (its
  time is recorded in the metadata); the others are verified against float64 torch (a
  wrong kernel's time is not reported) and get ``--warmup`` untimed calls in all;
* then ``--samples`` rounds, interleaved: in each round every backend is called once,
  with the caches flushed before each call (as ``--compareprof``).

The table gives, per layer, torch's median (and layout), the best DaCe-generated
implementation and its median, their ratio, and the percentages of the SGEMM peak
and of the FMA peak measured at start (:mod:`convbench.ceilings`; GFLOP/s count every
tap, so a kernel that skips the zero border taps of a padded layer can pass them).
``im2colGemm`` (which calls MKL's SGEMM) has its own column and is not counted as
DaCe-generated.  The last line is ``max best/torch ratio: R``.  Result
files (``samples.csv``, ``summary.csv``, ``metadata.json``, plus ``table.md``) go to
``--outdir`` (default ``results/cpu/bench_cpu_<sets>_b<B>/``).
"""

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convbench.errors import (ArgumentParser, UsageError, add_cachedir_flag,  # noqa: E402
                              add_outdir_flag, add_threads_flag, check_at_least, run_main)

PROG = "bench_cpu.py"
#: Implementations whose arithmetic is a vendor BLAS call, not DaCe-generated code.
VENDOR = {"im2colGemm"}


def build_parser():
    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--paramscsv", action="append", default=None, metavar="SET",
                   help="layer set (repeatable; default: cosmoflow_mlperf and cosmoflow)")
    p.add_argument("--batch", type=int, default=2, metavar="N", help="batch size (default 2)")
    p.add_argument("--impls", default=None, metavar="A,B",
                   help="forward implementations to time (default: every one with a CPU "
                   "schedule)")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help="untimed calls per backend and layer (default 2)")
    p.add_argument("--samples", type=int, default=7, metavar="N",
                   help="interleaved timed rounds (default 7, at least 5)")
    add_threads_flag(p, default=2)
    p.add_argument("--skip-slower", type=float, default=20.0, metavar="X",
                   help="do not sample an implementation whose first call is X times "
                   "torch's (default 20)")
    p.add_argument("--no-flush", action="store_true", help="do not flush caches between calls")
    add_outdir_flag(p, "results/cpu/bench_cpu_<sets>_b<B>/")
    add_cachedir_flag(p)
    return p


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    check_at_least(("--batch", args.batch, 1), ("--samples", args.samples, 5),
                   ("--warmup", args.warmup, 1), ("--threads", args.threads, 1))
    if not args.skip_slower > 1:
        raise UsageError(f"--skip-slower: must be > 1, got {args.skip_slower}")
    from convbench import registry
    from convbench.cli import set_threads
    from convbench.layers import load_layers
    from convbench.layouts import Pass

    sets = args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"]
    layers = [(s, layer.with_batch(args.batch)) for s in sets for layer in load_layers(s)]
    forward = {n: i for n, i in registry.all_implementations().items()
               if i.pass_ == Pass.FWD and "cpu" in i.targets}
    names = sorted(forward) if args.impls is None else [n.strip() for n in args.impls.split(",")]
    for name in names:
        if name not in forward:
            raise UsageError(f"--impls: '{name}' is not a forward implementation with a CPU "
                             f"schedule (those: {', '.join(sorted(forward))})")
    set_threads(args.threads)
    outdir = Path(args.outdir) if args.outdir else \
        ROOT / "results" / "cpu" / f"bench_cpu_{'+'.join(Path(s).stem for s in sets)}_b{args.batch}"
    return Bench(args, layers, [forward[n] for n in names], outdir).run()


def main(argv=None) -> int:
    return run_main(PROG, _main, argv)


class Bench:
    def __init__(self, args, layers, impls, outdir):
        self.args, self.layers, self.impls, self.outdir = args, layers, impls, outdir

    def run(self) -> int:
        import torch

        from convbench import ceilings
        from convbench.results import RunWriter, run_metadata
        from convbench.timing import CpuTimer
        a = self.args
        print(f"measuring the CPU ceilings ({torch.get_num_threads()} threads) ...", flush=True)
        self.ceil = ceilings.measure("cpu")
        peak = self.ceil.get("peak_gflops")
        fma = self.ceil.get("fma_peak_gflops") or math.nan
        print(f"SGEMM peak {peak:.1f} GFLOP/s, FMA peak {fma:.1f} GFLOP/s, copy "
              f"{self.ceil.get('bandwidth_gbs', math.nan):.1f} GB/s", flush=True)
        self.timer = CpuTimer(flush=not a.no_flush)
        meta = run_metadata(ROOT, "cpu", a.threads)
        meta.update(kind="bench_cpu", batch=a.batch, ceilings=self.ceil, references=["torch"],
                    timing={"method": self.timer.method, "warmup": a.warmup,
                            "samples": a.samples, "interleaved": True,
                            "flush_bytes": self.timer.flush_bytes},
                    implementations=[i.name for i in self.impls], vendor=sorted(VENDOR),
                    skip_slower=a.skip_slower, layers={})
        writer = RunWriter(self.outdir, meta, ["torch"])
        rows = []
        for index, (layer_set, layer) in enumerate(self.layers):
            rows.append(self._layer(index, layer_set, layer, writer))
        writer.finish()
        table = self._table(rows, peak, fma)
        (self.outdir / "table.md").write_text(table + "\n")
        print(table)
        worst = max(r["ratio"] for r in rows)
        print(f"results: {self.outdir}/")
        print(f"max best/torch ratio: {worst:.3f}")
        return 0

    # -- one layer ------------------------------------------------------------------------
    def _layer(self, index, layer_set, layer, writer):
        import torch
        import torch.nn.functional as F

        from convbench import toolchain, tuning, verify
        from convbench.results import Measurement
        from convbench.timing import Timing, prepared_call, summarize
        a = self.args
        label = f"{Path(layer_set).stem}/{layer.name}"
        print(f"[{index + 1}/{len(self.layers)}] {label}: {layer.describe()}", flush=True)
        reference = verify.make_reference(layer)
        x, w = reference.inputs["x"], reference.inputs["w"]
        xl = x.contiguous(memory_format=torch.channels_last_3d)
        wl = w.contiguous(memory_format=torch.channels_last_3d)
        conv = dict(stride=layer.stride, padding=layer.pads)
        calls = {"torch-ncdhw": lambda: F.conv3d(x, w, **conv),
                 "torch-ndhwc": lambda: F.conv3d(xl, wl, **conv)}
        info, builds = {}, {}
        for impl in self.impls:
            params = tuning.tuned_params(impl, layer, "cpu")
            reason = impl.unsupported_reason(layer, params)
            if reason:
                info[impl.name] = {"status": "unsupported", "reason": reason}
                continue
            t0 = time.perf_counter()
            builds[impl.name] = toolchain.build(toolchain.make_spec(impl, layer, params=params),
                                                a.cachedir, policy="reuse")
            info[impl.name] = {"params": params, "build": builds[impl.name].origin,
                               "build_s": round(time.perf_counter() - t0, 2)}
            arrays = verify.program_arrays(impl, layer, reference.inputs)
            calls[impl.name] = prepared_call(builds[impl.name], arrays)  # one (untimed) call
        with torch.no_grad():
            # torch's first (flushed) call is the yardstick; a DaCe build is screened on
            # its initialising call (in prepared_call), so a very slow one runs only once.
            first = {n: self.timer.once(fn) for n, fn in calls.items() if n.startswith("torch")}
            first.update({n: fn.first_ms for n, fn in calls.items() if n not in first})
            torch_first = min(first["torch-ncdhw"], first["torch-ndhwc"])
            active = {}
            for name, fn in calls.items():
                if name.startswith("torch"):
                    for _ in range(a.warmup - 1):
                        self.timer.once(fn)
                    active[name] = fn
                    continue
                info[name]["first_call_ms"] = first[name]
                if first[name] > a.skip_slower * torch_first:
                    info[name]["status"] = (f"skipped: first call {first[name]:.1f} ms > "
                                            f"{a.skip_slower:g}x torch")
                    print(f"  {name}: {first[name]:.0f} ms, skipped (> {a.skip_slower:g}x "
                          "torch)", flush=True)
                    continue
                # Verified before it is timed: a wrong kernel's time is not reported.
                check = verify.verify_build(builds[name], reference)[0]
                info[name].update(verified=check.ok, err_over_tol=check.worst_ratio)
                if not check.ok:
                    info[name]["status"] = "wrong"
                    print(f"  {name}: WRONG ({check.summary()}), not timed", flush=True)
                    continue
                for _ in range(a.warmup - 1):
                    self.timer.once(fn)
                active[name] = fn
            samples = self.timer.interleaved(active, a.samples)
        med = {n: summarize(s)["median_ms"] for n, s in samples.items()}
        torch_name = min(("torch-ncdhw", "torch-ndhwc"), key=lambda n: med[n])
        measurements = [Measurement("torch", Timing(samples[torch_name], a.warmup, self.timer.method))]
        measurements += [Measurement(n, Timing(s, a.warmup, self.timer.method))
                         for n, s in samples.items()]
        for name in med:
            if name in info:
                info[name]["status"] = "timed"
        writer.metadata["layers"][label] = dict(info, torch_layout=torch_name)
        writer.add_layer(index, layer, label, measurements, extra={"set": layer_set})
        generated = {n: t for n, t in med.items() if not n.startswith("torch") and n not in VENDOR}
        best = min(generated, key=generated.get) if generated else None
        row = {"label": label, "layer": layer, "torch": med[torch_name], "torch_layout": torch_name,
               "best": best, "best_ms": generated.get(best, math.nan),
               "vendor": {n: med.get(n, math.nan) for n in VENDOR}}
        row["ratio"] = row["best_ms"] / row["torch"] if best else math.inf
        print(f"  torch {row['torch']:.2f} ms ({torch_name[6:]}), best DaCe {best} "
              f"{row['best_ms']:.2f} ms, ratio {row['ratio']:.2f}", flush=True)
        return row

    def _table(self, rows, peak, fma) -> str:
        lines = ["| layer | geometry | torch ms (layout) | best DaCe-generated | ms | ratio | "
                 "GFLOP/s | % of SGEMM peak | % of FMA peak | im2colGemm (MKL) ms |",
                 "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            gflops = r["layer"].flops() / (r["best_ms"] * 1e-3) / 1e9 if r["best"] else math.nan
            vendor = r["vendor"].get("im2colGemm", math.nan)
            lines.append(f"| {r['label']} | {r['layer'].describe()} | {r['torch']:.2f} "
                         f"({r['torch_layout'][6:]}) | {r['best']} | {r['best_ms']:.2f} | "
                         f"{r['ratio']:.2f} | {gflops:.1f} | {100 * gflops / peak:.0f}% | "
                         f"{100 * gflops / fma:.0f}% | {vendor:.2f} |")
        return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
