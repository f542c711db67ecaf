"""``convbench int8 verify|bench``: the int8 forward kernel (:mod:`convbench.quant.int8`).

``verify`` checks it exactly on each layer (int32 sums bit for bit, the uint8 output
against the float64 requantization, and within one unit of torch's quantized
``Conv3d``), ``--plant`` planting an error that must fail.  ``bench`` times it, interleaved
round by round, against our float32 forward (the one the network would run on this
machine, or ``--fp32 NAME``) and torch's quantized ``Conv3d`` on each engine, and writes
``samples.csv``, ``summary.csv`` and ``metadata.json``.
``profile_conv3d.py --dtype int8 --verify/--compareprof`` runs the same.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path
from typing import Dict

from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.commands import flags, tensorcore
from convbench.commands.rows import metadata, write_csv

PROG = "convbench int8"
ENGINES = ("x86", "fbgemm", "onednn")


def build_parser(prog: str = PROG):
    from convbench.quant.int8 import PLANTS
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    tensorcore.add_mode_flags(p, "check the CPU kernel exactly, time it, check the int8 "
                              "tensor-core kernel (its CPU emulation, or the GPU with "
                              "--device gpu), or read that kernel's sm_90 machine code")
    flags.add_layer_flags(p, None, many=True, select=False)
    p.add_argument("--layer", default=None, metavar="NAME,...",
                   help="layers of the sets (default: all)")
    p.add_argument("--kernel", default="all", choices=("all", "direct", "winograd"),
                   help="verify, bench: our int8 CPU kernels to run: the direct one "
                   "(vpdpbusd), the exact Winograd one (vpdpwssd), or both (default)")
    flags.add_param_flag(p)
    p.add_argument("--plant", default="", choices=("",) + PLANTS,
                   help="verify: plant an error, which must fail (tests)")
    flags.add_seed_flag(p)
    p.add_argument("--engines", default=",".join(ENGINES), metavar="E,...",
                   help=f"bench: torch's quantized engines to time (default {','.join(ENGINES)})")
    p.add_argument("--fp32", default="", metavar="NAME",
                   help="bench: our float32 forward to compare with (default: the one the "
                   "network runs on this machine per layer)")
    p.add_argument("--no-check", action="store_true",
                   help="bench: skip the check of the timed kernel's output")
    add_run_flags(p, "outputs/int8/")
    return p


def add_run_flags(p, outdir: str) -> None:
    """What ``convbench int8`` and ``convbench sparse`` share past their layers: the
    bench's rounds and warm-up calls, threads, builds and the result folder."""
    p.add_argument("--rounds", type=int, default=5, metavar="N",
                   help="bench: interleaved rounds, one timed call of each contestant per "
                   "round (default 5)")
    p.add_argument("--warmup", type=int, default=2, metavar="N",
                   help="bench: untimed calls of each contestant first (default 2)")
    flags.add_threads_flag(p)
    flags.add_build_flags(p)
    flags.add_outdir_flag(p, outdir)


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    return run(args)


def select(args, kernel=None):
    """The ``(set, layer)`` pairs the flags name (``--batch`` applied), and the parameter
    overrides of ``kernel`` (default: the int8 kernel), checked."""
    from convbench.layersets.sets import load_layers
    overrides = _overrides(args, kernel)
    sets = args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"]
    if isinstance(sets, str):
        sets = [sets]
    layers = [(s, layer.with_batch(args.batch) if args.batch else layer)
              for s in sets for layer in load_layers(s)]
    return flags.pick_layers(layers, getattr(args, "layer", None)), overrides


def cpu_kernels(args):
    """Our int8 CPU kernels that ``--kernel`` names (``convbench.quant.int8.KERNELS``)."""
    from convbench.quant.int8 import KERNELS
    which = getattr(args, "kernel", "all")
    return list(KERNELS.values()) if which == "all" else [KERNELS[which]]


