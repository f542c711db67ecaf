"""Winograd F(m, r) for 3D convolution: its algebra, its tiles, what every Winograd kernel shares."""
