import functools
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from convbench import devices  # noqa: E402
from convbench.verify import make_reference  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if devices.gpu_usable():
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {devices.gpu_problem()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cachedir(tmp_path_factory):
    """One build folder for the whole session, outside the project cache."""
    return tmp_path_factory.mktemp("builds")


@functools.lru_cache(maxsize=2)  # CosmoFlow references take up to ~1 GB each
def _reference(layer, seed, pass_):
    return make_reference(layer, pass_, seed=seed)


@pytest.fixture(scope="session")
def reference():
    """``reference(layer, seed=0, pass_="fwd")``: float64 reference of a pass, shared
    between implementations (tests order implementations by pass, so that it is reused)."""
    return lambda layer, seed=0, pass_="fwd": _reference(layer, seed, str(pass_))


@pytest.fixture
def write_csv(tmp_path):
    def write(text, name="layers.csv"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


PYTHON = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
