"""Tuned parameters: the best tile sizes per implementation, layer and target, in a file.

``tuning/<target>.json`` (committed; ``cpu.json`` written by ``scripts/tune_cpu.py``,
``gpu.json`` by the GPU campaign's tune tier through ``gpu_campaign.py unpack``) holds,
per machine (:func:`machine_id`: the CPU model and its widest vector ISA, or the GPU's
name and CUDA version)::

    {"machines": {"<machine id>": {"machine": {...}, "entries": {
        "<implementation>": {"<layer key>": {"PIX": 16, ...}}},
        "best": {"<pass>": {"<layer key>": "<implementation>"}}}}}

where the layer key is :meth:`convbench.layersets.layer.Layer.key` (geometry and batch).  The
entry of this machine applies; where it has none for a layer, that of the nearest
machine of the same ISA (GPU: of the same architecture, :func:`nearest_machine`), and a
line on standard error names it (once per implementation); with neither, the
implementation's defaults, and a line says so: never another machine's parameters in
silence.  A file of the older form ``{"entries": ...}`` (no machines) applies to any
machine.  The parameters of a build are, in increasing precedence: the implementation's
defaults, the tuned (or borrowed) entry for the layer, and the user's ``--param`` values.
``$CONVBENCH_TUNING`` names another file, or ``off`` to ignore tuning.

``best`` (written by ``scripts/bench_cpu.py --store`` and the quick autotune,
:mod:`convbench.tuning.autotune`) names the fastest implementation of a pass per layer, as
measured on this machine with the tuned parameters; the end-to-end network takes it by
default (:func:`best_implementation`; this machine's only, never a neighbour's).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from convkernels.cpu import isa
from convbench.base.errors import UsageError

TUNING_DIR = Path(__file__).resolve().parents[2] / "tuning"
_CACHE: Dict[str, Dict[str, Any]] = {}
_WARNED: set = set()
_SAID: set = set()


#: Names the GPU whose entries a build for the GPU takes, where none is visible (GPU code
#: is compiled on hosts without one): ``NVIDIA H200 (CUDA 13.0)``, as the campaign writes it.
GPU_ENV = "CONVBENCH_GPU"
#: Sets the CPU's machine key (:func:`machine_id`), e.g. to see what a machine with no
#: entries of its own gets: ``CONVBENCH_MACHINE="unseen | avx512f"``.  The host's entries
#: under its real key are then hidden, not taken as the nearest machine's.
MACHINE_ENV = "CONVBENCH_MACHINE"


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
    return os.environ.get(MACHINE_ENV, "").strip() or _cpu_key()


def _cpu_key() -> str:
    """This host's own CPU key (:func:`machine_id` without ``$CONVBENCH_MACHINE``)."""
    import platform
    info = isa.cpuinfo()
    generation = (f" (family {info['cpu family']} model {info['model']})"
                  if "cpu family" in info and "model" in info else "")
    model = info.get("model name") or platform.processor() or platform.machine()
    return f"{model}{generation} | {isa.widest_isa()}"


def _hidden(target: str) -> set:
    """The machines whose entries never count as another machine's: this one and, where
    ``$CONVBENCH_MACHINE`` sets the key by hand, the host's own."""
    hidden = {machine_id(target)}
    if target == "cpu" and os.environ.get(MACHINE_ENV, "").strip():
        hidden.add(_cpu_key())
    return hidden


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
    """The tuned parameters of ``impl_name`` on ``layer``: this machine's entry, else that
    of the nearest machine with the same ISA (:func:`nearest_machine`; a note on standard
    error says which, once per implementation), else none (empty: the defaults)."""
    found = dict(entries(target).get(impl_name, {}).get(layer.key(), {}))
    source = machine_id(target)
    kind = "architecture" if target == "gpu" else "ISA"
    if not found:
        near, entry = next(((name, e) for name in nearest_machines(target)
                            for e in [_section(name, target).get("entries", {}).get(
                                impl_name, {}).get(layer.key())] if e), (None, None))
        if entry:
            found, source = dict(entry), near
            if (impl_name, near) not in _SAID:
                _SAID.add((impl_name, near))
                print(f"note: {impl_name}: no entries for this machine ({machine_id(target)}) "
                      f"in {tuning_file(target)}; parameters tuned on the nearest machine "
                      f"with the same {kind} that has them, {near}", file=sys.stderr)
    if (not found and impl_name not in entries(target) and impl_name not in _WARNED
            and any(impl_name in m.get("entries", {})
                    for m in load(target).get("machines", {}).values())):
        _WARNED.add(impl_name)
        how = (f"scripts/tune_cpu.py --implementation {impl_name} --store" if target == "cpu"
               else "the GPU campaign's tune tier, scripts/gpu_campaign.py run --tier tune")
        print(f"note: {tuning_file(target)} has no {impl_name} entries for this machine "
              f"({machine_id(target)}), and none of its {kind} has one for some of the "
              f"layers: their defaults are used (tune it here with {how})",
              file=sys.stderr)
    if found and target == "gpu" and (impl_name, layer.key()) not in _SAID:
        _SAID.add((impl_name, layer.key()))
        print(f"note: {impl_name} on {layer.key()}: tuned parameters of {source} "
              f"from {tuning_file(target)}: {found}", file=sys.stderr)
    return found


