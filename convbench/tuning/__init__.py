"""Searching for parameters: the quick autotune here, the GPU tune space and its ranking."""
