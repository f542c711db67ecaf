"""Layer sets: the layer model and its CSV form, benchdnn and ONNX sources, sets by name or path."""

# The library's entry point (docs/architecture.md, "As a library").
from convbench.layersets.sets import load_layers  # noqa: F401
