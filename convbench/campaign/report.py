"""The campaign's table: the best DaCe implementation per layer and pass against the
fastest vendor path, its README and summary.csv, and the index of results/gpu/."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from convbench.results import writer
from convbench.base import tables
from convbench.results.schema import TORCH_AMP as AMP
from convbench.base.files import write_atomic
from .folder import _now
from .plan import PHASES, V100_RATIOS


def problem_key(case: dict) -> tuple:
    """What the references are timed once for: (set, layer, batch, pass, precision)."""
    from .. import registry
    impl = registry.get(case["impl"])
    return (case["layer_set"], case["layer"]["name"], case["layer"]["batch"],
            str(impl.pass_), case.get("dtype") or impl.precisions[0])


def best_per_layer(records: Iterable[dict]) -> Dict[tuple, dict]:
    """Per (set, layer, batch, pass, precision): the fastest verified DaCe record, and the
    references' medians (in that precision) from whichever record timed them."""
    rows: Dict[tuple, dict] = {}
    for rec in records:
        case = rec.get("case", {})
        if case.get("planted") or "timings" not in rec:
            continue
        key = problem_key(case)
        row = rows.setdefault(key, {"best": None, "refs": {}, "gflop": rec.get("gflop")})
        t = rec["timings"]
        row["refs"].update((name, stats["median_ms"]) for name, stats in t.items()
                           if name != "dace" and "median_ms" in stats)
        if row["best"] is None or t["dace"]["median_ms"] < row["best"]["timings"]["dace"]["median_ms"]:
            row["best"] = rec
    return rows


def _tag(case: dict) -> str:
    from convbench.tuning.gpuspace import tag
    return tag(dict(case["params"])) if case.get("params") else "tuned or default"


def tune_winners(records: Iterable[dict]) -> Dict[str, object]:
    """The tune tier's result: per implementation and layer, its fastest verified
    configuration (``entries``, the form of ``tuning/gpu.json``), and rows comparing it
    with the implementation's defaults.  No fastest implementation per layer: the tier
    times only the implementations it tunes, never against the others."""
    from .. import registry
    from convbench.layersets.layer import Layer
    best: Dict[tuple, dict] = {}
    default: Dict[tuple, float] = {}
    for rec in records:
        case = rec.get("case", {})
        if rec.get("status") != "verified" or "median_ms" not in rec.get("timings", {}).get("dace", {}):
            continue
        key = (case["impl"], case["layer_set"], case["layer"]["name"], case["layer"]["batch"])
        ms = rec["timings"]["dace"]["median_ms"]
        impl = registry.get(case["impl"])
        if dict(case.get("params") or ()) == dict(impl.resolve_params({})):
            default[key] = ms
        if key not in best or ms < best[key]["ms"]:
            best[key] = {"ms": ms, "params": dict(case.get("params") or ()),
                         "layer": Layer(**case["layer"]).key(), "pass": str(impl.pass_)}
    entries: Dict[str, dict] = {}
    rows = []
    for (impl, lset, lname, batch), b in sorted(best.items()):
        entries.setdefault(impl, {})[b["layer"]] = b["params"]
        d = default.get((impl, lset, lname, batch))
        rows.append([lset, lname, batch, impl, _fmt(d, ".3f"), _tag({"params": b["params"]}),
                     f"{b['ms']:.3f}", _fmt(d / b["ms"] if d else None, ".2f")])
    return {"entries": entries, "rows": rows}


