"""The command-line flags the tools share, each declared once, so that a flag means the
same thing in every subcommand and script.  ``p`` is a parser or an argument group.

Older spellings stay as aliases of one flag: ``--warmupiter``/``--warmup``,
``--totaliter``/``--iters``, ``--implementation``/``--impl``/``--impls``.  ``--outdir DIR``
is always a result folder, ``--out FILE`` always a single result file.
"""

import argparse
from typing import List, Optional, Sequence

from convbench.base.errors import UsageError, check_at_least


def _flag(p, names: Sequence[str], **kwargs) -> None:
    """One flag under several spellings: the first is documented, the others are hidden
    aliases (so that an error names the spelling the user typed)."""
    p.add_argument(names[0], **kwargs)
    for alias in names[1:]:
        p.add_argument(alias, **dict(kwargs, help=argparse.SUPPRESS))


def add_implementation_flag(p, default_help: str, many: bool = False) -> None:
    """``--implementation NAME`` (``many``: repeatable, comma lists too)."""
    _flag(p, ["--implementation", "--impl"] + (["--impls"] if many else []),
          dest="implementation", action="append" if many else "store", default=None,
          metavar="NAME" + (",..." if many else ""),
          help=f"registered implementation{'s' if many else ''} ({default_help}; also "
          f"--impl{', --impls' if many else ''})")


def implementation_names(values: Optional[Sequence[str]]) -> Optional[List[str]]:
    """The names given to a repeatable ``--implementation`` (comma lists split), or None."""
    if values is None:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def add_layer_flags(p, default_set: Optional[str] = "cosmoflow", many: bool = False,
                    batch_default: Optional[int] = None, select: bool = True,
                    skip_invalid: bool = False) -> None:
    """``--paramscsv`` (``many``: repeatable), ``--currlayer``/``--lastlayer``, ``--batch``,
    and (``skip_invalid``) ``--skip-invalid``."""
    p.add_argument("--paramscsv", action="append" if many else "store",
                   default=None if many else default_set, metavar="SET",
                   help="layer set: a name in convparams/ or a CSV path"
                   + (" (repeatable)" if many else "") + f" (default: {default_set})")
    if select:
        p.add_argument("--currlayer", type=int, default=None, metavar="I",
                       help="first layer to run (0-based, default 0)")
        p.add_argument("--lastlayer", type=int, default=None, metavar="J",
                       help="run layers I..J-1 (default: to the end of the set)")
    p.add_argument("--batch", type=int, default=batch_default, metavar="N",
                   help="batch size" + (f" (default {batch_default})" if batch_default
                                        else ", overriding the CSV"))
    if skip_invalid:
        p.add_argument("--skip-invalid", action="store_true",
                       help="run the lines of the layer file the layer model can hold and "
                       "list the others (default: the first bad line is an error)")


def pick_layers(pairs, text: Optional[str]):
    """The ``(set, layer)`` pairs whose layer ``--layer NAME,...`` names (all without it);
    a :class:`UsageError` naming the unknown ones."""
    if not text:
        return list(pairs)
    wanted = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {layer.name for _, layer in pairs})
    if unknown:
        raise UsageError(f"--layer: unknown layer(s) {', '.join(unknown)}")
    return [(s, layer) for s, layer in pairs if layer.name in wanted]


def add_device_flag(p, default: str = "auto") -> None:
    p.add_argument("--device", default=default, metavar="cpu|gpu|auto",
                   help=f"where to run (default {default}; auto: the GPU if a CUDA device is "
                   "usable)")


def add_param_flag(p) -> None:
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a tunable parameter of the implementation (repeatable)")


def add_precision_flags(p, int8: bool = False) -> None:
    """``--dtype`` and ``--math`` (:mod:`convbench.build.precision`); ``int8``: ``--dtype``
    also takes int8 (the int8 kernel, :mod:`convbench.commands.int8`)."""
    from convbench.build.precision import DTYPES, MATH_MODES
    p.add_argument("--dtype", default="float32", metavar="|".join(list(DTYPES) + ["int8"] * int8),
                   help="storage precision of inputs and outputs; the 16-bit ones sum in "
                   "float32" + ("; int8: the int8 forward kernel on the CPU (uint8 "
                                "activations, int8 filters, int32 sums; convbench int8)"
                                if int8 else "") + " (default float32)")
    p.add_argument("--math", default="ieee", metavar="|".join(MATH_MODES),
                   help="tf32: products on operands rounded to TF32, as tensor cores compute "
                   "them (GPU, float32 only; default ieee)")


