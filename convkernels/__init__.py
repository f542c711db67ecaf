"""The kernel library: the DaCe programs, schedules and C++ that implementations are built from."""
