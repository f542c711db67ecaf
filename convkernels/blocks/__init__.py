"""Fused network blocks: what follows a convolution in a block (bias, activation, pool)."""
