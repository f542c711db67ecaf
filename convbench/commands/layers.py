"""Layer sets: show one, convert one to CSV, or take the 3D convolutions of a torch model.

    convbench layers --paramscsv onednn_shapes_3d             # a table of the set
    convbench layers --paramscsv onednn_shapes_3d --out my.csv  # the set as a layer CSV
    convbench layers --from-torch mypkg.models:make_net --input-shape 1,3,16,112,112 --out net.csv
    convbench layers --from-onnx unet3d.onnx [--input-shape 1,1,64,64,64] --out unet.csv

``--from-torch MODULE:FACTORY`` imports ``MODULE`` (a ``.py`` file, or a module in the
current folder or on the Python path), calls ``FACTORY()`` for a ``torch.nn.Module``, and
runs one forward pass on zeros of ``--input-shape`` (batch first) with a forward hook on
every ``Conv3d`` and ``ConvTranspose3d``: each call becomes a layer with the shape it saw,
its stride, padding, dilation and groups, named by the module's path in the model (``#2``
for a second call). What the layer model cannot express (a padding mode other than zeros) is
refused with the module's name; ``padding="same"`` with an even (dilated) kernel pads one
more at the back, as torch does.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import List, Sequence

from convbench.commands import flags
from convbench.base.errors import ArgumentParser, UsageError, check_at_least, run_main
from convbench.layersets.layer import Layer, format_csv

PROG = "convbench layers"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--paramscsv", default=None, metavar="SET",
                     help="layer set: a name in convparams/, a CSV or a benchdnn descriptor "
                     "file (default: cosmoflow)")
    src.add_argument("--from-torch", default=None, metavar="MODULE:FACTORY",
                     help="take the Conv3d/ConvTranspose3d layers of the model FACTORY() "
                     "returns, traced on --input-shape")
    src.add_argument("--from-onnx", default=None, metavar="MODEL.onnx",
                     help="take the 3D Conv/ConvTranspose nodes of an ONNX model, shapes "
                     "by ONNX shape inference")
    p.add_argument("--input-shape", default=None, metavar="N,C,D,H,W",
                   help="the model's input shape: for --from-torch, and for --from-onnx "
                   "where the model's input has dynamic dimensions (batch first)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="batch size, overriding the set's")
    flags.add_out_flag(p, "print a table instead")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.batch is not None:
        check_at_least(("--batch", args.batch, 1))
    out = Path(args.out) if args.out else None  # checked by the parser
    if args.from_torch:
        if not args.input_shape:
            raise UsageError("--from-torch needs --input-shape N,C,D,H,W")
        shape = parse_shape(args.input_shape)
        layers = from_torch(load_factory(args.from_torch), shape)
        source = f"--from-torch {args.from_torch} --input-shape {args.input_shape}"
    elif args.from_onnx:
        from convbench.layersets.onnx_layers import onnx_layers
        shape = parse_shape(args.input_shape) if args.input_shape else None
        layers, skipped = onnx_layers(args.from_onnx, shape)
        source = f"--from-onnx {args.from_onnx}" + (
            f" --input-shape {args.input_shape}" if args.input_shape else "")
        for name, why in skipped:
            print(f"skipped {name}: {why}", file=sys.stderr)
        if not layers and skipped:
            raise UsageError(f"{source}: no convolution node is a 3D layer ({len(skipped)} "
                             f"skipped; the first, {skipped[0][0]}: {skipped[0][1]})")
    else:
        if args.input_shape:
            raise UsageError("--input-shape goes with --from-torch or --from-onnx")
        from convbench.layersets.sets import load_layers
        spec = args.paramscsv or "cosmoflow"
        layers = load_layers(spec)
        source = f"--paramscsv {spec}"
    if args.batch is not None:
        layers = [layer.with_batch(args.batch) for layer in layers]
    if not layers:
        raise UsageError(f"{source}: no 3D convolution found")
    if out is None:
        for layer in layers:
            print(f"{layer.name:28s} {layer.describe()}")
        return 0
    out.write_text(format_csv(layers, comments=[f"written by {PROG} {source}"]))
    print(f"wrote {len(layers)} layers to {out}")
    return 0


def parse_shape(text: str) -> List[int]:
    """``"1,3,16,112,112"`` -> [1, 3, 16, 112, 112] (five positive integers)."""
    try:
        shape = [int(v) for v in text.replace("x", ",").split(",")]
    except ValueError:
        raise UsageError(f"--input-shape: expected five integers N,C,D,H,W, got {text!r}") from None
    if len(shape) != 5 or min(shape) < 1:
        raise UsageError(f"--input-shape: expected five positive integers N,C,D,H,W, got {text!r}")
    return shape


def load_factory(spec: str):
    """The callable ``FACTORY`` of ``MODULE:FACTORY``: ``MODULE`` is a file (``nets/unet.py``)
    or a module on the Python path or in the current folder (``nets.unet``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--from-torch: expected MODULE:FACTORY, got {spec!r}")
    as_file = Path(module_name if module_name.endswith(".py")
                   else module_name.replace(".", "/") + ".py")
    try:
        if module_name.endswith(".py") or (as_file.is_file() and not _importable(module_name)):
            if not as_file.is_file():
                raise FileNotFoundError(f"no file {as_file}")
            loader_spec = importlib.util.spec_from_file_location(as_file.stem, as_file)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - the user's module: any failure is bad input
        raise UsageError(f"--from-torch: cannot import {module_name!r}: "
                         f"{type(err).__name__}: {err}") from None
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise UsageError(f"--from-torch: {module_name!r} has no {attr!r}")
    if not callable(factory):
        raise UsageError(f"--from-torch: {spec!r} is not callable")
    return factory


def _importable(name: str) -> bool:
    """True if ``name`` is a module on the Python path."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def from_torch(model_or_factory, input_shape: Sequence[int]) -> List[Layer]:
    """The 3D convolutions one forward pass of the model runs on zeros of ``input_shape``,
    in call order (see the module's docstring)."""
    import torch
    model = model_or_factory
    if not isinstance(model, torch.nn.Module):
        try:
            model = model_or_factory()
        except Exception as err:  # noqa: BLE001 - the user's code
            raise UsageError(f"--from-torch: the factory failed: {type(err).__name__}: "
                             f"{err}") from None
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"--from-torch: the factory returned a {type(model).__name__}, "
                         "not a torch.nn.Module")
    layers: List[Layer] = []
    problems: List[str] = []
    calls = {}

    def hook(name):
        def record(module, inputs, output):
            calls[name] = calls.get(name, 0) + 1
            label = name if calls[name] == 1 else f"{name}#{calls[name]}"
            try:
                layers.append(module_layer(label, module, tuple(inputs[0].shape)))
            except ValueError as err:
                problems.append(f"{label}: {err}")
        return record

    handles = [m.register_forward_hook(hook(name or type(m).__name__))
               for name, m in model.named_modules()
               if isinstance(m, (torch.nn.Conv3d, torch.nn.ConvTranspose3d))]
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(tuple(input_shape)))
    except Exception as err:  # noqa: BLE001 - the user's model on the user's shape
        raise UsageError(f"--from-torch: the model's forward pass on {tuple(input_shape)} "
                         f"failed: {type(err).__name__}: {err}") from None
    finally:
        for h in handles:
            h.remove()
    if problems:
        raise UsageError(f"--from-torch: {problems[0]}"
                         + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    return layers


def module_layer(name: str, module, input_shape) -> Layer:
    """The layer of one ``Conv3d`` / ``ConvTranspose3d`` call on ``input_shape``."""
    import torch
    if len(input_shape) != 5:
        raise ValueError(f"input of shape {tuple(input_shape)}: expected N,C,D,H,W")
    if getattr(module, "padding_mode", "zeros") != "zeros":
        raise ValueError(f"padding_mode {module.padding_mode!r}: only zero padding is in the "
                         "layer model")
    k, s, d = tuple(module.kernel_size), tuple(module.stride), tuple(module.dilation)
    pad, end = module.padding, None
    if isinstance(pad, str):  # "same" or "valid" (Conv3d only)
        if pad == "valid":
            pad = (0, 0, 0)
        else:  # torch pads an odd total's extra one at the back
            spans = [dl * (kk - 1) for kk, dl in zip(k, d)]
            pad = tuple(span // 2 for span in spans)
            end = tuple(span - span // 2 for span in spans)
    n, c, di, hi, wi = input_shape
    if isinstance(module, torch.nn.ConvTranspose3d):
        return Layer.transposed_of(name, n, c, module.out_channels, (di, hi, wi), k, s,
                                   tuple(pad), d, module.groups, tuple(module.output_padding))
    layer = Layer.from_triples(name, n, c, module.out_channels, (di, hi, wi), k, s, tuple(pad),
                               d, module.groups)
    if end is not None and end != tuple(pad):
        layer = dataclasses.replace(layer, **{f"pad_{dim}_end": e for dim, e in zip("dhw", end)})
    return layer


if __name__ == "__main__":
    sys.exit(main())
