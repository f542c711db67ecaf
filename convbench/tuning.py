"""Tuned parameters: the best tile sizes per implementation, layer and target, in a file.

``tuning/<target>.json`` (committed; ``cpu.json`` written by ``scripts/tune_cpu.py``,
``gpu.json`` by the GPU campaign's tune tier through ``gpu_campaign.py unpack``) holds,
per machine (:func:`machine_id`: the CPU model and its widest vector ISA, or the GPU's
name and CUDA version)::

    {"machines": {"<machine id>": {"machine": {...}, "entries": {
        "<implementation>": {"<layer key>": {"PIX": 16, ...}}},
        "best": {"<pass>": {"<layer key>": "<implementation>"}}}}}

where the layer key is :meth:`convbench.layers.Layer.key` (geometry and batch).  Only
the entries of this machine apply: a CPU with none gets the implementations' defaults,
and a line on standard error says so (once per implementation), never another
machine's choice in silence.  A file of the older form ``{"entries": ...}`` (no
machines) applies to any machine.  The
parameters of a build are, in increasing precedence: the implementation's defaults,
the tuned entry for the layer (if any), and the user's ``--param`` values.
``$CONVBENCH_TUNING`` names another file, or ``off`` to ignore tuning.

``best`` (written by ``scripts/bench_cpu.py --store``) names the fastest implementation
of a pass per layer, as the benchmark measured it with the tuned parameters; the
end-to-end network takes it by default (:func:`best_implementation`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from . import isa
from .errors import UsageError

TUNING_DIR = Path(__file__).resolve().parent.parent / "tuning"
_CACHE: Dict[str, Dict[str, Any]] = {}
_WARNED: set = set()
_SAID: set = set()


#: Names the GPU whose entries a build for the GPU takes, where none is visible (GPU code
#: is compiled on hosts without one): ``NVIDIA H200 (CUDA 13.0)``, as the campaign writes it.
GPU_ENV = "CONVBENCH_GPU"


@functools.lru_cache(maxsize=None)
def machine_id(target: str = "cpu") -> str:
    """What tuned entries are keyed by.  CPU: ``<CPU model> (family F model M) | <widest
    vector ISA>``.  Family and model tell apart generations that a VM names alike ("AMD
    EPYC"); the same CPU with another ISA (a VM that hides AVX-512) is another machine.
    GPU: ``<device name> (CUDA <version>)`` (a kernel's best tiles depend on both), from
    the visible GPU, else ``$CONVBENCH_GPU``, else ``gpu`` (no entry applies)."""
    if target == "gpu":
        if os.environ.get(GPU_ENV):
            return os.environ[GPU_ENV]
        try:
            import torch
            if torch.cuda.is_available():
                return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
        except Exception:  # noqa: BLE001 - no torch, or no driver: no device to name
            pass
        return "gpu"
    if target != "cpu":
        return target
    import platform
    info = isa.cpuinfo()
    generation = (f" (family {info['cpu family']} model {info['model']})"
                  if "cpu family" in info and "model" in info else "")
    model = info.get("model name") or platform.processor() or platform.machine()
    return f"{model}{generation} | {isa.widest_isa()}"


def machine_folder() -> str:
    """This CPU's folder name under ``results/cpu/``: ``<model word>_f<family>m<model>_<ISA>``,
    e.g. ``epyc_f25m1_avx2``, so that results of different machines never share a folder."""
    import re
    info = isa.cpuinfo()
    words = re.findall(r"[A-Za-z]+", info.get("model name", ""))
    skip = {"amd", "intel", "r", "tm", "processor", "cpu", "core"}
    word = next((w.lower() for w in words if w.lower() not in skip), "cpu")
    generation = (f"_f{info['cpu family']}m{info['model']}"
                  if "cpu family" in info and "model" in info else "")
    widest = isa.widest_isa().replace("avx512f", "avx512")
    return f"{word}{generation}_{widest}"


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


def entries(target: str) -> Dict[str, Any]:
    """This machine's entries (``{impl: {layer key: params}}``) in the tuning file."""
    data = load(target)
    if "machines" not in data:
        return data.get("entries", {})
    return _mine(data, target).get("entries", {})


def _mine(data: Mapping[str, Any], target: str) -> Mapping[str, Any]:
    """This machine's section of the tuning file's contents (empty when it has none)."""
    return data.get("machines", {}).get(machine_id(target), {})


def tuned_entry(impl_name: str, layer, target: str) -> Dict[str, int]:
    """The tuned parameters stored for ``impl_name`` on ``layer`` (possibly empty)."""
    mine = entries(target)
    if impl_name not in mine and impl_name not in _WARNED and any(
            impl_name in m.get("entries", {}) for m in load(target).get("machines", {}).values()):
        _WARNED.add(impl_name)
        how = (f"scripts/tune_cpu.py --implementation {impl_name} --store" if target == "cpu"
               else "the GPU campaign's tune tier, scripts/gpu_campaign.py run --tier tune")
        print(f"note: {tuning_file(target)} has no {impl_name} entries for this machine "
              f"({machine_id(target)}), only for others: its defaults are used (tune it here "
              f"with {how})", file=sys.stderr)
    found = dict(mine.get(impl_name, {}).get(layer.key(), {}))
    if found and target == "gpu" and (impl_name, layer.key()) not in _SAID:
        _SAID.add((impl_name, layer.key()))
        print(f"note: {impl_name} on {layer.key()}: tuned parameters of {machine_id(target)} "
              f"from {tuning_file(target)}: {found}", file=sys.stderr)
    return found


def entries_anywhere(impl_name: str, layer, target: str) -> List[Dict[str, int]]:
    """The entries of ``impl_name`` on ``layer`` tuned on any machine (distinct, in the
    file's order of machines, an older single-machine file's too): the incumbents a new
    search times again beside its candidates."""
    data = load(target)
    sections = list(data.get("machines", {}).values()) or [data]
    found: List[Dict[str, int]] = []
    for section in sections:
        entry = section.get("entries", {}).get(impl_name, {}).get(layer.key())
        if entry and dict(entry) not in found:
            found.append(dict(entry))
    return found


def entries_elsewhere(impl_name: str, layer, target: str) -> List[Dict[str, int]]:
    """The entries of ``impl_name`` on ``layer`` tuned on other machines (distinct, in the
    file's order of machines): the candidates of a short retune here."""
    found: List[Dict[str, int]] = []
    here = machine_id(target)
    for name, section in load(target).get("machines", {}).items():
        entry = section.get("entries", {}).get(impl_name, {}).get(layer.key())
        if name != here and entry and dict(entry) not in found:
            found.append(dict(entry))
    return found


def tuned_params(impl, layer, target: str, overrides: Optional[Mapping[str, Any]] = None):
    """Defaults, updated by the tuned entry, updated by ``overrides``: the implementation's
    resolved :class:`~convbench.registry.Params`."""
    values: Dict[str, Any] = {}
    stored = tuned_entry(impl.name, layer, target)
    known = {p.name for p in impl.params}
    values.update({k: v for k, v in stored.items() if k in known})
    values.update(overrides or {})
    return impl.resolve_params(values)


def store(target: str, impl_name: str, layer, params: Mapping[str, int],
          machine: Mapping[str, Any], key: Optional[str] = None) -> Path:
    """Record ``params`` as the tuned entry of ``impl_name`` on ``layer`` (atomically), for
    this machine or the one named ``key``."""
    return _update(target, machine, lambda section: section.setdefault(
        "entries", {}).setdefault(impl_name, {}).__setitem__(_key(layer), dict(params)), key)


def store_best(target: str, pass_name: str, layer, impl_name: str,
               machine: Mapping[str, Any], key: Optional[str] = None) -> Path:
    """Record ``impl_name`` as the fastest implementation of ``pass_name`` on ``layer``."""
    return _update(target, machine, lambda section: section.setdefault(
        "best", {}).setdefault(pass_name, {}).__setitem__(_key(layer), impl_name), key)


def _key(layer) -> str:
    """A layer's key (a layer, or its key already)."""
    return layer if isinstance(layer, str) else layer.key()


def best_implementation(pass_name: str, layer, target: str) -> Optional[str]:
    """The implementation stored as the fastest of ``pass_name`` on ``layer`` here."""
    return _mine(load(target), target).get("best", {}).get(pass_name, {}).get(layer.key())


def _update(target: str, machine: Mapping[str, Any], change, key: Optional[str] = None) -> Path:
    """Apply ``change`` to the section of this machine (or of ``key``) in the tuning file
    (atomically)."""
    from .files import write_atomic
    path = tuning_file(target)
    if path is None:
        raise UsageError("tuning is off ($CONVBENCH_TUNING=off): nowhere to store")
    data = json.loads(path.read_text()) if path.is_file() else {}
    if "entries" in data and "machines" not in data:  # the older form: whose they are is unknown
        data = {"machines": {"unknown (before entries were keyed by machine)": data}}
    section = data.setdefault("machines", {}).setdefault(key or machine_id(target), {})
    change(section)
    section["machine"] = dict(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _CACHE.clear()
    return path


def parse_space(text, impl):
    """``"PIX=12,16;KOUTER=0,1"`` -> list of parameter dicts.  Every value must be valid
    on its own (else a usage error); combinations the implementation refuses together
    (too many accumulators, say) are left out, and at least one must remain."""
    axes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, values = part.partition("=")
        if not sep:
            raise UsageError(f"--space: expected NAME=v1,v2 in {part!r}")
        axis = [(name.strip(), v.strip()) for v in values.split(",") if v.strip()]
        alone = dataclasses.replace(impl, check_params=None)  # each value on its own
        for name_value in axis:
            alone.resolve_params(dict([name_value]), source="--space")
        axes.append(axis)
    configs, refused = [], []
    for combo in itertools.product(*axes):
        try:
            configs.append(impl.resolve_params(dict(combo), source="--space"))
        except UsageError as err:
            refused.append(str(err))
    if not configs:
        raise UsageError(f"--space: no valid combination ({refused[0]})")
    return configs
