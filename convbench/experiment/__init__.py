"""The pipeline as a library: implementations on layers, built, checked, timed and written."""

# The library's entry point (docs/architecture.md, "As a library").
from convbench.experiment.pipeline import Experiment, Observer, Record, TimingOptions  # noqa: F401
