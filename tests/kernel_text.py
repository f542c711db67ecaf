"""The generated program text of the register-blocked CPU kernels over a configuration
space, as digests: a refactoring of the generators must leave every text as it was.

    python tests/kernel_text.py --out before.json      # digest every configuration
    python tests/kernel_text.py --compare before.json  # exit 1 and list what changed

The space: every layer of the shipped layer sets and of the tests' own shapes, at batch 1
and 2, times the parameter values each implementation's search space names, the edge,
in-place and channel-block switches, the entries of every machine in tuning/cpu.json,
and both vector widths (8 and 16 lanes).  Parameters are set explicitly, so the space
does not depend on this CPU; nothing is compiled (the text is taken where it would be
handed to DaCe).
"""

import argparse
import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Dict, Iterator, Tuple

from convbench import registry

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("directConvNDHWCblocked", "directConvNDHWCdot", "directConvNDHWCblockedBwdData",
         "directConvNDHWCdotBwdData", "directConvNDHWCblockedBwdFilter")
SETS = ("cosmoflow", "cosmoflow_mlperf", "cosmoflow_mlperf_s64", "unet3d", "vnet", "x3d_xs",
        "alcf_conv2d")
#: Switches beyond the search spaces, per parameter (only where the implementation has it).
SWITCHES = {"EDGE": (0, 1, 2), "INPLACE": (0, 1), "CBLK": (0, 16), "GROUP": (0, 2),
            "NB": (8, 16), "PACK": (0, 1, 2), "TAPS": (0, 1), "FORM": (0, 1),
            "KFIRST": (0, 1), "PLANES": (1, 2), "TAPW": (0, 1)}


def layers():
    from convbench.layersets.sets import load_layers
    import cases  # the tests' shapes
    seen = {}
    found = [layer for s in SETS for layer in load_layers(s)]
    found += list(cases.ODD_SHAPES) + list(cases.ANISO) + [cases.FIRST_SMALL]
    for layer in found:
        for batch in (1, 2):
            one = layer.with_batch(batch)
            seen.setdefault(one.key(), one)
    return list(seen.values())


def _space(impl) -> Iterator[Dict[str, int]]:
    """Parameter dicts: the search space's values, and each switch on its own."""
    known = {p.name: p.default for p in impl.params}
    axes = [(part.partition("=")[0], [int(v) for v in part.partition("=")[2].split(",")])
            for part in impl.search_space.split(";") if part]
    for combo in itertools.product(*[[(name, v) for v in values] for name, values in axes]):
        yield dict(known, **dict(combo))
    for name, values in SWITCHES.items():
        if name in known:
            for v in values:
                yield dict(known, **{name: v})


def _tuned(impl, layer) -> Iterator[Dict[str, int]]:
    from convbench.build import tuned as tuning
    known = {p.name: p.default for p in impl.params}
    for section in tuning.load("cpu").get("machines", {}).values():
        entry = section.get("entries", {}).get(impl.name, {}).get(layer.key())
        if entry:
            yield dict(known, **{k: v for k, v in entry.items() if k in known})


def texts() -> Iterator[Tuple[str, str]]:
    """``(configuration, program text)`` over the space; a configuration that the
    implementation refuses is left out."""
    import importlib

    from convbench.build.toolchain import get_dtype
    dtype = get_dtype("float32")
    captured = {}

    class Stub:  # what the kernels do with the SDFG after generated_program
        def replace(self, *args):
            pass

    def capture(layer, source, function, tag, in_place=False):
        captured["text"] = f"# {function} {tag} in_place={in_place}\n{source}"
        return Stub()
    for name in IMPLS:
        impl = registry.get(name)
        module = importlib.import_module(impl.algorithm.__module__)
        original = module.generated_program
        module.generated_program = capture
        try:
            for layer in layers():
                tried = set()
                for params in itertools.chain(_space(impl), _tuned(impl, layer)):
                    key = tuple(sorted(params.items()))
                    if key in tried or impl.unsupported_reason(layer, params):
                        continue
                    tried.add(key)
                    if impl.check_params and impl.check_params(params):
                        continue
                    impl.algorithm(layer, dtype, params)
                    yield f"{name} {layer.key()} {json.dumps(dict(key))}", captured.pop("text")
        finally:
            module.generated_program = original


def digests() -> Dict[str, str]:
    return {config: hashlib.sha256(text.encode()).hexdigest()[:16] for config, text in texts()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the digests (JSON)")
    g.add_argument("--compare", help="compare with digests written before")
    g.add_argument("--show", metavar="CONFIG", help="print the text of one configuration")
    args = p.parse_args(argv)
    if args.show:
        for config, text in texts():
            if config == args.show:
                print(text)
                return 0
        print(f"no configuration {args.show!r}", file=sys.stderr)
        return 2
    now = digests()
    if args.out:
        Path(args.out).write_text(json.dumps(now, indent=0, sort_keys=True))
        print(f"{len(now)} configurations, digests in {args.out}")
        return 0
    before = json.loads(Path(args.compare).read_text())
    changed = sorted(k for k in now if k in before and now[k] != before[k])
    only = sorted(set(now) ^ set(before))
    print(f"{len(now)} configurations now, {len(before)} before; {len(changed)} texts "
          f"changed, {len(only)} configurations in one set only")
    for key in (changed + only)[:20]:
        print("  ", key)
    return 1 if changed or only else 0


if __name__ == "__main__":
    sys.exit(main())
