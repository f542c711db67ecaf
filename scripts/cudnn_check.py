#!/usr/bin/env python3
"""Check the cuDNN bindings on a GPU: the three passes against torch (float64 on the
CPU) on every layer of the given sets, in float32 (IEEE) and float16, and the
algorithm table that Find measured per layer and pass.

    python scripts/cudnn_check.py [--paramscsv cosmoflow_mlperf --paramscsv cosmoflow]
                                  [--batch N] [--dtype float32 --dtype float16]
                                  [--out results/gpu/<date>_<gpu>/cudnn_check.json]

The error is max |out - ref| / max |ref|; it must be below :data:`TOL` of its dtype
(exit status 1 otherwise, 2 without a usable GPU).  The fp16 reference is computed in
float64 from the same fp16 inputs.
"""

import argparse
import platform
import subprocess
import sys
import time


PROG = "cudnn_check.py"
TOL = {"float32": 1e-4, "float16": 1e-2}


def main(argv=None) -> int:
    from convbench.base.errors import run_main
    return run_main(PROG, _main, argv)


def _main(argv) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--paramscsv", action="append", default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--dtype", action="append", default=None, choices=sorted(TOL))
    p.add_argument("--algo", default="find")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from convbench.timing import devices
    from convbench.base.errors import UsageError
    from convbench.layersets.sets import load_layers
    from convbench.check.references import torch_pass
    problem = devices.gpu_problem()
    if problem:
        raise UsageError(f"no usable GPU: {problem}")
    import torch

    import cudnn_bindings as cb
    if cb.problem():
        raise UsageError(cb.problem())
    sets = {s: load_layers(s) for s in (args.paramscsv or ["cosmoflow_mlperf", "cosmoflow"])}
    records, failures = [], 0
    for set_name, layers in sets.items():
        for layer in layers:
            layer = layer.with_batch(args.batch) if args.batch else layer
            gen = torch.Generator().manual_seed(0)
            base = {r: torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1 for r, shape in
                    (("x", layer.input_shape), ("w", layer.filter_shape),
                     ("dy", layer.output_shape))}
            for dtype in args.dtype or ["float32", "float16"]:
                t = {k: v.to(getattr(torch, dtype)) for k, v in base.items()}
                exact = {k: v.double() for k, v in t.items()}
                ref = {p: torch_pass(layer, p, {"x": exact["x"], "w": exact["w"], "y": exact["dy"]})
                       for p in cb.PASSES}
                g = {k: v.cuda() for k, v in t.items()}
                for pass_ in cb.PASSES:
                    if pass_ == "fwd":
                        x, w = g["x"], g["w"]
                        y = torch.empty(layer.output_shape, dtype=x.dtype, device="cuda")
                        out = y
                    elif pass_ == "bwd_data":
                        x = torch.empty(layer.input_shape, dtype=g["w"].dtype, device="cuda")
                        w, y, out = g["w"], g["dy"], x
                    else:
                        w = torch.empty(layer.filter_shape, dtype=g["x"].dtype, device="cuda")
                        x, y, out = g["x"], g["dy"], w
                    t0 = time.perf_counter()
                    plan = cb.plan(pass_, x, w, y, layer.strides, layer.pads, layer.dilations,
                                   algo=args.algo, groups=layer.groups)
                    plan.run(x, w, y)
                    torch.cuda.synchronize()
                    seconds = time.perf_counter() - t0
                    err = float((out.double().cpu() - ref[pass_]).abs().max()
                                / ref[pass_].abs().max())
                    ok = err < TOL[dtype]
                    failures += not ok
                    info = plan.info()
                    records.append({"set": set_name, "layer": layer.name,
                                    "geometry": layer.describe(), "dtype": dtype, "pass": pass_,
                                    "rel_err": err, "ok": ok, "first_call_s": seconds, **info})
                    print(f"{set_name}/{layer.name:<6} {dtype:<8} {pass_:<10} {info['algo']:<22} "
                          f"{info['math']:<15} find {info['find_ms']:8.1f} ms  err {err:.2e} "
                          f"{'ok' if ok else 'FAIL'}", flush=True)
                cb.clear_plans()
    if args.out:
        from convbench.results.writer import save_records
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "cuda": torch.version.cuda, "cudnn": ".".join(map(str, cb.version())),
                "cudnn_library": str(cb.load().path), "algo": args.algo, "nvidia_smi": smi}
        save_records(args.out, meta, records)
    print(f"{len(records) - failures} ok, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
