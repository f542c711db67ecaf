"""GPU kernels: tiled and pipelined main loops, gathers, epilogues, PTX and its CPU emulation."""
