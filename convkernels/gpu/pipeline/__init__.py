"""The multistage pipeline of the fast GPU kernels: the program skeleton, its tasklets, cp.async."""
