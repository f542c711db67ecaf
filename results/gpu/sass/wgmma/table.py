"""Writes README.md's table from the CSV files beside it (python table.py)."""
import csv
import itertools
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEAD = (HERE / "README.md").read_text().split("| implementation |")[0]
rows = ["| implementation | precision | layer | regs | spills | loop instr | HGMMA (both by "
        "descriptor) | shared loads in the loop | LDGSTS | stages | dynamic shared | blocks "
        "/ SM | ptxas wgmma notes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
IMPLS = ("implicitGemmWGMMA", "implicitGemmWGMMABwdData", "implicitGemmWGMMABwdFilter")
for suffix, impl, layer_set in itertools.product(("", "-bf16", "-tf32"), IMPLS,
                                                 ("cosmoflow", "cosmoflow_mlperf")):
    for r in csv.DictReader(open(HERE / f"{impl}-{layer_set}{suffix}.csv")):
        if r["main"] != "yes":
            continue
        loads = sum(float(r[k] or 0) * int(r["fma"] or 0)
                    for k in ("lds32_per_fma", "lds64_per_fma", "lds128_per_fma",
                              "ldsm_per_fma", "lds16_per_fma"))
        stages = dict(kv.split("=") for kv in r["config"].split(";"))["stages"]
        rows.append(
            f"| `{impl}` | {r['dtype']} | {layer_set}/{r['layer']} b{r['batch']} | "
            f"{r['registers']} | {r['spill_stores']}/{r['spill_loads']} | "
            f"{r['loop_instructions']} | {r['hgmma']} ({r['hgmma_ss']}) | {loads:g} | "
            f"{r['ldgsts']} | {stages} | {int(r['dynamic_shared']) // 1024} KiB | "
            f"{r['blocks_per_sm']} | {r['wgmma_notes'] or 'none'} |")
(HERE / "README.md").write_text(HEAD + "\n".join(rows) + "\n")
