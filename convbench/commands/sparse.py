"""``convbench sparse verify|bench``: the block-sparse forward kernel (:mod:`convbench.quant.sparse`).

``verify`` checks it at each ``--densities`` value against torch's float64 convolution
with the pruned filter (``--plant``: a kept block skipped, which must fail).  ``bench``
times it at each density, interleaved round by round with our dense float32 forward (the
one the network runs on this machine, or ``--fp32 NAME``), and writes ``samples.csv``,
``summary.csv``, ``metadata.json`` and ``density.png`` (time against density, drawn from
``summary.csv``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.commands import flags, tensorcore
from convbench.commands.int8 import add_run_flags, select
from convbench.commands.rows import metadata, write_csv

PROG = "convbench sparse"
DENSITIES = (100, 75, 50, 25, 10)


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    tensorcore.add_mode_flags(p, "check the CPU kernel, time it, check the 2:4 sparse "
                              "tensor-core kernel bit for bit (its CPU emulation, or the GPU "
                              "with --device gpu), or read that kernel's sm_90 machine code")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                   help="verify-gpu, sass: the tensor-core kernel's operands (default float16)")
    flags.add_layer_flags(p, None, many=True, select=False)
    p.add_argument("--layer", default=None, metavar="NAME,...",
                   help="layers of the sets (default: all)")
    p.add_argument("--densities", default=",".join(map(str, DENSITIES)), metavar="PCT,...",
                   help=f"percent of blocks kept (default {','.join(map(str, DENSITIES))}; "
                   "bench always times 100, the baseline of its ratios)")
    p.add_argument("--pattern", default="blocks", choices=("blocks", "2:4"),
                   help="blocks: the largest blocks of each vector at each density "
                   "(default); 2:4: the 2 largest of every 4 along the reduction (50%%)")
    flags.add_param_flag(p)
    p.add_argument("--plant", action="store_true",
                   help="verify: skip a kept block in the kernel, which must fail (tests)")
    flags.add_seed_flag(p)
    p.add_argument("--fp32", default="", metavar="NAME,...",
                   help="bench: our dense float32 forwards to compare with (default: the "
                   "network's per layer, and the dense direct kernel directConvNDHWCblocked)")
    add_run_flags(p, "outputs/sparse/")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _densities(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--densities: integers from 1 to 100, got {text!r}") from None
    if not values or any(not 1 <= v <= 100 for v in values):
        raise UsageError(f"--densities: integers from 1 to 100, got {text!r}")
    return values


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--rounds", args.rounds, 1), ("--warmup", args.warmup, 0))
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch: must be a positive integer, got {args.batch}")
    if args.mode in ("verify-gpu", "sass"):
        return _gpu(args)
    if args.device == "gpu":
        raise UsageError(f"--device gpu: only verify-gpu runs on the GPU, not {args.mode}")
    densities = _densities(args.densities)
    if args.pattern == "2:4" and not set(densities) <= {100, 50}:
        raise UsageError("--pattern 2:4 keeps 50% (give --densities 100,50 or 50)")
    if args.mode == "bench" and 100 not in densities:
        densities = [100] + densities  # the baseline every ratio is taken against
    from convbench.quant.sparse import KERNEL
    layers, overrides = select(args, KERNEL)
    if "DENSITY" in overrides:
        raise UsageError("--param DENSITY: give --densities")
    from convbench.timing.devices import set_threads
    args.threads = set_threads(args.threads)
    out = Path(args.outdir or f"outputs/sparse/{args.mode}")
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "verify":
        return _verify(args, layers, overrides, densities, out)
    from convbench.commands.int8 import check_fp32
    for _, layer in layers:  # before anything is built or timed
        for density in densities:
            params = sparse_kernel().resolve_params(dict(overrides, DENSITY=density))
            reason = sparse_kernel().unsupported_reason(layer, params)
            if reason:
                raise UsageError(f"{layer.name}: {reason}")
            _pattern(args, layer, density)
        check_fp32(args, layer, dense_forwards(args, layer))
    return _bench(args, layers, overrides, densities, out)


def _gpu(args) -> int:
    """``verify-gpu`` and ``sass``: the 2:4 sparse tensor-core forward on each layer."""
    from convbench.build.precision import DTYPES
    from convbench.quant import sparse
    if args.plant:
        raise UsageError(f"--plant: verify plants errors, {args.mode} does not")
    if args.device == "gpu" and args.mode != "verify-gpu":
        raise UsageError(f"--device gpu: only verify-gpu runs on the GPU, not {args.mode}")
    layers, overrides = select(args, sparse.MMA_KERNEL)
    out = Path(args.outdir or f"outputs/sparse/{args.mode}")
    out.mkdir(parents=True, exist_ok=True)

    def verify(layer, params, seed, device, cachedir, policy):
        return sparse.verify_mma(layer, params, seed, device, cachedir, policy,
                                 dtype=args.dtype)
    return tensorcore.run(args, layers, out, kernel=sparse.MMA_KERNEL, verify=verify,
                          dtype=DTYPES[args.dtype], label="sparse", mismatches="mismatches",
                          overrides=overrides)


def sparse_kernel():
    from convbench.quant.sparse import KERNEL
    return KERNEL


def _verify(args, layers, overrides, densities, out: Path) -> int:
    from convbench.base.files import write_atomic
    from convbench.quant import sparse
    rows, failed = [], 0
    for lset, layer in layers:
        for density in densities:
            params = sparse.KERNEL.resolve_params(dict(overrides, DENSITY=density))
            refusal = sparse.KERNEL.unsupported_reason(layer, params)
            if refusal:
                print(f"{lset} {layer.name} {density}%: unsupported ({refusal})", flush=True)
                rows.append({"layer_set": lset, "layer": layer.name, "batch": layer.batch,
                             "density": density, "status": "unsupported", "reason": refusal})
                continue
            pattern = _pattern(args, layer, density)
            check = sparse.verify(layer, density, overrides, args.seed, args.plant,
                                  args.cachedir, flags.build_policy(args), pattern)
            failed += not check.ok
            print(f"{lset} {layer.name} b{layer.batch} {density}%: "
                  f"{'passed' if check.ok else 'FAILED'}: {check.summary()}", flush=True)
            rows.append({"layer_set": lset, "layer": layer.name, "batch": layer.batch,
                         "density": density, "pattern": pattern,
                         "status": "passed" if check.ok else "failed",
                         "plant": int(args.plant), "worst_err_over_tol": check.worst_ratio,
                         "max_abs": check.max_abs, "rule": check.rule})
    write_csv(out / "verify.csv", rows)
    write_atomic(out / "metadata.json", json.dumps(metadata(args, {
        "mode": "verify", "params": overrides, "densities": densities, "plant": args.plant,
        "pattern": args.pattern,
        "seed": args.seed}), indent=2, default=str))
    passed = sum(r["status"] == "passed" for r in rows)
    print(f"sparse: {passed} passed, {failed} failed, {len(rows) - passed - failed} "
          f"unsupported; {out}")
    return 1 if failed else 0


def _bench(args, layers, overrides, densities, out: Path) -> int:
    from convbench.base.files import write_atomic
    from convbench.check.verify import make_inputs
    from convbench.commands.int8 import fp32_call, time_contestants
    from convbench.experiment.pipeline import Experiment, TimingOptions
    from convbench.quant import sparse
    from convbench.timing.timers import prepared_call
    from convkernels.layouts import Pass
    exp = Experiment([], [layer for _, layer in layers], "cpu", cachedir=args.cachedir,
                     policy=flags.build_policy(args), verify=False,
                     timing=TimingOptions(args.warmup, args.rounds), threads=args.threads)
    samples, summary, chosen = [], [], {}
    for lset, layer in layers:
        inputs = make_inputs(layer, Pass.FWD, args.seed)
        calls = {}
        for density in densities:
            params = dict(overrides, DENSITY=density)
            arrays, _ = sparse.kernel_arrays(inputs["x"], inputs["w"], layer, density,
                                             _pattern(args, layer, density))
            build = sparse.build(layer, params, args.cachedir, flags.build_policy(args))
            calls[f"sparse-{density}"] = prepared_call(build, arrays, "y")
        chosen[layer.name] = []
        for name in dense_forwards(args, layer):
            calls[f"dense-{name}"], _ = fp32_call(args, layer, exp, name)
            chosen[layer.name].append(name)
        head = {"layer_set": lset, "layer": layer.name, "batch": layer.batch}
        med, rows, summed = time_contestants(exp, calls, args, head)
        samples += rows
        fastest = min((n for n in med if n.startswith("dense-")), key=med.get)
        for name, row in summed.items():
            summary.append(dict(row, **{
                "density": int(name.split("-")[1]) if name.startswith("sparse") else 100,
                "fastest_dense": fastest[len("dense-"):],
                "ratio_vs_fastest_dense": med[name] / med[fastest],
                "ratio_vs_sparse-100": med[name] / med["sparse-100"]}))
        print(f"{layer.name} b{layer.batch} (ms, medians of {args.rounds}): "
              + ", ".join(f"{n} {m:.2f}" for n, m in med.items()), flush=True)
        write_csv(out / "samples.csv", samples)
        write_csv(out / "summary.csv", summary)
    write_atomic(out / "metadata.json", json.dumps(metadata(args, {
        "mode": "bench", "params": overrides, "densities": densities, "seed": args.seed,
        "rounds": args.rounds, "warmup": args.warmup, "dense_fp32_forward": chosen,
        "timer": exp.timer.method, "heap": exp.output_rule(),
        "pattern": args.pattern,
        "pruning": ("per vector of output channels, the blocks of largest l2 norm" +
                    (" (2:4 at 50%: the 2 largest of every 4 consecutive blocks)"
                     if args.pattern == "2:4" else ""))}),
        indent=2, default=str))
    plot(out)
    print(f"results: {out}")
    return 0


def _pattern(args, layer, density: int) -> str:
    """The pattern ``density`` is pruned in on ``layer``: 2:4 at 50% where asked (a
    :class:`UsageError` where the layer cannot take it), else blocks."""
    from convbench.quant.sparse import pattern_refusal
    if args.pattern != "2:4" or density != 50:
        return "blocks"
    reason = pattern_refusal(layer, "2:4")
    if reason:
        raise UsageError(f"--pattern 2:4: {layer.name}: {reason}")
    return "2:4"


def dense_forwards(args, layer) -> List[str]:
    """The dense float32 forwards ``bench`` times on ``layer``: ``--fp32``, else the
    network's choice and the dense direct kernel."""
    from convbench.experiment.choice import default_choice
    from convkernels.layouts import Pass
    if args.fp32:
        return [n.strip() for n in args.fp32.split(",") if n.strip()]
    return list(dict.fromkeys([default_choice(layer, Pass.FWD, "cpu")[0],
                               "directConvNDHWCblocked"]))


