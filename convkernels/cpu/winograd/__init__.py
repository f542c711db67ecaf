"""Winograd F(2^3, 3^3) for the CPU in all three passes: C++ kernels written per layer."""