def _overrides(args, kernel=None):
    """``--param``, checked against the kernel's parameters (default: the one kernel
    ``--kernel`` names; with both, ``--param`` is refused)."""
    from convbench import registry
    overrides = registry.parse_param_overrides(args.param)
    if kernel is None:
        kernels = cpu_kernels(args)
        if overrides and len(kernels) > 1:
            raise UsageError("--param: give --kernel direct or --kernel winograd (their "
                             "parameters differ)")
        kernel = kernels[0]
    kernel.resolve_params(overrides)
    return overrides


def run(args, layers=None) -> int:
    """Either mode, on parsed flags (this command's, or profile_conv3d's with --dtype int8,
    which selects the ``(set, layer)`` pairs itself)."""
    check_at_least(("--rounds", getattr(args, "rounds", 1), 1),
                   ("--warmup", getattr(args, "warmup", 0), 0))
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch: must be a positive integer, got {args.batch}")
    engines = [e.strip() for e in getattr(args, "engines", ",".join(ENGINES)).split(",")
               if e.strip()]
    if getattr(args, "device", "cpu") == "gpu" and args.mode != "verify-gpu":
        raise UsageError(f"--device gpu: only verify-gpu runs on the GPU, not {args.mode}")
    if getattr(args, "plant", "") and args.mode != "verify":
        raise UsageError(f"--plant: verify plants errors, {args.mode} does not")
    from convbench.quant.int8 import GPU_KERNEL
    kernel = GPU_KERNEL if args.mode in ("verify-gpu", "sass") else None
    if layers is None:
        layers, overrides = select(args, kernel)
    else:
        overrides = _overrides(args, kernel)
    from convbench.timing.devices import set_threads
    args.threads = set_threads(args.threads)
    import torch
    unknown = sorted(set(engines) - set(torch.backends.quantized.supported_engines))
    if unknown:
        raise UsageError(f"--engines: torch here has no {', '.join(unknown)} (it has "
                         f"{', '.join(torch.backends.quantized.supported_engines)})")
    warnings.filterwarnings("ignore", message=".*quantized tensor creation.*")
    out = Path(args.outdir or f"outputs/int8/{args.mode}")
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "verify":
        return _verify(args, layers, overrides, out)
    if args.mode in ("verify-gpu", "sass"):
        return _gpu(args, layers, out)
    for _, layer in layers:  # before anything is built or timed
        check_fp32(args, layer)
    return _bench(args, layers, overrides, engines, out)


def _verify(args, layers, overrides, out: Path) -> int:
    from convbench.base.files import write_atomic
    from convbench.quant import int8
    rows, failed = [], 0
    for lset, layer in layers:
        for kernel in cpu_kernels(args):
            head = {"layer_set": lset, "layer": layer.name, "batch": layer.batch,
                    "kernel": kernel.name}
            refusal = kernel.unsupported_reason(layer, kernel.resolve_params(overrides))
            if refusal:
                print(f"{lset} {layer.name} {kernel.name}: unsupported ({refusal})", flush=True)
                rows.append(dict(head, status="unsupported", reason=refusal))
                continue
            row = int8.verify(layer, overrides, args.seed, args.plant, cachedir=args.cachedir,
                              policy=flags.build_policy(args), kernel=kernel)
            failed += not row["ok"]
            status = "passed" if row["ok"] else "FAILED"
            torch_text = (f", torch x86 within {row['torch_max_diff']} "
                          f"({row['torch_off_by_one']} off by one)"
                          if "torch_max_diff" in row else "")
            print(f"{lset} {layer.name} b{layer.batch} {kernel.name}: {status}: int32 "
                  f"{row['int32_mismatches']} of {row['elements']} differ, uint8 "
                  f"{row['uint8_violations']} beyond the rounding{torch_text}", flush=True)
            rows.append(dict(head, status=status.lower(), plant=args.plant, **row))
    write_csv(out / "verify.csv", rows)
    write_atomic(out / "metadata.json", json.dumps(metadata(args, {
        "mode": "verify", "params": overrides, "plant": args.plant, "seed": args.seed,
        "kernels": [k.name for k in cpu_kernels(args)]}), indent=2, default=str))
    passed = sum(r.get("status") == "passed" for r in rows)
    print(f"int8: {passed} passed, {failed} failed, "
          f"{sum(r.get('status') == 'unsupported' for r in rows)} unsupported "
          f"(of {len(rows)} kernel-layer pairs); {out}")
    return 1 if failed else 0


