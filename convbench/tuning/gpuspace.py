"""The GPU tune space, and what each configuration costs in registers and shared memory
and issues in its main loop, found on a host without a GPU.

GPU time is rare here, so the tune tier of the campaign (``convbench.campaign``) only
runs configurations that have passed this filter, best-ranked first.  Each configuration
of an implementation's GPU search space (:data:`SPACES`) is compiled and read by
:func:`convbench.build.gpubuild.probe` (ptxas and link resources, occupancy, the verdict that
keeps a configuration that spills or does not fit off the GPU, and the main loop's
machine code); :func:`score` and :func:`rank` order those that pass.

``scripts/gpu_campaign.py space`` writes the table of every configuration
(``results/gpu/tune-space/``), and the tune tier reads its verdicts from there.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from convbench.build import sass
from convbench.base.errors import UsageError
from convbench.build.gpubuild import (SM90, Kernel, Probe, RESOURCE_COLUMNS, kernel_row,
                                      per_fma_text, probe_layers, read_csv, run_probes,
                                      share_text, tag)
from convbench.build.toolchain import PROJECT_ROOT
from convkernels.gpu.wgmma import program as wgmma_program

#: The GPU search space per implementation, in ``--space`` syntax (``P=a,b;Q=c``): the
#: block tile (64-128 x 32-128), the K step, the register tile (4x4 to 8x8), and for
#: split-K the number of chunks.  Combinations an implementation refuses (too many
#: threads, shared memory over 48 KiB, a K step that the threads cannot stage evenly)
#: are dropped by its own parameter check before anything is compiled.
#: These spaces are the campaign's search plan: their size is bounded by device time
#: (:mod:`convbench.campaign.plan` prices them), not by what the kernels accept.
_TILES = "CTAtileM=64,128;CTAtileN=32,64,128;CTAtileK=8,16,32;threadTileM=4,8;threadTileN=4,8"
_PIPELINED = ("CTAtileM=64,128;CTAtileN=32,64,128;CTAtileK=8,16;threadTileM=8;threadTileN=4,8;"
              "stages=2,3,4")
SPACES: Dict[str, str] = {
    "implicitGemmNCDHW": _TILES,
    "implicitGemmNCDHWinplace": _TILES,
    # Split-K is for the deep layers, whose few output pixels leave SMs idle: small
    # block tiles in M, and the chunk count as the main axis.
    "implicitGemmsplitK": ("CTAtileM=64;CTAtileN=64,128;CTAtileK=16,32;threadTileM=4,8;"
                           "threadTileN=4;nsplitK=2,4,8"),
    # The pipelined main loop (convkernels/gpu/simt/): CUTLASS's SIMT tiles, 8x8 or 8x4 per
    # thread, K tiles of 8 or 16 channels of one tap, 2 to 4 cp.async stages.
    "implicitGemmPipelined": _PIPELINED,
    "implicitGemmPipelinedNCDHW": _PIPELINED,
    # The data gradient runs the forward's main loop: the forward's space.
    "implicitGemmPipelinedBwdData": _PIPELINED,
    # The filter gradient: M = output channels (32 to 512 on CosmoFlow), N = filter values
    # (C x 27), K tiles of 8 or 16 pixels; the slices found by the automatic split.  N
    # tiles of 32 for the first layers' few filter values (v1 conv1: 16 x 27, which no
    # larger tile fits: gpuspace.fits_layer).
    "implicitGemmPipelinedBwdFilter": ("CTAtileM=32,64,128;CTAtileN=32,64,128;CTAtileK=8,16;"
                                       "threadTileM=4,8;threadTileN=8;stages=2,3;splitK=0"),
    # The Hopper tensor-core kernels (convkernels/gpu/wgmma/, probed in float16, sm_90a):
    # one or two warpgroups, the N of each wgmma, 3 to 6 stages in dynamic shared memory;
    # no clusters yet.  Their FMA-share score means nothing for HGMMA: the precision tier
    # times its own candidates (convbench.campaign.plan.PRECISION_CANDIDATES) instead.
    "implicitGemmWGMMA": wgmma_program.SEARCH_SPACE,
    "implicitGemmWGMMABwdData": wgmma_program.SEARCH_SPACE,
    "implicitGemmWGMMABwdFilter": wgmma_program.SEARCH_SPACE + ";splitK=0",
}

# ---------------------------------------------------------------------------------------------
# The space
# ---------------------------------------------------------------------------------------------

def space(impl_name: str, text: Optional[str] = None) -> List[Dict[str, int]]:
    """The configurations of ``impl_name``'s GPU search space (or of ``text``) that the
    implementation's own parameter check accepts."""
    from convbench import registry
    from convbench.build.tuned import parse_space
    text = text if text is not None else SPACES.get(impl_name)
    if not text:
        raise UsageError(f"{impl_name} has no GPU search space (those with one: "
                         f"{', '.join(SPACES)})")
    return [dict(p) for p in parse_space(text, registry.get(impl_name))]