def _section(name: Optional[str], target: str) -> Mapping[str, Any]:
    """The tuning file's section of the machine ``name`` (empty for None or none)."""
    return load(target).get("machines", {}).get(name, {}) if name else {}


_CPU_ID = re.compile(r"^(?P<model>.*?)(?: \(family (?P<family>\d+) model (?P<number>\d+)\))?"
                     r" \| (?P<isa>\S+)$")
#: GPU model names and their architecture (compute capability): the GPUs whose tuned
#: entries another of the same architecture falls back on.
GPU_ARCHITECTURES = {"H100": "sm_90", "H200": "sm_90", "GH200": "sm_90", "H800": "sm_90",
                     "H20": "sm_90", "A100": "sm_80", "A800": "sm_80", "A30": "sm_80",
                     "A10": "sm_86", "A40": "sm_86", "L4": "sm_89", "L40": "sm_89",
                     "L40S": "sm_89", "B200": "sm_100", "B100": "sm_100", "V100": "sm_70",
                     "T4": "sm_75"}


def gpu_architecture(name: str) -> Optional[str]:
    """The architecture of the GPU a machine key names (None: not one we know)."""
    return next((GPU_ARCHITECTURES[w] for w in re.findall(r"[A-Za-z0-9]+", name)
                 if w in GPU_ARCHITECTURES), None)


def nearest_machine(target: str) -> Optional[str]:
    """The first of :func:`nearest_machines` (None if none qualifies)."""
    return next(iter(nearest_machines(target)), None)


def nearest_machines(target: str) -> List[str]:
    """The other machines in the tuning file that may lend this one their entries, nearest
    first (an entry is taken from the first that has it).  CPU: the same widest ISA
    (:func:`machine_id`'s last part), ordered by the same vendor, the same family and the
    nearest model number, then the file's order.  GPU: the same architecture
    (:data:`GPU_ARCHITECTURES`), the same CUDA version first."""
    here = machine_id(target)
    hidden = _hidden(target)
    names = [n for n in load(target).get("machines", {}) if n not in hidden]
    if target == "gpu":
        arch = gpu_architecture(here)
        cuda = re.search(r"\(CUDA [^)]*\)", here)
        same = [n for n in names if arch and gpu_architecture(n) == arch]
        same.sort(key=lambda n: not (cuda and cuda.group(0) in n))
        return same
    me = _CPU_ID.match(here)
    if not me:
        return []
    def distance(other):
        vendor = re.findall(r"[A-Za-z]+", other["model"])[:1] != \
            re.findall(r"[A-Za-z]+", me["model"])[:1]
        family = other["family"] != me["family"]
        model = (abs(int(other["number"]) - int(me["number"]))
                 if not family and other["number"] and me["number"] else 0)
        return (vendor, family, model)
    parsed = [(n, _CPU_ID.match(n)) for n in names]
    same = [(n, m) for n, m in parsed if m and m["isa"] == me["isa"]]
    return [n for n, m in sorted(same, key=lambda nm: distance(nm[1]))]  # stable sort


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
    hidden = _hidden(target)
    for name, section in load(target).get("machines", {}).items():
        entry = section.get("entries", {}).get(impl_name, {}).get(layer.key())
        if name not in hidden and entry and dict(entry) not in found:
            found.append(dict(entry))
    return found


def params_elsewhere(impl, layer, target: str) -> list:
    """:func:`entries_elsewhere` of ``impl`` on ``layer`` resolved to its parameters, less
    those it no longer takes (a parameter renamed or a value refused)."""
    known = {p.name for p in impl.params}
    found = []
    for entry in entries_elsewhere(impl.name, layer, target):
        try:
            params = impl.resolve_params({k: v for k, v in entry.items() if k in known})
        except UsageError:
            continue
        if params not in found:
            found.append(params)
    return found


def within_registers(impl, layer, configs):
    """``(kept, left out)``: the configurations whose micro-tile keeps its accumulators in
    this CPU's vector registers (:func:`convkernels.cpu.isa.accumulator_budget`), and how many
    would spill.  If all would, the one with the fewest registers is kept."""
    if impl.registers is None or not configs:
        return configs, 0
    budget = isa.accumulator_budget()
    kept = [p for p in configs if impl.registers(layer, p) <= budget]
    if not kept:
        kept = [min(configs, key=lambda p: impl.registers(layer, p))]
    return kept, len(configs) - len(kept)


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
    from convbench.base.files import write_atomic
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
