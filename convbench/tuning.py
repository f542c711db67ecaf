"""Tuned parameters: the best tile sizes per implementation, layer and target, in a file.

``tuning/<target>.json`` (committed; written by ``scripts/tune_cpu.py``) holds::

    {"machine": {...}, "entries": {"<implementation>": {"<layer key>": {"PIX": 16, ...}}}}

where the layer key is :meth:`convbench.layers.Layer.key` (geometry and batch).  The
parameters of a build are, in increasing precedence: the implementation's defaults,
the tuned entry for the layer (if any), and the user's ``--param`` values.
``$CONVBENCH_TUNING`` names another file, or ``off`` to ignore tuning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from .errors import UsageError

TUNING_DIR = Path(__file__).resolve().parent.parent / "tuning"
_CACHE: Dict[str, Dict[str, Any]] = {}


def tuning_file(target: str) -> Optional[Path]:
    """The file the tuned parameters of ``target`` are read from (None: tuning off)."""
    env = os.environ.get("CONVBENCH_TUNING")
    if env == "off":
        return None
    return Path(env) if env else TUNING_DIR / f"{target}.json"


def load(target: str) -> Dict[str, Any]:
    """The tuning file's contents (empty when there is none); bad files are UsageErrors."""
    path = tuning_file(target)
    if path is None or not path.is_file():
        return {"entries": {}}
    key = f"{path}:{path.stat().st_mtime_ns}"
    if key not in _CACHE:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UsageError(f"tuning file {path}: {err}") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries", {}), dict):
            raise UsageError(f"tuning file {path}: expected {{\"entries\": {{impl: {{layer: "
                             "params}}}}}}")
        _CACHE[key] = data
    return _CACHE[key]


def tuned_entry(impl_name: str, layer, target: str) -> Dict[str, int]:
    """The tuned parameters stored for ``impl_name`` on ``layer`` (possibly empty)."""
    entry = load(target).get("entries", {}).get(impl_name, {}).get(layer.key(), {})
    return dict(entry)


def tuned_params(impl, layer, target: str,
                 overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, int]:
    """Defaults, updated by the tuned entry, updated by ``overrides`` (validated)."""
    values: Dict[str, Any] = {}
    stored = tuned_entry(impl.name, layer, target)
    known = {p.name for p in impl.params}
    values.update({k: v for k, v in stored.items() if k in known})
    values.update(overrides or {})
    return impl.resolve_params(values)


def store(target: str, impl_name: str, layer, params: Mapping[str, int],
          machine: Mapping[str, Any]) -> Path:
    """Record ``params`` as the tuned entry of ``impl_name`` on ``layer`` (atomically)."""
    from .files import write_atomic
    path = tuning_file(target)
    if path is None:
        raise UsageError("tuning is off ($CONVBENCH_TUNING=off): nowhere to store")
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("entries", {}).setdefault(impl_name, {})[layer.key()] = dict(params)
    data["machine"] = dict(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _CACHE.clear()
    return path
