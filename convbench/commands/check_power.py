"""The verification's power per layer and pass: worst err/tol of a correct float32 result
and of planted wrong ones, under the l2 and the sum|t| tolerances (convbench.check.power).

Writes ``power.csv``, ``power.md`` and ``metadata.json`` into ``--outdir``.  Float64
convolutions on the CPU: CosmoFlow's first layers at batch 1 take a minute or two each.
"""

import json
from pathlib import Path

from convbench.commands import flags
from convbench.base.errors import ArgumentParser, check_at_least, run_main

PROG = "check_power.py"
PASSES = ("fwd", "bwd_data", "bwd_filter")


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    flags.add_layer_flags(p, None, many=True, batch_default=1, select=False)
    p.add_argument("--layer", default=None, metavar="NAME,...",
                   help="layers of the sets to measure (default: all)")
    p.add_argument("--pass", dest="passes", default=",".join(PASSES), metavar="PASS,...",
                   help="passes (default fwd,bwd_data,bwd_filter)")
    flags.add_seed_flag(p)
    flags.add_outdir_flag(p, "outputs/check_power/")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    check_at_least(("--batch", args.batch, 1))
    from convbench.commands.profile_conv3d import resolve_pass
    passes = [str(resolve_pass(p.strip())) for p in args.passes.split(",") if p.strip()]
    from convbench.layersets.sets import load_layers
    sets = args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"]
    layers = [(s, layer.with_batch(args.batch)) for s in sets for layer in load_layers(s)]
    layers = flags.pick_layers(layers, args.layer)
    from convbench.check import power
    from convbench.base import tables
    from convbench.results.writer import run_metadata
    from convbench.build.toolchain import PROJECT_ROOT
    out = Path(args.outdir or "outputs/check_power")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for lset, layer in layers:
        for p in passes:
            for row in power.measure(layer, p, seed=args.seed):
                rows.append(dict(row, layer_set=lset))
                wino = "".join(f"  {k[6:]} {row[k]:.4g}" for k in row
                               if k.startswith("bound_") and not k.endswith("_ok"))
                print(f"{lset} {layer.name} b{layer.batch} {p:<10} L={row['reduction_len']:>8} "
                      f"{row['result']:<10} l2 {row['l2_err_over_tol']:10.4g} "
                      f"sum|t| {row['sumabs_err_over_tol']:10.4g}{wino}", flush=True)
    columns = ["layer_set", "layer", "batch", "pass", "reduction_len", "result", "must_pass",
               "l2_err_over_tol", "l2_ok", "sumabs_err_over_tol", "sumabs_ok"]
    columns += [c for c in dict.fromkeys(k for r in rows for k in r if k.startswith("bound_"))]
    (out / "power.csv").write_text("\n".join([",".join(columns)] + [
        ",".join(str(r.get(c, "")) for c in columns) for r in rows]) + "\n")

    def verdict(r, ratio, ok):
        return f"{r[ratio]:.3g}" + ("" if r[ok] == r["must_pass"] else " (!)")

    table = [[r["layer_set"], r["layer"], r["batch"], r["pass"], r["reduction_len"], r["result"],
              verdict(r, "l2_err_over_tol", "l2_ok"), verdict(r, "sumabs_err_over_tol", "sumabs_ok"),
              ", ".join(f"{k[6:]} {verdict(r, k, k + '_ok')}" for k in r
                        if k.startswith("bound_") and not k.endswith("_ok")) or "-"]
             for r in rows]
    (out / "power.md").write_text(
        "Worst err/tol over the output elements (pass iff <= 1). `(!)`: the verdict is wrong "
        "(a correct result failed, or a wrong one passed). Winograd bounds: the error bound "
        "of each Winograd kernel that computes the layer's pass, on these random inputs "
        "(the statistical one, convkernels.winograd.algebra), scored on the same results.\n\n"
        + tables.markdown(
            ["set", "layer", "batch", "pass", "L", "result", "l2 (verdict)", "sum|t| (before)",
             "Winograd bounds"], table, "llrlrlrrl") + "\n")
    meta = run_metadata(PROJECT_ROOT, "cpu", None)
    meta.update(kind="check_power", seed=args.seed, layers=[f"{s}/{lay.name}" for s, lay in layers],
                passes=passes)
    (out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    wrong = [r for r in rows if r["l2_ok"] != r["must_pass"] or any(
        r[k] != r["must_pass"] for k in r if k.startswith("bound_") and k.endswith("_ok"))]
    print(f"{len(rows)} results, {len(wrong)} with a wrong verdict under the l2 tolerance or a "
          f"Winograd bound; {out}/power.md")
    return 1 if wrong else 0
