"""Sweeps: a verify or profile selection run as submitit jobs (local, Slurm), merged."""
