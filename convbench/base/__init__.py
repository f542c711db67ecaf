"""What every part of the harness stands on: one-line errors, atomic files, progress, tables."""
