"""ONNX models as a layer source: the 3D ``Conv`` and ``ConvTranspose`` nodes of a model file.

Shapes come from ONNX shape inference, on the model's own input shape or on
``input_shape`` where its input has symbolic (dynamic) dimensions.  Per node: the kernel
(``kernel_shape``, else the weight's shape), ``strides``, ``dilations``, ``group``,
``pads`` (begin values, then end values: different ones make an asymmetric layer),
``auto_pad`` (``SAME_UPPER`` pads an odd total's extra one at the end, ``SAME_LOWER`` at
the begin, ``VALID`` not at all) and, for ``ConvTranspose``, ``output_padding``.  Node
names become layer names (a nameless node is ``conv<index>``).  A node the layer model
cannot hold (1D or 2D, a dynamic shape left, a transposed convolution padded differently
at its ends) is returned with the reason, not dropped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer, same_padding

OPS = ("Conv", "ConvTranspose")


def onnx_layers(path, input_shape: Optional[Sequence[int]] = None
                ) -> Tuple[List[Layer], List[Tuple[str, str]]]:
    """``(layers, skipped)`` of the model file ``path``: ``skipped`` holds ``(node name,
    reason)`` for each convolution node that is not a layer.  UsageError (one line) for a
    file that is not a model, or an ``input_shape`` that does not fit its input."""
    try:
        import onnx
        from onnx import shape_inference
    except ImportError:
        raise UsageError("--from-onnx needs the onnx package (pip install onnx)") from None
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--from-onnx: no file {path}")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:  # noqa: BLE001 - protobuf and checker errors alike
        raise UsageError(f"--from-onnx: {path} is not an ONNX model "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''})") from None
    if input_shape is not None:
        _set_input_shape(model, path, input_shape)
    try:
        model = shape_inference.infer_shapes(model)
    except Exception as err:  # noqa: BLE001
        raise UsageError(f"--from-onnx: shape inference failed on {path}: "
                         f"{str(err).splitlines()[0][:160]}") from None
    shapes = _shapes(model)
    layers, skipped, names = [], [], set()
    for index, node in enumerate(model.graph.node):
        if node.op_type not in OPS:
            continue
        name = node.name or f"{node.op_type.lower()}{index}"
        while name in names:
            name += "#2"
        names.add(name)
        try:
            layers.append(node_layer(node, name, shapes))
        except ValueError as err:
            skipped.append((name, str(err).split(": ", 1)[-1] if str(err).startswith("layer ")
                            else str(err)))
    return layers, skipped


def _set_input_shape(model, path, input_shape) -> None:
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise UsageError(f"--input-shape: {path} has {len(inputs)} inputs; one shape fits "
                         "only a model with one")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != len(input_shape):
        raise UsageError(f"--input-shape: {path}'s input has {len(dims)} dimensions, "
                         f"got {len(input_shape)}")
    for dim, value in zip(dims, input_shape):
        known = dim.dim_value if dim.HasField("dim_value") else None
        if known is not None and known != value:
            raise UsageError(f"--input-shape: {path}'s input is fixed at "
                             f"{[d.dim_value for d in dims]}, got {list(input_shape)}")
        dim.dim_value = int(value)


def _shapes(model) -> Dict[str, List[Optional[int]]]:
    """Tensor name -> dimensions (None where symbolic), from the inferred value infos and
    the initializers."""
    shapes: Dict[str, List[Optional[int]]] = {}
    graph = model.graph
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            shapes[info.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                                 else None for d in tensor.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def node_layer(node, name: str, shapes) -> Layer:
    """The layer of one ``Conv``/``ConvTranspose`` node; ValueError with the reason where
    the layer model cannot hold it."""
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
    if x is None or w is None:
        raise ValueError("the shape of its input or weight is unknown (give --input-shape)")
    if len(x) != 5:
        raise ValueError(f"a {len(x) - 2}D convolution (input of rank {len(x)}): only 3D "
                         "convolutions are layers")
    if any(v is None for v in x) or any(v is None for v in w):
        raise ValueError(f"a dynamic shape ({x}): give --input-shape")
    n, c, d, h, wd = x
    kernel = tuple(attrs.get("kernel_shape", w[2:]))
    strides = tuple(attrs.get("strides", (1, 1, 1)))
    dilations = tuple(attrs.get("dilations", (1, 1, 1)))
    group = int(attrs.get("group", 1))
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    pads = tuple(attrs.get("pads", (0,) * 6))
    begin, end = pads[:3], pads[3:]
    if node.op_type == "ConvTranspose":
        if auto not in ("NOTSET", "VALID") or begin != end:
            raise ValueError("a transposed convolution padded differently at its two ends "
                             f"(pads {list(pads)}, auto_pad {auto}) is not in the layer model")
        return Layer.transposed_of(name, n, c, w[1] * group, (d, h, wd), kernel, strides,
                                   begin if auto == "NOTSET" else (0, 0, 0), dilations, group,
                                   tuple(attrs.get("output_padding", (0, 0, 0))))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        sides = [same_padding(i, k, s, dl) for i, k, s, dl in
                 zip((d, h, wd), kernel, strides, dilations)]
        if auto == "SAME_LOWER":
            sides = [(back, front) for front, back in sides]
        begin, end = tuple(f for f, _ in sides), tuple(b for _, b in sides)
    elif auto == "VALID":
        begin = end = (0, 0, 0)
    layer = Layer.from_triples(name, n, c, w[0], (d, h, wd), kernel, strides, begin,
                               dilations, group)
    if end != begin:
        layer = dataclasses.replace(layer, **{f"pad_{dim}_end": e for dim, e in zip("dhw", end)})
    return layer