def gemm_shape(layer, pass_: str = "fwd") -> Tuple[int, int, int]:
    """Rows, columns and reduction of the implicit GEMM of ``layer``'s pass ``pass_``:
    forward, output pixels x output channels over C x taps; data gradient, input pixels
    x input channels over K x taps; filter gradient, output channels x filter values
    (C x taps) over output pixels."""
    taps = layer.k_d * layer.k_h * layer.k_w
    if str(pass_) == "bwd_filter":
        return layer.out_channels, layer.in_channels * taps, layer.gemm_m
    if str(pass_) == "bwd_data":
        return (layer.batch * layer.in_d * layer.in_h * layer.in_w, layer.in_channels,
                layer.out_channels * taps)
    return layer.gemm_m, layer.gemm_n, layer.gemm_k


def fits_layer(params: Mapping[str, int], layer, pass_: str = "fwd") -> bool:
    """Whether a configuration's block tile is not mostly padding on ``layer``: a
    CTAtileN above the GEMM columns (rounded up to 32), or a CTAtileM above the GEMM
    rows (to 64), only adds idle threads."""
    gm, gn, _ = gemm_shape(layer, pass_)
    cols = max(32, 1 << max(0, gn - 1).bit_length())
    rows = max(32 if str(pass_) == "bwd_filter" else 64, 1 << max(0, gm - 1).bit_length())
    return params.get("CTAtileN", 0) <= cols and params.get("CTAtileM", 0) <= rows


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

COLUMNS = (("impl", "config", "layer_set", "layer", "batch", "verdict") + RESOURCE_COLUMNS
           + sass.COLUMNS + ("seconds",))


def rows(probes: Iterable[Probe]) -> List[Dict[str, object]]:
    """One row per configuration and layer: its verdict, its main kernel's resources and
    the reading of that kernel's main loop."""
    return [{"impl": p.impl, "config": tag(p.params), "layer_set": p.layer_set,
             "layer": p.layer, "batch": p.batch, "verdict": p.reason or "ok",
             **kernel_row(p.main or Kernel("")), "seconds": p.seconds} for p in probes]