def machine_code(records: Sequence[dict], builds: Mapping[str, dict]
                 ) -> Tuple[List[list], str]:
    """The rows of the campaign's "machine code beside the times" table and one sentence
    on their relation.  Per implementation, precision and configuration: its main loop's
    FMA kind and share, read from the SASS of the builds its cases ran (``builds.json``,
    the builds phase), and DaCe's time over the fastest vendor path on its verified cases
    (best, median, worst).  The sentence gives Spearman's rank correlation of the FMA
    share with the median ratio over the float32 FFMA rows with both."""
    import statistics
    from convbench.results.writer import spearman
    read = {}
    for row in builds.values():
        found = row.get("sass") or {}
        if found and not found.get("error"):
            read.update(dict.fromkeys(row.get("cases", ()), found))
    refs = {key: row["refs"] for key, row in best_per_layer(records).items()}
    groups: Dict[tuple, dict] = {}
    for rec in records:
        case = rec.get("case", {})
        if case.get("planted") or rec.get("status") != "verified":
            continue
        key = problem_key(case)
        g = groups.setdefault((case["impl"], key[4], _tag(case)),
                              {"shares": [], "kinds": set(), "ratios": []})
        if rec["id"] in read:
            g["shares"].append(read[rec["id"]]["fma_share"])
            g["kinds"].add(read[rec["id"]]["fma_kind"])
        _, vendor = writer.fastest_vendor(refs.get(key, {}))
        dace = rec.get("timings", {}).get("dace", {}).get("median_ms")
        if dace and vendor:
            g["ratios"].append(dace / vendor)
    rows, pairs = [], []
    for (impl, dtype, config), g in sorted(groups.items()):
        shares, ratios = g["shares"], g["ratios"]
        kinds = "/".join(sorted(k for k in g["kinds"] if k))
        share = "not read" if not shares else "no FMA" if not max(shares) else (
            kinds + " " + (f"{100 * min(shares):.0f}%" if min(shares) == max(shares) else
                           f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%"))
        rows.append([impl, dtype, config, share, len(ratios)]
                    + ([f"{min(ratios):.2f}x", f"{statistics.median(ratios):.2f}x",
                        f"{max(ratios):.2f}x"] if ratios else ["—"] * 3))
        if shares and ratios and g["kinds"] == {"FFMA"} and dtype == "float32":
            pairs.append((statistics.mean(shares), statistics.median(ratios)))
    rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
    sentence = (f"Over the {len(pairs)} float32 FFMA rows with both, Spearman's rank "
                f"correlation of the FMA share with the median ratio is {rho:+.2f} "
                "(negative: more FMA, nearer the vendor)." if rho is not None else
                "Too few float32 FFMA rows with both a reading and a time for a correlation.")
    return rows, sentence


def write_tuning(folder: Folder, meta: dict, records: Sequence[dict]) -> Tuple[Path, list]:
    """``tuning.json`` of a tune campaign: the winners and the device they were found on
    (``unpack`` files them in ``tuning/gpu.json`` under that name)."""
    won = tune_winners(records)
    path = folder.root / "tuning.json"
    write_atomic(path, json.dumps({"device": meta.get("device"), "target": meta.get("target"),
                                   "git": meta.get("git", {}),
                                   "written": _now(), "entries": won["entries"]},
                                  indent=1, sort_keys=True) + "\n")
    return path, won["rows"]


def _peak(ceilings: dict, dtype: str):
    """The measured ceiling of a case's precision (GFLOP/s): the FP32 SGEMM's, the FP16
    tensor-core GEMM's (float16, bfloat16), the TF32 one's; None where not measured."""
    key = {"float16": "fp16_gflops", "bfloat16": "fp16_gflops",
           "float32-tf32": "tf32_gflops"}.get(dtype, "peak_gflops")
    return ceilings.get(key)


def _share(gflop, ms, peak) -> str:
    """``gflop`` done in ``ms`` as a percentage of ``peak`` GFLOP/s ("—" where unknown)."""
    if not gflop or not ms or not peak:
        return _fmt(None, ".1f")
    return _fmt(100 * gflop / (ms * 1e-3) / peak, ".1f")


def write_table(folder: Folder, target: str, meta: dict) -> Path:
    """``README.md`` and ``summary.csv`` of the campaign folder, from what is recorded."""
    records = folder.records()
    ceilings = folder.read_json("ceilings.json", {}) or {}
    peak = ceilings.get("peak_gflops")
    gpu = target == "gpu"
    git = meta.get("git", {})
    header = (["set", "layer", "batch", "pass", "best DaCe", "DaCe ms"]
              + (["cudnn ms", "torch ms", "fastest vendor", "vendor ms"] if gpu
                 else ["torch ms"]) + ["ratio", "% of peak", "vendor % of peak"])
    best = []
    for (lset, lname, batch, pass_, dtype), row in sorted(best_per_layer(records).items()):
        if dtype != "float32":
            pass_ = f"{pass_} ({dtype})"
        d = row["best"]["timings"]["dace"]["median_ms"]
        refs = row["refs"] if gpu else {"torch": row["refs"].get("torch")}
        winner, v = writer.fastest_vendor(refs)
        top = _peak(ceilings, dtype)
        case = row["best"]["case"]
        name = case["impl"] + (f" `{_tag(case)}`" if case.get("params") else "")
        best.append([lset, lname, batch, pass_, name, f"{d:.3f}"]
                    + ([_fmt(row["refs"].get("cudnn"), ".3f"), _fmt(row["refs"].get("torch"), ".3f"),
                        winner or "—", _fmt(v, ".3f")] if gpu else [_fmt(v, ".3f")])
                    + [_fmt(d / v if v else None, ".2f") + ("x" if v else ""),
                       _share(row["gflop"], d, top), _share(row["gflop"], v, top)])
    best = best or [["(no case was timed)"] + [""] * (len(header) - 1)]
    state, phases = folder.state()["phases"], []
    for p in PHASES:
        s = state.get(p, {"status": "not run", "detail": "", "seconds": ""})
        phases.append((p, s["status"], str(s["detail"]).replace("|", "/")[:200], s["seconds"]))
    cases = [(r["id"], r["case"].get("group"), r["status"],
              ((r.get("detail") or "").replace("|", "/").splitlines() or [""])[0][:140])
             for r in records]
    counts = Counter(r["status"] for r in records)
    lines = [f"# Campaign {folder.root.name}", "",
             f"Tier `{meta.get('tier')}` on {meta.get('device', '?')} (target `{target}`), "
             f"commit {str(git.get('commit', '?'))[:10]}{' (dirty)' if git.get('dirty') else ''}"
             f", written {_now()}.", "",
             "## Best DaCe implementation per layer", "",
             f"Medians of CUDA-event (GPU) or wall-clock (CPU) samples, caches flushed before "
             f"each call. Ratio = DaCe / "
             + ("the fastest vendor path: cuDNN (this project's bindings, Find) or torch, each "
                "in both memory formats (`-ndhwc`/`-ncdhw`: the layout other than the DaCe "
                "kernel's)" if gpu else "torch")
             + f" (below 1: DaCe is faster). % of peak: GFLOP/s over the measured ceiling of "
             f"the case's precision, DaCe's and the fastest vendor's: the FP32 SGEMM "
             f"({_fmt(peak, '.0f')} GFLOP/s), the FP16 tensor-core GEMM for float16 and "
             f"bfloat16 ({_fmt(ceilings.get('fp16_gflops'), '.0f')}), the TF32 one "
             f"({_fmt(ceilings.get('tf32_gflops'), '.0f')}).", "",
             tables.markdown(header, best, "llrll" + "r" * (len(header) - 5)), "",
             f"The original work (DaCe 0.14 on a V100) reported forward ratios to cuDNN of "
             + "; ".join(f"{s} {r}" for s, r in V100_RATIOS.items()) + ".", ""]
    if meta.get("tier") == "tune":
        path, rows = write_tuning(folder, meta, records)
        lines += ["## Tuning", "",
                  "Per layer and implementation: the median of its default configuration, "
                  "and of the fastest configuration that verified (`tuning.json`; "
                  "`gpu_campaign.py unpack` files it in `tuning/gpu.json` under this device, "
                  "where verify, profile, the bench and the end-to-end run take it). Speed-up "
                  "= default / best.", "",
                  tables.markdown(["set", "layer", "batch", "implementation", "default ms",
                                   "best config", "best ms", "speed-up"],
                                  rows or [["(no configuration verified)"] + [""] * 7],
                                  "llrlrlrr"), ""]
    if meta.get("tier") == "tune":
        lines += end2end_section(folder)
    if gpu:
        code, sentence = machine_code(records, folder.read_json("builds.json", {}) or {})
        lines += ["## Machine code beside the times", "",
                  "Per implementation, precision and configuration: the FMA share of its "
                  "main loop in the sm_90 machine code of the builds its cases ran (read "
                  "when they were built; [docs/sass.md](../../../docs/sass.md)), and DaCe's "
                  "time over the fastest vendor path on its verified cases. " + sentence, "",
                  tables.markdown(["implementation", "precision", "config", "main loop",
                                   "cases", "best", "median", "worst"],
                                  code or [["(no case verified)"] + [""] * 7], "llllrrrr"), ""]
    lines += ["## Cases", "",
              "Totals: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), "",
              tables.markdown(["case", "group", "status", "detail"], cases, "llll"), "",
              "## Phases", "",
              tables.markdown(["phase", "status", "detail", "seconds"], phases, "lllr"), "",
              "## Ceilings", ""]
    lines += [f"- {key}: {_fmt(ceilings[key], '.0f') if ceilings[key] else 'not measured'}"
              for key in ("peak_gflops", "bandwidth_gbs", "tf32_gflops", "fp16_gflops",
                          "fma_peak_gflops") if key in ceilings]
    lines += ["", "Files: `campaign.json` (plan, options), `identity/`, `ceilings.json`, "
              "`builds.json`, `cases/<case>.json` (checks, every timing sample), "
              "`logs/<case>.log`, `summary.csv`, `end2end/` (tune), `roofline/` (GPU).", ""]
    path = folder.root / "README.md"
    write_atomic(path, "\n".join(lines))
    csv = ["id,impl,layer_set,layer,batch,group,planted,status,dace_ms,cudnn_ms,torch_ms,"
           "cudnn_other_ms,torch_other_ms,gflop,detail"]
    for rec in records:
        c, t = rec["case"], rec.get("timings", {})
        detail = '"' + (rec.get("detail") or "").replace('"', "'")[:300] + '"'
        csv.append(",".join(str(v) for v in [
            rec["id"], c["impl"], c["layer_set"], c["layer"]["name"], c["layer"]["batch"],
            c["group"], c["planted"], rec["status"]]
            + [f"{t[k]['median_ms']:.6f}" if "median_ms" in t.get(k, {}) else ""
               for k in ("dace", "cudnn", "torch")]
            + [next((f"{v['median_ms']:.6f}" for k, v in t.items()
                     if k.startswith(f"{ref}-") and "median_ms" in v), "")
               for ref in ("cudnn", "torch")]
            + [rec.get("gflop", ""), detail]))
    write_atomic(folder.root / "summary.csv", "\n".join(csv) + "\n")
    return path


def end2end_section(folder: Folder) -> List[str]:
    """The end-to-end phase's lines: its summary line, and per part of the forward pass
    and the training step, torch's median, DaCe's (with the implementations) and the
    ratio; samples per second of the training step."""
    import csv as csvlib
    done = folder.read_json("end2end.json")
    lines = ["## End to end", ""]
    if not done:
        return lines + ["Not run (the end2end phase has no record).", ""]
    command = list(done.get("command") or ["?"])
    command = [Path(command[0]).name] + command[1:command.index("--outdir")
                                                 if "--outdir" in command else None]
    math_note = "" if "--dtype" in command else ", TF32 off"
    tuning = done.get("tuning", "end2end/tuning.json")
    tuned = ("the project's tuned entries" if tuning == "the project's" else
             f"the tuned entries above (`{tuning}`)")
    lines += [f"`{' '.join(command)}` with {tuned}{math_note}: exit {done.get('exit')}; "
              f"{done.get('summary') or 'no summary line (logs/end2end.log)'}.", ""]
    for precision in ("float16", "bfloat16"):  # the steps tier's other runs
        other = folder.read_json(f"end2end_{precision}.json")
        if other and "end2end" in str(other.get("command", [])):
            lines += [f"In {precision} (`end2end_{precision}/`): exit {other.get('exit')}; "
                      f"{other.get('summary') or 'no summary line'}.", ""]
    path = folder.root / "end2end" / "summary.csv"
    if not path.is_file():
        return lines
    ms: Dict[str, Dict[str, float]] = {}
    impl: Dict[str, str] = {}
    batch = None
    for row in csvlib.DictReader(open(path)):
        ms.setdefault(row["layer"], {})[row["backend"]] = float(row["median_ms"])
        if row["backend"] == "dace":
            impl[row["layer"]] = row.get("implementation", "")
        batch = batch or row.get("batch")
    amp = any(AMP in v for v in ms.values())  # a 16-bit run: torch's mixed precision too

    def ratio(v, ref):
        return _fmt(v["dace"] / v[ref] if v.get(ref) and v.get("dace") else None, ".2f")
    rows = [[part, impl.get(part, ""), _fmt(v.get("torch"), ".2f"), _fmt(v.get("dace"), ".2f"),
             ratio(v, "torch")] + ([_fmt(v.get(AMP), ".2f"), ratio(v, AMP)] if amp else [])
            for part, v in ms.items()]
    head = ["part", "DaCe implementation", "torch ms", "DaCe ms", "ratio"]
    head += ["torch AMP ms", "ratio to AMP"] if amp else []
    lines += [tables.markdown(head, rows, "llrrr" + ("rr" if amp else "")), ""]
    step = ms.get("train.total", {})
    if batch and step.get("torch") and step.get("dace"):
        lines += [f"Training step: torch {int(batch) / step['torch'] * 1e3:.1f} samples/s, "
                  f"DaCe {int(batch) / step['dace'] * 1e3:.1f} samples/s"
                  + (f", torch AMP {int(batch) / step[AMP] * 1e3:.1f} samples/s"
                     if step.get(AMP) else "") + f" (batch {batch}).", ""]
    return lines


def _fmt(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def update_index(results_dir: Path) -> Optional[Path]:
    """``results/gpu/README.md``: one line per campaign folder beside it."""
    if not results_dir.is_dir():
        return None
    rows = []
    for sub in sorted(p for p in results_dir.iterdir() if (p / "campaign.json").exists()):
        meta = json.loads((sub / "campaign.json").read_text())
        rows.append([f"[{sub.name}]({sub.name}/README.md)", meta.get("tier"), meta.get("target"),
                     meta.get("device"), len(list((sub / "cases").glob("*.json")))])
    path = results_dir / "README.md"
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(INDEX_KEEP_MARKER):] if INDEX_KEEP_MARKER in old else ""
    write_atomic(path, "\n".join([
        "# GPU campaigns", "", "One folder per campaign (`scripts/gpu_campaign.py run`), named "
        "`<date>_<device>`; each has its own README.md.", "",
        tables.markdown(["campaign", "tier", "target", "device", "cases"], rows, "lllll")]) + "\n"
        + ("\n" + kept if kept else ""))
    return path


#: Text of ``results/gpu/README.md`` from this line on is written by hand (the analysis
#: of the campaigns) and kept when the index above it is rewritten.
INDEX_KEEP_MARKER = "<!-- written by hand below; kept by update_index -->"
