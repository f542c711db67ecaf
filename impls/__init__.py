"""Convolution implementations, one module each.

Every module registers its implementation(s) with
:func:`convbench.registry.register` when imported; the harness imports them all
(:func:`convbench.registry.load_implementations`).  Modules whose names start
with an underscore hold shared building blocks and register nothing.
"""
