"""``convbench``: one command line for everything the workbench does.

    convbench verify  --implementation implicitGemm --paramscsv cosmoflow
    convbench profile --implementation implicitGemm --enableplots
    convbench list [--pass bwd_data]
    convbench layers --from-torch mymodels:net --input-shape 1,3,16,112,112 --out net.csv
    convbench sweep profile --implementation implicitGemm --pass fwd,bwd_data --executor slurm
    convbench bench | tune | precompile | end2end | stress | plot | campaign ... [--help]

Each subcommand is the library function behind one of the project's scripts, with the
same flags (declared once, in :mod:`convbench.commands.flags`) and exit codes: 0 done, 1 a check
or build failed, 2 bad input (one line on stderr), 130 interrupted.  ``profile_conv3d.py``
and the files in ``scripts/`` stay as they were, as thin fronts of the same functions.
"""

import importlib
import sys
from typing import List, Optional

#: name -> (module, keyword arguments of its ``main``, one-line help)
SUBCOMMANDS = {
    "verify": ("convbench.commands.profile_conv3d", {"mode": "verify"},
               "check implementations layer by layer against torch float64 (and cuDNN)"),
    "profile": ("convbench.commands.profile_conv3d", {"mode": "profile"},
                "time an implementation per layer next to torch/cuDNN; result files, plots"),
    "list": ("convbench.commands.profile_conv3d", {"mode": "list"}, "list the registered implementations"),
    "status": ("convbench.commands.status", {},
               "per implementation and pass, what the committed results say"),
    "bench": ("convbench.commands.bench", {},
              "CPU benchmark: every forward implementation against torch, per layer"),
    "tune": ("convbench.commands.tune", {}, "parameter search for a CPU implementation"),
    "precompile": ("convbench.commands.precompile", {}, "fill the build cache in parallel"),
    "end2end": ("convbench.network.end2end", {},
                "CosmoFlow networks with DaCe convolutions: check, train, time"),
    "stress": ("convbench.commands.stress", {}, "one very large layer, DaCe against torch"),
    "plot": ("convbench.commands.plot", {}, "redraw the plots of result folders"),
    "sweep": ("convbench.sweep.command", {},
              "verify or profile selections as jobs (local, Slurm) through submitit, merged"),
    "compare": ("convbench.commands.compare", {},
                "two runs side by side: per layer the ratio, and whether it is beyond noise"),
    "layers": ("convbench.commands.layers", {},
               "show a layer set, convert it to CSV, or take a torch or ONNX model's 3D "
               "convolutions"),
    "int8": ("convbench.commands.int8", {},
             "the int8 forward kernel: verify exactly, or time against float32 and torch's "
             "quantized Conv3d"),
    "sparse": ("convbench.commands.sparse", {},
               "the block-sparse forward kernel: verify, or time against density"),
    "compress-train": ("convbench.network.compressed", {},
                       "CosmoFlow trained in float32, with LSQ quantization and pruned: "
                       "validation losses"),
    "sass": ("convbench.commands.sass", {},
             "a GPU build's machine code: per kernel its resources and its main loop's mix"),
    "campaign": ("convbench.campaign.cli", {},
                 "the GPU campaign: pack, run, unpack (docs/gpu-campaign.md)"),
    "validate-timing": ("convbench.commands.validate_timing", {},
                        "the timer against DaCe's own instrumentation"),
    "measure-builds": ("convbench.commands.measure_builds", {},
                       "CPU and GPU build times per implementation"),
    "check-power": ("convbench.commands.check_power", {},
                    "how far the check's tolerance sits from correct and wrong results"),
    "bench-vs-network": ("convbench.commands.bench_vs_network", {},
                         "per-layer ratios of the CPU bench next to the network's"),
    "winograd-error": ("convbench.commands.winograd_error", {},
                       "float32 error of 3D Winograd against the direct sum"),
    "codegen-hashes": ("convbench.commands.codegen_hashes", {},
                       "digests of every implementation's generated code against the "
                       "committed ones"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: convbench SUBCOMMAND [flags]   (convbench SUBCOMMAND --help for its flags)",
             "", "subcommands:"]
    lines += [f"  {name:<{width}}  {entry[2]}" for name, entry in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        from convbench.base.errors import run_main
        return run_main("convbench", lambda _: print(usage()) or 0)
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"convbench: error: unknown subcommand '{name}' (choose from "
              f"{', '.join(SUBCOMMANDS)})", file=sys.stderr)
        return 2
    module, kwargs, _ = SUBCOMMANDS[name]
    if kwargs.get("mode") == "list":
        kwargs, rest = {}, ["--list"] + rest
    return importlib.import_module(module).main(rest, prog=f"convbench {name}", **kwargs)


if __name__ == "__main__":
    sys.exit(main())
