#!/usr/bin/env python3
"""Run ``profile_conv3d.py --verify`` for every registered implementation on layer sets,
and keep each run's output.

    python scripts/verify_all.py [--device cpu|gpu] [--batch N] [--paramscsv SET ...]
                                 [--implementation NAME ...] [--outdir DIR]

One CLI run per (implementation, layer set), in a subprocess, with its output saved to
``DIR/<impl>_<set>.log`` (default ``outputs/verify/<device>``); ``DIR/summary.txt`` has the
CLI's summary line per run and ``DIR/device.txt`` the device description.  Exit status 1
if any run failed.  It checks the command line users type; the full test tier
(``make test-full``) checks every implementation x pass x layer x set x batch and writes
the committed coverage table (``results/verify/``).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from convbench import registry  # noqa: E402
from convbench.timing import devices  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=None, help="override the sets' batch")
    p.add_argument("--paramscsv", action="append", default=None)
    p.add_argument("--implementation", action="append", default=None)
    p.add_argument("--outdir", "--out", default=None, metavar="DIR",
                   help="log folder (default outputs/verify/<device>)")
    args = p.parse_args(argv)
    sets = args.paramscsv or ["cosmoflow", "cosmoflow_mlperf"]
    names = args.implementation or list(registry.all_implementations())
    out = Path(args.outdir or ROOT / "outputs" / "verify" / args.device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "device.txt").write_text(devices.describe(args.device) + "\n")
    summary, failed = [], 0
    for name in names:
        for layer_set in sets:
            cmd = [sys.executable, str(ROOT / "profile_conv3d.py"), "--implementation", name,
                   "--verify", "--device", args.device, "--paramscsv", layer_set]
            if args.batch:
                cmd += ["--batch", str(args.batch)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            log = out / f"{name}_{layer_set}.log"
            log.write_text(" ".join(cmd[1:]) + "\n" + proc.stdout + proc.stderr)
            last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
            line = f"{name:26s} {layer_set:17s} rc={proc.returncode} " \
                   f"{time.perf_counter() - t0:7.1f}s  {last}"
            print(line, flush=True)
            summary.append(line)
            failed += proc.returncode != 0
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
