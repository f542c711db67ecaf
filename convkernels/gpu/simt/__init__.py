"""The SIMT main loop (FFMA, float32): tiles, gather, main loop, epilogue, and its three passes."""