def plot(folder: Path) -> Path:
    """``density.png``: each layer's time against density, relative to the same kernel at
    100%, with our fastest dense float32 forward as a line, drawn from ``summary.csv``."""
    import csv
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = list(csv.DictReader(open(folder / "summary.csv")))
    meta = json.loads((folder / "metadata.json").read_text())
    fig, ax = plt.subplots(figsize=(6, 4))
    for layer in dict.fromkeys(r["layer"] for r in rows):
        mine = [r for r in rows if r["layer"] == layer and r["contestant"].startswith("sparse")]
        mine.sort(key=lambda r: int(r["density"]))
        line, = ax.plot([int(r["density"]) for r in mine],
                        [float(r["ratio_vs_sparse-100"]) for r in mine], marker="o",
                        label=layer)
        dense = min((r for r in rows if r["layer"] == layer and r["contestant"].startswith("dense-")),
                    key=lambda r: float(r["median_ms"]))
        ax.axhline(float(dense["ratio_vs_sparse-100"]), color=line.get_color(), ls=":", lw=1)
    ax.plot([0, 100], [0, 1], color="grey", lw=0.8, ls="--", label="proportional")
    ax.set_xlabel("density (% of blocks kept)")
    ax.set_ylabel("time / the same kernel at 100%")
    cpu = meta.get("machine") or meta.get("device", {}).get("name", "CPU")
    where = sorted({f"{r['layer_set']} b{r['batch']}" for r in rows})
    ax.set_title(f"Block-sparse float32 forward, {', '.join(where)}, {meta['threads']['torch']} "
                 f"threads\n{cpu} (dotted: our fastest dense float32 forward)", fontsize=8)
    ax.set_xlim(0, 105)
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "density.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
