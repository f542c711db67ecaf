"""``verify-gpu`` and ``sass`` of the tensor-core kernels the int8 and sparse commands carry
(``convbench int8``, ``convbench sparse``): a kernel checked bit for bit on each layer, in
its CPU emulation or on the GPU, or its sm_90 machine code read per kernel, with the
tensor-core instructions of its main loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

from convbench.commands import flags
from convbench.commands.rows import metadata, write_csv

#: The columns ``sass`` keeps of each kernel (:func:`convbench.build.gpubuild.kernel_rows`,
#: and ``tensor_ops``: :func:`tensor_ops`).
SASS_COLUMNS = ("kernel", "main", "registers", "shared", "spill_stores", "spill_loads",
                "loop_instructions", "tensor_ops", "fma_share", "ldsm_per_fma", "ldgsts")


def add_mode_flags(p, help_text: str) -> None:
    """The mode (``verify``, ``bench``, ``verify-gpu``, ``sass``: ``help_text``) and
    ``--device`` of a command that carries a tensor-core kernel."""
    p.add_argument("mode", choices=("verify", "bench", "verify-gpu", "sass"), help=help_text)
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                   help="verify-gpu: run the tensor-core kernel's emulation (cpu, default) "
                   "or the kernel itself (gpu)")


def run(args, layers, out: Path, *, kernel, verify, dtype, label: str, mismatches: str,
        overrides) -> int:
    """``args.mode`` (``verify-gpu`` or ``sass``) of ``kernel`` on each ``(set, layer)``:
    ``verify(layer, overrides, seed, device, cachedir, policy)`` returns a row with
    ``ok``, ``elements`` and the count named ``mismatches``; ``sass`` compiles the GPU
    build of ``dtype``.  Writes ``<mode>.csv`` (``sass.md`` too) and ``metadata.json``
    under ``out``; 1 where a row failed."""
    from convbench.base import tables
    from convbench.base.files import write_atomic
    params = kernel.resolve_params(overrides)
    device = getattr(args, "device", "cpu")
    rows, failed = [], 0
    for lset, layer in layers:
        refusal = kernel.unsupported_reason(layer, params)
        head = {"layer_set": lset, "layer": layer.name, "batch": layer.batch}
        if refusal:
            print(f"{lset} {layer.name}: unsupported ({refusal})", flush=True)
            rows.append(dict(head, status="unsupported", reason=refusal))
            continue
        if args.mode == "verify-gpu":
            if device == "gpu":
                from convbench.timing.devices import resolve_device
                resolve_device("gpu")  # a one-line error where no GPU is usable
            row = verify(layer, overrides, args.seed, device, args.cachedir,
                         flags.build_policy(args))
            failed += not row["ok"]
            status = "passed" if row["ok"] else "FAILED"
            print(f"{lset} {layer.name} b{layer.batch}: {status}: {mismatches} "
                  f"{row[mismatches]} of {row['elements']}", flush=True)
            rows.append(dict(head, status=status.lower(), **row))
            continue
        from convbench.build import gpubuild
        probe = gpubuild.probe(kernel, lset, layer, dict(params), disassemble=True,
                               keep_listing=True, dtype=dtype)
        if probe.error:
            failed += 1
            print(f"{lset} {layer.name}: {probe.error}", flush=True)
            rows.append(dict(head, status="failed", reason=probe.error))
            continue
        for r in gpubuild.kernel_rows(probe):
            r["tensor_ops"] = tensor_ops(probe.listing, r["kernel"])
            rows.append(dict(head, status="compiled", **{k: r[k] for k in SASS_COLUMNS}))
            print(f"{lset} {layer.name} b{layer.batch}: {r['kernel']}: {r['registers']} "
                  f"registers, {r['spill_stores']} spill stores"
                  + (f", main loop {r['tensor_ops']} of {r['loop_instructions']}"
                     if r["main"] == "yes" else ""), flush=True)
    name = "verify_gpu" if args.mode == "verify-gpu" else "sass"
    write_csv(out / f"{name}.csv", rows)
    if args.mode == "sass":
        compiled = [r for r in rows if r["status"] == "compiled"]
        write_atomic(out / "sass.md", tables.markdown(
            ["layer set", "layer", "batch", "kernel", "main"] + list(SASS_COLUMNS[2:]),
            [[r["layer_set"], r["layer"], r["batch"]] + [r[k] for k in SASS_COLUMNS]
             for r in compiled]) + "\n")
    write_atomic(out / "metadata.json", json.dumps(metadata(args, {
        "mode": args.mode, "kernel": kernel.name, "dtype": dtype.label,
        "params": dict(params), "seed": args.seed, "device": device}),
        indent=2, default=str))
    print(f"{label} {args.mode}: {len(rows) - failed} of {len(rows)} rows without failure; {out}")
    return 1 if failed else 0


def tensor_ops(listing: str, kernel: str) -> str:
    """The tensor-core instructions of ``kernel``'s main loop in a SASS ``listing``
    (:func:`convbench.build.sass.main_loop`), by full opcode: ``64 IMMA.16832.S8.S8``."""
    from convbench.build import sass
    counts: Dict[str, int] = {}
    for fn in sass.parse_listing(listing):
        if fn.name != kernel:
            continue
        loop, _ = sass.main_loop(fn)
        for ins in loop.instructions if loop is not None else ():
            if "MMA" in ins.base:
                counts[ins.opcode] = counts.get(ins.opcode, 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
