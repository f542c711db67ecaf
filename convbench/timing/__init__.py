"""Timing and the machine it runs on: the device, timers, measured ceilings, memory and the heap."""
