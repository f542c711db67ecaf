"""Hopper's tensor-core main loop: wgmma by shared-memory descriptors (sm_90a), emulated too."""
