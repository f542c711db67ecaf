"""Writes README.md's table from the CSV files beside it (python table.py)."""
import csv
import itertools
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEAD = (HERE / "README.md").read_text().split("| implementation |")[0]
rows = ["| implementation | precision | layer | regs | spills | loop instr | HMMA | LDSM / HMMA "
        "| LDGSTS | scalar LDS / HMMA | int / HMMA | IMAD.WIDE | BAR |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
IMPLS = ("implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter")
for suffix, impl, layer_set in itertools.product(("", "-tf32"), IMPLS,
                                                 ("cosmoflow", "cosmoflow_mlperf")):
    for r in csv.DictReader(open(HERE / f"{impl}-{layer_set}{suffix}.csv")):
        if r["main"] != "yes":
            continue
        scalar = sum(float(r[k] or 0) for k in ("lds32_per_fma", "lds64_per_fma",
                                                 "lds16_per_fma"))
        if not int(r["fma"] or 0):  # one K tile: no main loop to read (the whole kernel's counts)
            r = dict(r, fma_share=0, ldsm_per_fma=0, int_per_fma=0)
        rows.append(
            f"| `{impl}` | {r['dtype']} | {layer_set}/{r['layer']} b{r['batch']} | "
            f"{r['registers']} | "
            f"{r['spill_stores']}/{r['spill_loads']} | {r['loop_instructions']} | "
            f"{r['fma']} ({100 * float(r['fma_share']):.1f}%) | "
            f"{float(r['ldsm_per_fma']):.3f} | {r['ldgsts']} | {scalar:g} | "
            f"{float(r['int_per_fma']):.2f} | {r['imad_wide']} | {r['barriers']} |")
(HERE / "README.md").write_text(HEAD + "\n".join(rows) + "\n")
