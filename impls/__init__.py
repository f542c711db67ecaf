"""The implementations, one registration each, named after the implementation users type.

Every module registers its implementation with :func:`convbench.registry.register` when
imported, from its kernel in the kernel library :mod:`convkernels`; the harness imports them
all by name (:func:`convbench.registry.load_implementations`).  A module holds a docstring,
imports and its ``register(...)`` call, nothing else (``tests/test_architecture.py``).
"""
