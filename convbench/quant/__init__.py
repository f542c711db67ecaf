"""Quantized convolutions: the int8 convention, exact references and checks, builds, timing.

:mod:`convbench.quant.int8` holds the convention, the references, the kernel's builds and
its check; ``convbench int8`` (:mod:`convbench.commands.int8`) verifies and times it.
"""
