"""Checks: the references (torch float64, torch, cuDNN), verification, the check's power."""