def check_fp32(args, layer, names=None) -> None:
    """A :class:`UsageError` unless every float32 forward to compare with on ``layer``
    (``names``, else ``--fp32``, else the network's choice) is a CPU forward that takes
    it."""
    from convbench import registry
    from convbench.experiment.choice import default_choice
    from convkernels.layouts import Pass
    for name in names or [args.fp32 or default_choice(layer, Pass.FWD, "cpu")[0]]:
        impl = registry.get(name)  # an unknown name: its one-line error
        if impl.pass_ != Pass.FWD or "cpu" not in impl.targets:
            raise UsageError(f"--fp32 {name}: not a forward pass with a CPU schedule")
        reason = impl.unsupported_reason(layer, impl.resolve_params({}))
        if reason:
            raise UsageError(f"--fp32 {name}: {layer.name}: {reason}")


def fp32_call(args, layer, exp, name: str = ""):
    """Our float32 forward on ``layer`` (``name``, else ``--fp32``, else the network's):
    a prepared call and the implementation's name."""
    from convbench.check.verify import make_inputs
    from convbench.experiment.choice import default_choice
    from convkernels.layouts import Pass
    from convbench import registry
    name = name or args.fp32 or default_choice(layer, Pass.FWD, "cpu")[0]
    impl = registry.get(name)
    build = exp.build(impl, layer)
    return exp.call(build, make_inputs(layer, Pass.FWD, args.seed)), name


def _gpu(args, layers, out: Path) -> int:
    """``verify-gpu`` and ``sass``: the int8 tensor-core kernel on each layer."""
    from convbench.build.precision import INT8
    from convbench.quant import int8
    return tensorcore.run(args, layers, out, kernel=int8.GPU_KERNEL, verify=int8.verify_gpu,
                          dtype=INT8, label="int8", mismatches="int32_mismatches",
                          overrides=_overrides(args, int8.GPU_KERNEL))


def time_contestants(exp, calls, args, head):
    """``args.warmup`` untimed calls of each of ``calls``, then ``args.rounds`` interleaved
    rounds (the experiment's timer, in its timed section): ``(medians, sample rows,
    summary rows by contestant)``, every row starting with ``head``."""
    import statistics
    from convbench.timing.timers import summarize
    with exp.timed_section():
        for call in calls.values():
            for _ in range(args.warmup):
                call()
        got = exp.timer.interleaved(calls, args.rounds)
    samples, summary = [], {}
    for name, values in got.items():
        samples += [dict(head, contestant=name, round=r, ms=v) for r, v in enumerate(values)]
        s = summarize(values)
        summary[name] = dict(head, contestant=name, max_ms=max(values), **{
            k: s[k] for k in ("samples", "median_ms", "q1_ms", "q3_ms", "min_ms")})
    return {name: statistics.median(v) for name, v in got.items()}, samples, summary


def _mix(build, params, kernel) -> Dict[str, int]:
    """The instruction mix of the build's main loop (:mod:`convbench.build.cpumix`, the loop
    with the most of the kernel's product instruction); empty where it cannot be read (no
    objdump)."""
    from convbench.build import cpumix
    from convbench.quant.int8 import WINOGRAD_KERNEL
    from convkernels.cpu.direct import int8_dot
    from convkernels.cpu.winograd import int8 as wq
    products = wq.PRODUCTS if kernel is WINOGRAD_KERNEL else int8_dot.PRODUCTS
    product = products[int8_dot.isa_of(kernel.resolve_params(params))]
    try:
        return cpumix.main_loop_mix(cpumix.library_of(build), product)
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        print(f"no instruction mix: {err}")
        return {}


