"""Register-blocked direct convolutions on NDHWC for the CPU, written as Python per layer."""
