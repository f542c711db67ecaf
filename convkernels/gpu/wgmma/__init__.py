"""The Hopper tensor-core main loop (wgmma from shared-memory descriptors, sm_90a) and its emulation."""