def add_seed_flag(p) -> None:
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def add_threads_flag(p, default=None) -> None:
    fallback = "$OMP_NUM_THREADS, else every core" if default is None else str(default)
    p.add_argument("--threads", type=int, default=default, metavar="N",
                   help=f"CPU threads for DaCe (OpenMP) and torch alike (default: {fallback})")


def add_timing_flags(p, warmup: int = 10, iters: int = 100, time_limit: bool = True,
                     heap: bool = True) -> None:
    """``--warmupiter``/``--warmup``, ``--totaliter``/``--iters``, ``--time-limit``,
    ``--no-flush``, ``--heap``."""
    _flag(p, ["--warmupiter", "--warmup"], dest="warmupiter", type=int, default=warmup,
          metavar="N", help=f"untimed calls before the samples (default {warmup}; also --warmup)")
    _flag(p, ["--totaliter", "--iters"], dest="totaliter", type=int, default=iters,
          metavar="N", help=f"timed calls per layer and backend (default {iters}; also --iters)")
    if time_limit:
        from convbench.timing.timers import MIN_SAMPLES
        p.add_argument("--time-limit", type=float, default=None, metavar="S",
                       help="stop sampling a backend on a layer after S seconds, warm-up "
                       f"included (at least {MIN_SAMPLES} samples are kept)")
    p.add_argument("--no-flush", action="store_true",
                   help="do not flush the caches before each timed call")
    if heap:
        add_heap_flag(p)


def add_heap_flag(p) -> None:
    """``--heap warm|system`` (:mod:`convbench.timing.heap`)."""
    p.add_argument("--heap", default="warm", metavar="warm|system",
                   help="CPU: warm (default) keeps freed memory mapped, so the outputs that "
                   "torch and DaCe allocate on every call cost no page faults; system: the "
                   "C library's policy")


def check_heap_flag(args) -> None:
    from convbench.timing.heap import POLICIES
    heap = getattr(args, "heap", "warm")
    if heap not in POLICIES:
        raise UsageError(f"--heap: unknown policy '{heap}' (warm, system)")


def check_timing_flags(args, least_warmup: int = 0, least_iters: int = 1) -> None:
    check_heap_flag(args)
    check_at_least(("--warmupiter", args.warmupiter, least_warmup),
                   ("--totaliter", args.totaliter, least_iters))
    limit = getattr(args, "time_limit", None)
    if limit is not None and not limit > 0:
        raise UsageError(f"--time-limit: must be a positive number of seconds, got {limit}")


def add_cachedir_flag(p) -> None:
    p.add_argument("--cachedir", default=None, metavar="DIR",
                   help="build cache (default: $CONVBENCH_CACHE or .cache/builds)")


def add_build_flags(p) -> None:
    """``--cachedir``, ``--loadprecompiled``, ``--require-precompiled``."""
    add_cachedir_flag(p)
    p.add_argument("--loadprecompiled", action="store_true",
                   help="load stored builds without parsing, transforming or compiling; "
                   "build (and store) only what is missing or stale")
    p.add_argument("--require-precompiled", action="store_true",
                   help="like --loadprecompiled, but a missing or stale build fails the layer")


def build_policy(args, default: str = "rebuild") -> str:
    """The cache policy that ``add_build_flags``' flags ask for."""
    if getattr(args, "require_precompiled", False):
        return "require"
    return "reuse" if getattr(args, "loadprecompiled", False) else default


def add_outdir_flag(p, default: str) -> None:
    p.add_argument("--outdir", default=None, metavar="DIR",
                   help=f"result folder (default {default})")


def add_out_flag(p, default: str) -> None:
    """``--out FILE``: one result file (JSON), where a tool writes a single file."""
    p.add_argument("--out", default=None, metavar="FILE",
                   help=f"result file (default {default})")
    p.set_defaults(check_out_file=True)  # the parser checks it (errors.check_paths)
