"""convbench: a workbench for 3D-convolution compiler experiments with DaCe.

The package holds the harness shared by every tool of the project: the layer
model (:mod:`convbench.layers`), the implementation registry
(:mod:`convbench.registry`), the DaCe toolchain (:mod:`convbench.toolchain`),
tensor layouts (:mod:`convbench.layouts`), devices (:mod:`convbench.devices`)
and verification (:mod:`convbench.verify`).  Implementations live in the
top-level ``impls`` package, one module each.
"""

__version__ = "0.1.0"