def write_csv(path: Path, table: Sequence[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(table)


def passed(folder: Path) -> Dict[str, List[Dict[str, int]]]:
    """Per implementation, the configurations that passed on every layer they were
    compiled for, as ``space.json`` in ``folder`` records them, each with its resident
    blocks per SM under the key ``_blocks_per_sm`` and, where its SASS was read, its main
    loop's FMA share under ``_fma_share`` (for :func:`rank`)."""
    path = Path(folder) / "space.json"
    if not path.is_file():
        raise UsageError(f"{path}: no tune-space table; compile the space first "
                         "(scripts/gpu_campaign.py space)")
    data = json.loads(path.read_text())
    def private(c):
        out = {"_blocks_per_sm": c.get("blocks_per_sm", 1)}
        if c.get("fma_share") is not None:
            out["_fma_share"] = c["fma_share"]
        return out
    return {impl: [dict(c["params"], **private(c))
                   for c in entry["configs"] if c["verdict"] == "ok"]
            for impl, entry in data["implementations"].items()}


def score(params: Mapping[str, int], layer, blocks_per_sm: int, arch: Mapping = SM90,
          fma_share: Optional[float] = None, pass_: str = "fwd") -> float:
    """A model of a configuration's efficiency on ``layer``, to order what the tune tier
    times (the GPU decides): the share of the padded GEMM that is real work, the share
    of the last wave of blocks that is busy (all of one wave below one), and how much of
    the main loop's issue goes to FMAs.  That last factor is ``fma_share``, the FMA share
    of the main loop's machine code (:mod:`convbench.build.sass`): an SM sub-partition issues
    one instruction per clock and retires one FFMA per clock, so a loop that is 47%
    FFMA runs at 47% of the FP32 peak at best.  Without a reading it is modelled by the
    register tile's reuse, FFMAs per shared-memory load, rm*rn/(rm+rn), relative to 8x8's.
    Split-K counts its extra pass over the partial sums as one more K step per chunk;
    an automatic split (``splitK=0``: as many slices as fill the GPU) keeps every wave
    busy, at one extra step."""
    tm, tn = params["CTAtileM"], params["CTAtileN"]
    gm, gn, gk = gemm_shape(layer, pass_)
    split = params.get("nsplitK", 1)
    mp, np_ = -(-gm // tm) * tm, -(-gn // tn) * tn
    waves = _waves(params, layer, blocks_per_sm, arch, pass_) * split
    busy = waves / math.ceil(waves) if waves else 0.0
    if params.get("splitK") == 0:
        busy, split = 1.0, 2
    rm, rn = params.get("threadTileM", 1), params.get("threadTileN", 1)
    issue = fma_share if fma_share is not None else (rm * rn / (rm + rn)) / 4.0
    k_steps = -(-gk // (params.get("CTAtileK", 16) * split))
    return (gm * gn) / (mp * np_) * busy * issue * k_steps / (k_steps + (split > 1))


def rank(impl_name: str, layer, configs: Sequence[Mapping[str, int]]) -> List[Dict[str, int]]:
    """``configs`` that ``impl_name`` supports on ``layer`` and that fit it
    (:func:`fits_layer`), best :func:`score` first; split-K only where the plain tiles
    leave SMs idle (under one wave of blocks).  The FMA shares of the SASS count where
    every configuration has one, the reuse model otherwise (the two are on different
    scales).  Parameters without the private keys."""
    from convbench import registry
    impl = registry.get(impl_name)
    read = all(c.get("_fma_share") is not None for c in configs)
    out = []
    for c in configs:
        params = {k: v for k, v in c.items() if not k.startswith("_")}
        bps = c.get("_blocks_per_sm", 1)
        if not fits_layer(params, layer, impl.pass_) or impl.unsupported_reason(
                layer, impl.resolve_params(params)):
            continue
        if params.get("nsplitK", 1) > 1 and _waves(params, layer, bps) >= 1.0:
            continue
        out.append((score(params, layer, bps, fma_share=c["_fma_share"] if read else None,
                          pass_=impl.pass_), params))
    out.sort(key=lambda sp: -sp[0])
    return [p for _, p in out]


def _waves(params: Mapping[str, int], layer, blocks_per_sm: int, arch: Mapping = SM90,
           pass_: str = "fwd") -> float:
    """Waves of blocks of ``params``' tiles without split-K."""
    gm, gn, _ = gemm_shape(layer, pass_)
    blocks = -(-gm // params["CTAtileM"]) * -(-gn // params["CTAtileN"])
    return blocks / max(1, blocks_per_sm * arch["sms"])


#: The start of a probe's error when the implementation refuses the probe layer itself
#: (int32 partial sums, say): a fact about the layer, not about the configuration.
REFUSED = "refused: "


def summarize(table: Sequence[Mapping[str, object]]) -> Dict[str, object]:
    """``space.json`` from the rows of :func:`rows`: per implementation and
    configuration, the verdict over its layers (the first resource or compile failure,
    if any), the layers it was compiled on and those that refuse it, the range of its
    main kernel's registers, its fewest resident blocks per SM and, where the SASS was
    read, its main loop's FMA kind and lowest FMA share.  A configuration that every
    probe layer refuses has no verdict to give and counts as refused."""
    impls: Dict[str, dict] = {}
    for r in table:
        impl = str(r["impl"])
        entry = impls.setdefault(impl, {"space": SPACES.get(impl, ""), "configs": {}})
        by_tag = entry.setdefault("_params", {tag(c): c for c in space(impl)})
        c = entry["configs"].setdefault(r["config"], {
            "params": by_tag.get(r["config"], {}), "verdict": "ok", "layers": [],
            "refused_on": [], "registers": [], "blocks_per_sm": [], "fma_share": []})
        where = f"{r['layer_set']}/{r['layer']}/b{r['batch']}"
        verdict = str(r["verdict"])
        if verdict.startswith(REFUSED):
            c["refused_on"].append(where)
            continue
        c["layers"].append(where)
        if int(r["registers"] or 0):
            c["registers"].append(int(r["registers"]))
            c["blocks_per_sm"].append(int(r["blocks_per_sm"]))
        if r.get("fma_share") not in (None, ""):
            c["fma_share"].append(float(r["fma_share"]))
            c["fma_kind"] = r.get("fma_kind", "")
        if verdict != "ok" and c["verdict"] == "ok":
            c["verdict"] = f"{r['layer_set']}/{r['layer']}: {verdict}"
    for entry in impls.values():
        entry.pop("_params", None)
        for c in entry["configs"].values():
            regs = c.pop("registers")
            c["registers"] = [min(regs), max(regs)] if regs else []
            c["blocks_per_sm"] = min(c["blocks_per_sm"], default=0)
            c["fma_share"] = min(c["fma_share"], default=None)
            if not c["layers"]:
                c["verdict"] = "every probe layer refuses it: " + ", ".join(c["refused_on"])
        entry["configs"] = list(entry["configs"].values())
    return {"arch": SM90["name"], "implementations": impls}



# ---------------------------------------------------------------------------------------------
# Compiling the whole space
# ---------------------------------------------------------------------------------------------

#: The layer each configuration is compiled on: v1 conv7 at batch 16, the deepest
#: CosmoFlow layer, which every implementation with a space supports (split-K's partial
#: sums overflow int32 on the large layers).  Registers can differ a little with the
#: layer's constants: a configuration that spills on another layer shows up there as
#: time, never as a wrong result, since every tune case is verified.
PROBE_LAYERS = (("cosmoflow", "conv7", 16),)
#: Where ``space`` writes its table, and where the tune tier reads the verdicts.
DEFAULT_OUT = PROJECT_ROOT / "results" / "gpu" / "tune-space"


def compile_space(impls: Sequence[str], jobs: int, say=print,
                  layers: Sequence[Tuple[str, str, int]] = PROBE_LAYERS) -> List[Probe]:
    """Every configuration of ``impls``' spaces on every probe layer, ``jobs`` at a time,
    each kernel's main loop read from its SASS."""
    sass.require_tools()
    todo = [(impl, layer_set, layer, params, None)
            for layer_set, layer in probe_layers(layers)
            for impl in impls for params in space(impl)]
    say(f"compiling {len(todo)} configurations x layers with nvcc, {jobs} at a time")
    found = run_probes(todo, jobs, say)
    order = {(impl, tag(p)): i for i, (impl, _, _, p, _) in enumerate(todo)}
    found.sort(key=lambda p: (order[(p.impl, tag(p.params))], p.layer_set, p.layer))
    return found


def write_space(out: Path, probes: Sequence[Probe], toolchain_info: Mapping[str, str]) -> Path:
    """``resources.csv``, ``space.json`` and ``README.md`` in ``out``; the rows of
    implementations not probed this time are kept from the files already there."""
    from convbench.base import tables
    from convbench.base.files import write_atomic
    out = Path(out)
    probed = {p.impl for p in probes}
    table = rows(probes)
    if (out / "resources.csv").is_file():
        table = [r for r in read_csv(out / "resources.csv")
                 if r["impl"] not in probed and r["impl"] in SPACES] + table
    summary = dict(summarize(table), toolchain=dict(toolchain_info))
    write_csv(out / "resources.csv", table)
    write_atomic(out / "space.json", json.dumps(summary, indent=1) + "\n")
    lines = ["# The GPU tune space, compiled on a host without a GPU", "",
             f"Every configuration of the GPU search spaces (`convbench/tuning/gpuspace.py`, SPACES), "
             f"compiled for {SM90['name']} (the wgmma kernels for sm_90a) by "
             "`scripts/gpu_campaign.py space` "
             f"({', '.join(f'{k} {v}' for k, v in toolchain_info.items())}) as a GPU build "
             "compiles it: separable compilation (`-rdc=true`, DaCe's CMake setting) and the "
             "device link, whose report gives the registers and shared memory the GPU runs "
             "with (for `implicitGemmNCDHW`'s defaults 64 registers and 4 blocks of 256 "
             "threads per SM, what Nsight Compute measured on the H100 and H200). Per "
             "configuration and probe layer: registers, static shared memory and stack "
             "frame after the link, spill stores and loads from ptxas, the launch the "
             "generated code makes (threads per block, blocks), and from those the resident "
             f"blocks per SM, the occupancy and its limiter, and the waves over {SM90['sms']} "
             "SMs. The object is disassembled (`cuobjdump -sass`) and each kernel's main "
             "loop read ([docs/sass.md](../../../docs/sass.md)): its instructions, the "
             "share that are FMAs, shared-memory loads per FMA by width, integer "
             "instructions per FMA and barriers; `resources.csv` has every column. A "
             "configuration that spills, keeps a stack frame, or cannot place a block "
             "on an SM is refused: the tune tier does not plan it (it times each "
             "implementation's defaults as the baseline, whatever their verdict). The "
             "tune tier orders the rest by a model that takes the main loop's FMA share "
             "as the share of the FP32 peak its issue allows (`gpuspace.score`). Every row "
             "is in `resources.csv`, the verdicts in `space.json`.", ""]
    for impl, entry in summary["implementations"].items():
        configs = entry["configs"]
        ok = [c for c in configs if c["verdict"] == "ok"]
        lines += [f"## {impl}", "", f"Space `{entry['space']}`: {len(configs)} "
                  f"configurations, {len(ok)} pass, {len(configs) - len(ok)} refused.", ""]
        body = [r for r in table if r["impl"] == impl]
        lines.append(tables.markdown(
            ["config", "layer", "verdict", "regs", "smem B (+ dynamic)", "stack", "spills",
             "threads",
             "blocks/SM", "occupancy", "limiter", "waves", "loop instr", "FMA share",
             "shared loads / FMA", "int / FMA", "BAR"],
            [[r["config"], f"{r['layer_set']}/{r['layer']} b{r['batch']}",
              str(r["verdict"]).replace("|", "/")[:90], r["registers"],
              (f"{r['shared']}+{r['dynamic_shared']}" if r.get("dynamic_shared") not in
               (None, "", "0", 0) else r["shared"]),
              r["stack"], f"{r['spill_stores']}/{r['spill_loads']}", r["threads"],
              r["blocks_per_sm"], r["occupancy"], r["limiter"], r["waves"],
              r.get("loop_instructions", ""), share_text(r), per_fma_text(r),
              r.get("int_per_fma", ""), r.get("barriers", "")] for r in body],
            "lll" + "r" * 11 + "lrr"))
        lines.append("")
    tune = sorted(out.parent.glob("*_tune/cases"))
    if tune:
        lines += ranking_section(tune[-1].parent, table)
    path = out / "README.md"
    write_atomic(path, "\n".join(lines))
    return path


def ranking_check(records: Iterable[dict], table: Sequence[Mapping[str, object]]
                  ) -> Dict[str, Dict[str, object]]:
    """How each ranking model orders the configurations a tune campaign timed, against
    their measured medians: per model (``paper``: the register tile's reuse; ``sass``:
    the main loop's FMA share), over the layers with at least two configurations that
    verified and have a row in ``table``, on how many its first choice was the fastest
    (``first``; a tie for first place counts as the chance that a random pick among the
    tied is the fastest), of how many (``layers``), and the mean of Spearman's rank
    correlation of score with speed within a layer (``rho``), over the layers where it
    is defined (three configurations or more, scores not all equal)."""
    from convbench import registry
    from convbench.layersets.layer import Layer
    from convbench.results.writer import spearman
    by_tag: Dict[tuple, Mapping[str, object]] = {}
    for r in table:  # per configuration, its lowest share over the probe layers (space.json's)
        key = (str(r["impl"]), str(r["config"]))
        if r.get("fma_share") not in (None, "") and (
                key not in by_tag or float(r["fma_share"]) < float(by_tag[key]["fma_share"])):
            by_tag[key] = r
    timed: Dict[tuple, list] = {}
    for rec in records:
        case = rec.get("case", {})
        ms = rec.get("timings", {}).get("dace", {}).get("median_ms")
        if rec.get("status") != "verified" or not ms or case.get("impl") not in SPACES:
            continue
        params = dict(case.get("params") or ()) or dict(
            registry.get(case["impl"]).resolve_params({}))
        row = by_tag.get((case["impl"], tag(params)))
        if row is not None:
            timed.setdefault((case["impl"], case["layer_set"], json.dumps(case["layer"],
                                                                          sort_keys=True)),
                             []).append((params, row, ms))
    out: Dict[str, Dict[str, object]] = {}
    for model in ("paper", "sass"):
        first, rhos, layers = 0.0, [], 0
        for (impl, _, layer_json), found in timed.items():
            if len(found) < 2:
                continue
            layers += 1
            layer = Layer(**json.loads(layer_json))
            scores = [score(p, layer, int(r["blocks_per_sm"] or 1),
                            fma_share=float(r["fma_share"]) if model == "sass" else None)
                      for p, r, _ in found]
            speed = [-ms for _, _, ms in found]
            top = [i for i, s in enumerate(scores) if s == max(scores)]
            # a tie among the top scores gets the chance that a random pick is the fastest
            first += (speed.index(max(speed)) in top) / len(top)
            rho = spearman(scores, speed)
            if rho is not None:
                rhos.append(rho)
        out[model] = {"layers": layers,
                      "first": round(first, 1),
                      "rho": round(sum(rhos) / len(rhos), 2) if rhos else None}
    return out


def ranking_section(campaign: Path, table: Sequence[Mapping[str, object]]) -> List[str]:
    """The README's paragraph on how the ranking did on ``campaign``'s timings."""
    records = [json.loads(p.read_text()) for p in sorted((campaign / "cases").glob("*.json"))]
    found = ranking_check(records, table)
    if not found["sass"]["layers"]:
        return []
    text = "; ".join(f"{'the FMA share of the SASS' if m == 'sass' else 'the register tile reuse'}"
                     f" ranks the fastest first on {v['first']:g} of {v['layers']} layers, mean "
                     "within-layer Spearman "
                     + (f"{v['rho']:+.2f}" if v["rho"] is not None else "undefined")
                     for m, v in found.items())
    return ["## The ranking against measured times", "",
            f"Of the configurations the tune campaign [{campaign.name}](../{campaign.name}/README.md) "
            "timed and verified (per layer its defaults and the configurations its plan "
            "chose; medians of CUDA-event samples), scored by `gpuspace.score` with this "
            f"table's readings: {text} (`gpuspace.ranking_check`). A ranking model chose "
            "those candidates, so this tests the order among them, not what either model "
            "would pick from the whole space.", ""]