#: The contestant name of each int8 CPU kernel in a bench's files.
CONTESTANTS = {"directConvNDHWCint8": "dace-int8", "winogradF2int8": "dace-int8-winograd"}


def _bench(args, layers, overrides, engines, out: Path) -> int:
    from convbench.base.files import write_atomic
    from convbench.experiment.pipeline import Experiment, TimingOptions
    from convbench.quant import int8
    from convbench.timing.timers import prepared_call
    exp = Experiment([], [layer for _, layer in layers], "cpu", cachedir=args.cachedir,
                     policy=flags.build_policy(args), verify=False,
                     timing=TimingOptions(args.warmup, args.rounds), threads=args.threads)
    samples, summary, checks, chosen, mixes = [], [], {}, {}, {}
    failed = 0
    for lset, layer in layers:
        params = dict(overrides, OUT=1)
        case, calls = None, {}
        for kernel in cpu_kernels(args):
            refusal = kernel.unsupported_reason(layer, kernel.resolve_params(params))
            if refusal:
                print(f"{layer.name} {kernel.name}: unsupported ({refusal})", flush=True)
                continue
            case = case or int8.make_case(layer, args.seed)
            arrays = int8.kernel_arrays(case, 1, params=params, kernel=kernel)
            build = int8.build(layer, params, args.cachedir, flags.build_policy(args), kernel)
            call = prepared_call(build, arrays, "y")  # its first call fills arrays["y"]
            mixes[f"{layer.name}/{kernel.name}"] = _mix(build, params, kernel)
            if not args.no_check:  # the timed build's own output, checked
                sums = int8.exact_sums(case)
                f, slack = int8.requantized(case, sums)
                bad = int8.u8_violations(arrays["y"].permute(0, 4, 1, 2, 3), f, slack, case.zy)
                checks[f"{layer.name}/{kernel.name}"] = bad
                if bad:  # not timed: a kernel that computes the wrong thing has no speed
                    print(f"{layer.name}: FAILED: {kernel.name}'s output fails its check "
                          f"({bad} values); not timed", flush=True)
                    failed += 1
                    continue
            calls[CONTESTANTS[kernel.name]] = call
        if not calls:
            continue
        for engine in engines:
            calls[f"torch-int8-{engine}"] = int8.torch_quantized(case, engine)
        calls["dace-fp32"], chosen[layer.name] = fp32_call(args, layer, exp)
        head = {"layer_set": lset, "layer": layer.name, "batch": layer.batch}
        med, rows, summed = time_contestants(exp, calls, args, head)
        samples += rows
        best_torch = min((m for n, m in med.items() if n.startswith("torch-int8")), default=None)
        for name, row in summed.items():
            summary.append(dict(row, **{
                "ratio_vs_dace-fp32": med[name] / med["dace-fp32"],
                "ratio_vs_best_torch_int8": med[name] / best_torch if best_torch else ""}))
        line = ", ".join(f"{n} {m:.2f}" for n, m in med.items())
        ratios = "; ".join(
            f"{n}/fp32 {med[n] / med['dace-fp32']:.2f}x"
            + (f", /best torch int8 {med[n] / best_torch:.2f}x" if best_torch else "")
            for n in CONTESTANTS.values() if n in med)
        print(f"{layer.name} b{layer.batch} (ms, medians of {args.rounds}): {line}; {ratios}",
              flush=True)
        write_csv(out / "samples.csv", samples)  # after every layer: a long run keeps them
        write_csv(out / "summary.csv", summary)
    write_atomic(out / "metadata.json", json.dumps(metadata(args, {
        "mode": "bench", "params": overrides, "seed": args.seed, "rounds": args.rounds,
        "warmup": args.warmup, "engines": engines, "fp32_forward": chosen,
        "timer": exp.timer.method, "heap": exp.output_rule(),
        "check_violations": checks,
        "kernels": {k.name: int8.describe_build(overrides, k) for k in cpu_kernels(args)},
        "main_loop_mix": mixes}),
        indent=2, default=str))
    print(f"results: {out}")
    return 1 if failed else 0
