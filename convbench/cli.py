"""The command line of ``profile_conv3d.py``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

from .errors import UsageError

#: The implementation run when ``--implementation`` is not given.
DEFAULT_IMPLEMENTATION = "implicitGemmNCDHW"
PROG = "profile_conv3d.py"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit status 2."""

    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Verify DaCe 3D-convolution implementations layer by "
                "layer against torch (float64).")
    p.add_argument("--implementation", default=DEFAULT_IMPLEMENTATION, metavar="NAME",
                   help=f"registered implementation (default: {DEFAULT_IMPLEMENTATION}; see --list)")
    p.add_argument("--list", action="store_true", help="list the implementations and exit")
    p.add_argument("--paramscsv", default="cosmoflow", metavar="SET",
                   help="layer set: a name in convparams/ or a CSV path (default: cosmoflow)")
    p.add_argument("--currlayer", type=int, default=None, metavar="I",
                   help="first layer to run (0-based, default 0)")
    p.add_argument("--lastlayer", type=int, default=None, metavar="J",
                   help="run layers I..J-1 (default: to the end of the set)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="batch size, overriding the CSV")
    p.add_argument("--device", default="auto", metavar="cpu|gpu|auto",
                   help="where to run (default auto: the GPU if a CUDA device is usable)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a tunable parameter of the implementation (repeatable)")
    p.add_argument("--verify", action="store_true",
                   help="check each layer's output against torch float64")
    p.add_argument("--strict", action="store_true",
                   help="count layers the implementation does not support as failures")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--cachedir", default=None, metavar="DIR",
                   help="build folder (default: $CONVBENCH_CACHE or .cache/builds)")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return _main(argv)
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from . import registry

    if args.list:
        print(registry.format_listing(registry.all_implementations()))
        return 0

    from .devices import resolve_device
    from .layers import load_layers, select_layers

    impl = registry.get(args.implementation)
    params = impl.resolve_params(registry.parse_param_overrides(args.param))
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch: must be a positive integer, got {args.batch}")
    layers = select_layers(load_layers(args.paramscsv), args.currlayer, args.lastlayer)
    if args.batch is not None:
        layers = [layer.with_batch(args.batch) for layer in layers]
    device = resolve_device(args.device)
    if device not in impl.targets:
        raise UsageError(f"--device {device}: {impl.name} has no schedule for it (targets: "
                         f"{', '.join(impl.targets)})")
    if not args.verify:
        raise UsageError("nothing to do: give --verify (or --list)")
    return run_verify(impl, params, layers, device, args)


def run_verify(impl, params, layers, device, args) -> int:
    from . import devices, toolchain, verify

    print(f"{impl.name} ({impl.pass_}, {impl.layout}) on {device}: {devices.describe(device)}")
    print(f"layer set {args.paramscsv}, {len(layers)} layer(s), seed {args.seed}, params "
          f"{params or 'none'}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
          flush=True)
    passed = failed = unsupported = 0
    for i, layer in enumerate(layers):
        print(f"[{i + 1}/{len(layers)}] {layer.name:<8} {layer.describe():<34}", end=" ",
              flush=True)
        reason = impl.unsupported_reason(layer, params)
        if reason:
            unsupported += 1
            print(f"unsupported: {reason}" + ("  FAIL (--strict)" if args.strict else ""),
                  flush=True)
            continue
        try:
            spec = toolchain.make_spec(impl, layer, "float32", device, params)
            build = toolchain.build(spec, args.cachedir)
            t0 = time.perf_counter()
            reference = verify.make_reference(layer, impl.pass_, seed=args.seed + i)
            checks = verify.verify_build(build, reference, device)
            t_check = time.perf_counter() - t0
        except UsageError:
            raise
        except Exception as err:  # a build or run failure fails this layer, not the run
            failed += 1
            first = (str(err).strip().splitlines() or [""])[0]
            print(f"ERROR {type(err).__name__}: {first}", flush=True)
            continue
        ok = all(c.ok for c in checks)
        passed += ok
        failed += not ok
        detail = "  ".join(f"[{c.reference}] {c.summary()}" if len(checks) > 1 else c.summary()
                           for c in checks)
        print(f"build {build.times['sdfg'] + build.times['compile']:.1f}s  check "
              f"{t_check:.1f}s  {detail}  {'PASS' if ok else 'FAIL'}", flush=True)
    total_failed = failed + (unsupported if args.strict else 0)
    print(f"{impl.name}: {passed} passed, {failed} failed, {unsupported} unsupported "
          f"(of {len(layers)} layers)")
    return 1 if total_failed else 0
