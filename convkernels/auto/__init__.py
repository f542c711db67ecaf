"""Convolutions written as DaCe dataflow and scheduled by DaCe's auto-optimize, on either target."""
