"""The float32 error of 3D Winograd F(m^3, 3^3) against the direct sum, per channel count
(convkernels.winograd.algebra; issue 44's accuracy question, asked before any kernel exists).

Both run in float32 on the same normal inputs: Winograd through
:func:`convkernels.winograd.algebra.conv3d` (sequential channel sums), the direct sum
through torch's conv3d on the CPU.  Errors are against float64, per output element in units
of ``u ||t||_2`` (float32's unit roundoff times the l2 norm of the element's products, the
scale of the verification's tolerance), and as the ratio of RMS errors.  Writes
``winograd_error.csv``, ``.md`` and ``metadata.json`` into ``--outdir``.
"""

import json
from pathlib import Path

from convbench.commands import flags
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main

PROG = "winograd_error.py"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--m", default="2,4", metavar="M,...",
                   help="output tile edges: 2 is F(2^3, 3^3), 4 is F(4^3, 3^3) (default 2,4)")
    p.add_argument("--channels", default="16,64,256", metavar="C,...",
                   help="input channel counts (default 16,64,256)")
    p.add_argument("--filters", type=int, default=32, metavar="K",
                   help="output channels (default 32)")
    p.add_argument("--size", type=int, default=8, metavar="S",
                   help="output edge S, a multiple of every m (default 8)")
    flags.add_seed_flag(p)
    flags.add_outdir_flag(p, "outputs/winograd_error/")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _ints(flag: str, text: str):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag}: expected positive integers, got {text!r}")
    return values


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    tiles, channels = _ints("--m", args.m), _ints("--channels", args.channels)
    check_at_least(("--filters", args.filters, 1), ("--size", args.size, 1))
    from convkernels.winograd import algebra
    unknown = sorted(set(tiles) - set(algebra.POINTS))
    if unknown:
        raise UsageError(f"--m: no points chosen for {unknown} (known: "
                         f"{', '.join(map(str, algebra.POINTS))})")
    if any(args.size % m for m in tiles):
        raise UsageError(f"--size {args.size}: not a multiple of every --m ({args.m})")
    import numpy as np
    import torch
    from convbench.base import tables
    from convbench.results.writer import run_metadata
    from convbench.build.toolchain import PROJECT_ROOT
    from convbench.check.verify import TOL_FACTOR
    out = Path(args.outdir or "outputs/winograd_error")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    u, S, K = 2.0 ** -24, args.size, args.filters
    rows = []
    for C in channels:
        x = rng.standard_normal((1, C, S + 2, S + 2, S + 2)).astype(np.float32)
        w = rng.standard_normal((K, C, 3, 3, 3)).astype(np.float32)
        x64, w64 = torch.from_numpy(x).double(), torch.from_numpy(w).double()
        exact = torch.nn.functional.conv3d(x64, w64).numpy()
        scale = u * np.sqrt(torch.nn.functional.conv3d(x64 ** 2, w64 ** 2).numpy())
        direct = torch.nn.functional.conv3d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
        d_err = direct - exact
        for m in tiles:
            err = algebra.conv3d(x, w, m) - exact
            bound = algebra.error_bound(x, w, m)
            stat = algebra.error_bound(x, w, m, tol_factor=TOL_FACTOR, random_inputs=True)
            dropped = algebra.conv3d(x[:, 1:], w[:, 1:], m) - exact  # one channel left out
            rows.append({"m": m, "points": " ".join(str(p) for p in algebra.POINTS[m]),
                         "C": C, "K": K, "size": S,
                         "max_err_over_u_l2": float(np.max(np.abs(err) / scale)),
                         "direct_max_err_over_u_l2": float(np.max(np.abs(d_err) / scale)),
                         "rms_over_direct": float(np.sqrt(np.mean(err ** 2))
                                                  / np.sqrt(np.mean(d_err ** 2))),
                         "roundings": algebra.path_roundings(m, C),
                         "max_err_over_bound": float(np.max(np.abs(err) / bound)),
                         "max_err_over_statistical": float(np.max(np.abs(err) / stat)),
                         "dropped_channel_over_bound": float(np.max(np.abs(dropped) / bound)),
                         "dropped_channel_over_statistical": float(np.max(np.abs(dropped) / stat)),
                         "off_1pct_over_bound": float(np.max(np.abs(0.01 * exact) / bound)),
                         "off_1pct_over_statistical": float(np.max(np.abs(0.01 * exact) / stat))})
            r = rows[-1]
            print(f"F({m}^3, 3^3) C={C:<4} max err {r['max_err_over_u_l2']:8.1f} u||t||  "
                  f"(direct {r['direct_max_err_over_u_l2']:.1f}), RMS {r['rms_over_direct']:.2f}x "
                  f"the direct sum's; {r['max_err_over_bound']:.2g} of the rigorous bound, "
                  f"{r['max_err_over_statistical']:.2g} of the statistical one; a dropped channel "
                  f"{r['dropped_channel_over_bound']:.3g} / {r['dropped_channel_over_statistical']:.3g}, "
                  f"1% off {r['off_1pct_over_bound']:.3g} / {r['off_1pct_over_statistical']:.3g}",
                  flush=True)
    columns = list(rows[0])
    (out / "winograd_error.csv").write_text("\n".join(
        [",".join(columns)] + [",".join(str(r[c]) for c in columns) for r in rows]) + "\n")
    (out / "winograd_error.md").write_text(
        "Max error per element in units of u ||t||_2, RMS error over the direct sum's "
        "(float32, torch conv3d on the CPU), and the worst element's error over the rigorous "
        "bound gamma_n Y_abs (n roundings per term; convkernels.winograd.algebra.error_bound) and over "
        "the statistical bound the checks use on random inputs (statistical_bound, safety "
        "factor 8). Planted: one input channel left out of the sum, and the exact result "
        "1% off; each as its worst element over the rigorous / the statistical bound "
        "(fails where > 1).\n\n"
        + tables.markdown(
            ["F", "points", "C", "K", "output", "Winograd max", "direct max", "RMS / direct",
             "n", "max err / bound", "/ statistical", "dropped channel", "1% off"],
            [[f"F({r['m']}^3, 3^3)", r["points"], r["C"], r["K"], f"{r['size']}^3",
              f"{r['max_err_over_u_l2']:.1f}", f"{r['direct_max_err_over_u_l2']:.1f}",
              f"{r['rms_over_direct']:.2f}", r["roundings"], f"{r['max_err_over_bound']:.2g}",
              f"{r['max_err_over_statistical']:.2g}",
              f"{r['dropped_channel_over_bound']:.3g} / {r['dropped_channel_over_statistical']:.3g}",
              f"{r['off_1pct_over_bound']:.3g} / {r['off_1pct_over_statistical']:.3g}"]
             for r in rows], "llrrrrrrrrrrr") + "\n")
    meta = run_metadata(PROJECT_ROOT, "cpu", None)
    meta.update(kind="winograd_error", seed=args.seed, tiles=tiles, channels=channels,
                filters=K, size=S)
    (out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{out}/winograd_error.md")
    return 0
