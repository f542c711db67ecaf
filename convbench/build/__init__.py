"""Builds: DaCe settings and compilers, the cache, loading, precisions, GPU builds read on the CPU."""
