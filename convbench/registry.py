"""The implementation registry.

docs/adding-an-implementation.md describes what an implementation is (an algorithm plus one
schedule per target, from the kernel library ``convkernels``) and how a module in ``impls/``
registers it on import.  The harness looks implementations up by the name users type.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from convbench.base.errors import UsageError
# Re-exported for the registrations (impls/), which import the registry and the kernel
# library only, never the rest of the harness (checked by import-linter, see setup.cfg):
# the layer model's features, and the layouts and passes they register with.
from convbench.layersets.layer import FEATURES, Layer  # noqa: F401
from convkernels.layouts import Layout, Pass, stored_shape  # noqa: F401
# What a kernel declares (its targets, precisions, parameters and rules) is the kernel
# library's; re-exported for the implementations and the harness.
from convkernels.declarations import ALL_PRECISIONS, TARGETS, Param, Rule  # noqa: F401

#: The roles an implementation can be the default for (``Implementation.default_for``),
#: each within its own pass.  One implementation per pass holds each of the first three;
#: ``best-of`` has several members.
ROLES = {
    "cli": "what profile_conv3d.py runs for its pass when no --implementation is given",
    "network": "the network's convolution for its pass on the GPU, and on the CPU where "
               "no CPU kernel applies",
    "network-cpu": "the network's CPU kernel for its pass, where it supports the layer "
                   "and no measured winner is stored",
    "best-of": "run by the GPU campaign's core tier on every layer",
    "network-tensor-cores": "the network's convolution for its pass on the GPU in 16 bits "
                            "or TF32, ahead of the network default",
    "network-hopper": "the network's convolution for its pass on a Hopper GPU (sm_90a) in "
                      "16 bits or TF32, ahead of network-tensor-cores (which other GPUs use)",
}


def validate(param: Param, value: Any, source: str = "--param") -> int:
    """``value`` (an int, or its text) as a value of ``param``; a :class:`UsageError` naming
    ``source`` if it is not an integer, below the minimum, or refused by the check."""
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise UsageError(f"{source}: {param.name} must be an integer, got {value!r}") from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{source}: {param.name} must be an integer, got {value!r}")
    if value < param.minimum:
        raise UsageError(f"{source}: {param.name} must be >= {param.minimum}, got {value}")
    if param.check is not None:
        message = param.check(value)
        if message:
            raise UsageError(f"{source}: {param.name}={value}: {message}")
    return value


class Params(dict):
    """An implementation's parameter values, resolved and checked once
    (:meth:`Implementation.resolve_params`) and passed on from there unchanged: a read-only
    dict (JSON and ``dict(...)`` take it as one) that knows whose parameters it holds, so
    that resolving it again for the same implementation returns it as it is."""

    __slots__ = ("implementation",)

    def __init__(self, implementation: str, values: Mapping[str, int]):
        super().__init__(values)
        self.implementation = implementation

    def _frozen(self, *args, **kwargs):
        raise TypeError(f"the parameters of {self.implementation} are resolved: make new ones "
                        "with resolve_params (or dict(params, NAME=value))")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _frozen

    def __hash__(self):
        return hash((self.implementation, tuple(sorted(self.items()))))

    def __reduce__(self):  # pickled (build workers) as a new instance, not item by item
        return Params, (self.implementation, dict(self))

    def __repr__(self):
        return f"Params({self.implementation}: {dict.__repr__(self)})"


Schedule = Callable[..., None]  # (sdfg, layer, params) -> None, transforms in place


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    summary: str
    layout: Layout
    pass_: Pass
    #: ``algorithm(layer, dtype, params) -> dace program or SDFG`` for one layer, with every
    #: size a Python integer (a compile-time constant).  DaCe 1.0.2's frontend miscompiles
    #: strided accesses such as ``x[od * S + kd]`` inside maps when sizes are symbolic.
    algorithm: Callable[..., Any]
    #: target name -> ``schedule(sdfg, layer, params)``.
    schedules: Mapping[str, Schedule]
    params: Tuple[Param, ...] = ()
    #: ``supports(layer, params) -> None`` if supported, else the reason why not.
    supports: Optional[Callable[..., Optional[str]]] = None
    #: The supported layers in words, for ``--list`` (required with ``supports``).
    constraints: str = ""
    #: ``check_params(values) -> None or a message`` for combinations of parameters that
    #: are invalid together (a tile that does not divide another, too many threads).
    check_params: Optional[Callable[[Mapping[str, int]], Optional[str]]] = None
    #: True if the implementation handles a different padding per dimension
    #: (``Layer.pads``); others refuse such layers.  (Short for "anisotropic padding" in
    #: ``handles``.)
    anisotropic_pad: bool = False
    #: What the implementation handles beyond the basic model (names from
    #: ``convbench.layersets.layer.FEATURES``: "anisotropic padding", "anisotropic stride", "dilation",
    #: "groups", "asymmetric padding"); layers that need anything else are refused with the
    #: reason.
    handles: Tuple[str, ...] = ()
    #: ``registers(layer, params) -> int``: the vector registers one micro-tile's
    #: accumulators take on this CPU (register-blocked CPU kernels).  The tuner leaves out
    #: configurations over :func:`convkernels.cpu.isa.accumulator_budget`, which would spill.
    registers: Optional[Callable[..., int]] = None
    #: The roles (:data:`ROLES`) this implementation is the default for, in its own pass.
    default_for: Tuple[str, ...] = ()
    #: The values ``convbench tune`` tries by default, as ``"P=a,b;Q=c"`` (empty: not tuned).
    search_space: str = ""
    #: Where it should win without a measurement (:class:`Rule`, one per target at most).
    wins: Tuple[Rule, ...] = ()
    #: ``error_bound(layer, inputs, tol_factor, random_inputs) -> tensor``: a per-element
    #: bound on the error of an algorithm that does not sum the convolution's products
    #: directly (Winograd), which its check uses instead of the direct sums' tolerance
    #: (inputs in logical layout).  A bound may model its long sums as
    #: :mod:`convbench.check.verify` does, with that module's safety factor ``tol_factor`` and,
    #: where ``random_inputs`` (drawn by the harness, independent and symmetric about zero),
    #: its l2 form.
    error_bound: Optional[Callable[..., Any]] = None
    #: The precisions it builds for, by label (:mod:`convbench.build.precision`): a storage type
    #: (a 16-bit one means it widens each operand to float32 before multiplying and sums
    #: in float32), or one with its math mode, such as ``float32-tf32``.
    precisions: Tuple[str, ...] = ("float32",)
    #: The CUDA architecture its GPU builds need (``"90a"``: sm_90a, for ``wgmma``); empty:
    #: the toolchain's (:data:`convbench.build.toolchain.CUDA_ARCH`).  Other GPUs refuse it.
    cuda_arch: str = ""
    #: The file of the module that registered this implementation (set by :func:`register`).
    module_file: str = dataclasses.field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "layout", Layout(self.layout))
        object.__setattr__(self, "pass_", Pass(self.pass_))
        unknown = set(self.schedules) - set(TARGETS)
        if unknown:
            raise ValueError(f"{self.name}: unknown targets {sorted(unknown)}; known: {TARGETS}")
        if self.supports is not None and not self.constraints.strip():
            raise ValueError(f"{self.name}: describe the layers `supports` accepts in `constraints`")
        unknown = set(self.handles) - set(FEATURES)
        if unknown:
            raise ValueError(f"{self.name}: unknown features {sorted(unknown)}; known: {FEATURES}")
        if self.anisotropic_pad and "anisotropic padding" not in self.handles:
            object.__setattr__(self, "handles", tuple(self.handles) + ("anisotropic padding",))
        unknown = set(self.default_for) - set(ROLES)
        if unknown:
            raise ValueError(f"{self.name}: unknown default roles {sorted(unknown)}; known: "
                             f"{', '.join(ROLES)}")
        targets = [rule.target for rule in self.wins]
        if len(set(targets)) != len(targets) or not set(targets) <= set(self.schedules):
            raise ValueError(f"{self.name}: at most one rule per target it has a schedule for "
                             f"(rules for {targets}, schedules for {sorted(self.schedules)})")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicated parameter names {names}")

    @property
    def targets(self) -> Tuple[str, ...]:
        return tuple(t for t in TARGETS if t in self.schedules)

    def resolve_params(self, overrides: Optional[Mapping[str, Any]] = None,
                       source: str = "--param") -> Params:
        """Defaults updated by ``overrides``; unknown names and bad values raise UsageError.
        ``overrides`` already resolved for this implementation come back as they are."""
        if isinstance(overrides, Params) and overrides.implementation == self.name:
            return overrides
        known = {p.name: p for p in self.params}
        values = {p.name: p.default for p in self.params}
        for key, value in (overrides or {}).items():
            if key not in known:
                names = ", ".join(known) or "none"
                raise UsageError(f"{source}: {self.name} has no parameter '{key}' "
                                 f"(its parameters: {names})")
            values[key] = validate(known[key], value, source)
        if self.check_params is not None:
            message = self.check_params(values)
            if message:
                shown = ", ".join(f"{k}={v}" for k, v in values.items())
                raise UsageError(f"{source}: {self.name} ({shown}): {message}")
        return Params(self.name, values)

    def unsupported_reason(self, layer, params: Mapping[str, int]) -> Optional[str]:
        """None if this implementation handles ``layer`` with ``params``, else why not."""
        for feature in getattr(layer, "features", tuple)():
            if feature not in self.handles:
                return f"does not handle {feature} (this layer: {layer.feature_text(feature)})"
        if self.supports is None:
            return None
        return self.supports(layer, params)

    def rule(self, target: str) -> Optional[Rule]:
        """Its rule on ``target`` (None: it declares none there)."""
        return next((rule for rule in self.wins if rule.target == target), None)

    def unsupported_dtype(self, dtype, target: str = "cpu") -> Optional[str]:
        """None if this implementation builds for the precision ``dtype`` (a
        :class:`~convbench.build.precision.DType`), else why not."""
        if dtype.label in self.precisions:
            return None
        what = (f"{dtype.math} math in {dtype.name}" if dtype.name in self.precisions
                else f"{dtype.label} version")
        return f"has no {what} (its precisions: {', '.join(self.precisions)})"

    def source_files(self) -> Sequence[str]:
        """Files whose text defines this implementation (for cache keys): the registering
        module, the modules of its algorithm and schedules, and every file of the kernel
        library (:mod:`convkernels`), since its modules import each other and its C++
        headers go into the generated code or onto the compiler's command line."""
        import convkernels
        files = {self.module_file, inspect.getsourcefile(self.algorithm)}
        files.update(inspect.getsourcefile(s) for s in self.schedules.values())
        files.discard(None)
        files.discard("")
        library = Path(convkernels.__file__).resolve().parent
        files.update(str(p) for p in library.rglob("*") if p.suffix in (".py", ".h"))
        return sorted(os.path.abspath(f) for f in files)


_REGISTRY: Dict[str, Implementation] = {}
_LOADED = False


def register(impl: Implementation) -> Implementation:
    """Add an implementation under its name.  Names are unique."""
    if not impl.module_file:
        caller = sys._getframe(1).f_globals.get("__file__")
        if caller:
            object.__setattr__(impl, "module_file", os.path.abspath(caller))
    existing = _REGISTRY.get(impl.name)
    if existing is not None and existing is not impl:
        raise ValueError(f"implementation '{impl.name}' is registered twice")
    _REGISTRY[impl.name] = impl
    return impl


def load_implementations(package: str = "impls") -> None:
    """Import every module of the ``impls`` package so that each registers itself."""
    global _LOADED
    if _LOADED:
        return
    pkg = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")
    _LOADED = True


def all_implementations() -> Dict[str, Implementation]:
    load_implementations()
    return dict(_REGISTRY)


def get(name: str) -> Implementation:
    impls = all_implementations()
    if name not in impls:
        raise UsageError(f"--implementation: unknown implementation '{name}' (known: "
                         f"{', '.join(impls)})")
    return impls[name]


def members(role: str, pass_=None) -> Tuple[str, ...]:
    """The names of the implementations that declare ``role`` (of ``pass_``, if given)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    return tuple(name for name, impl in sorted(all_implementations().items())
                 if role in impl.default_for and (pass_ is None or impl.pass_ == Pass(pass_)))


def default(role: str, pass_) -> str:
    """The one implementation that is the ``role`` default of ``pass_``."""
    names = members(role, pass_)
    if len(names) != 1:
        raise LookupError(f"{len(names)} implementations declare default_for {role!r} in "
                          f"pass {Pass(pass_)}: {', '.join(names) or 'none'}")
    return names[0]


def defaults(role: str) -> Dict[Pass, str]:
    """``role``'s default of every pass."""
    return {pass_: default(role, pass_) for pass_ in Pass}


def by_rule(pass_, layer, target: str,
            usable: Callable[[Implementation], bool] = lambda impl: True):
    """``(implementation, rule)``: of the implementations of ``pass_`` whose rule on
    ``target`` applies to ``layer`` and that are ``usable`` (support the layer, build in
    the precision), the one of highest rank, the first registered on a tie; None if
    none."""
    found = None
    for impl in all_implementations().values():
        rule = impl.rule(target)
        if (rule is not None and impl.pass_ == Pass(pass_)
                and (found is None or rule.rank > found[1].rank)
                and rule.applies(layer) and usable(impl)):
            found = (impl, rule)
    return found


def parse_param_overrides(items: Sequence[str]) -> Dict[str, str]:
    """``["CTAtileM=64", ...]`` -> ``{"CTAtileM": "64"}`` (values validated later)."""
    out: Dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"--param: expected NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def format_listing(impls: Mapping[str, Implementation]) -> str:
    """The text printed by ``--list``."""
    lines = []
    for impl in impls.values():
        lines.append(f"{impl.name}")
        lines.append(f"    {impl.summary}")
        lines.append(f"    pass: {impl.pass_}   layout: {impl.layout}   targets: "
                     f"{', '.join(impl.targets)}")
        if impl.default_for:
            lines.append(f"    default for: {', '.join(impl.default_for)}")
        for rule in impl.wins:
            lines.append(f"    rule ({rule.target}, rank {rule.rank}): {rule.name}: {rule.text}")
        if impl.search_space:
            lines.append(f"    search space: {impl.search_space}")
        if impl.params:
            params = ", ".join(f"{p.name}={p.default}" for p in impl.params)
            lines.append(f"    params: {params}")
            for p in impl.params:
                if p.help:
                    lines.append(f"      {p.name}: {p.help}")
        else:
            lines.append("    params: none")
        lines.append(f"    supports: {impl.constraints.strip() or 'every layer'}")
        lines.append(f"    handles: {', '.join(impl.handles) or 'the basic model only'} "
                     f"(of: {', '.join(FEATURES)})")
        lines.append(f"    precisions: {', '.join(impl.precisions)}")
    return "\n".join(lines)


def format_markdown(impls: Mapping[str, Implementation]) -> str:
    """``--list --markdown``: one table row per implementation, machine-independent (the
    defaults of the CPU kernels' parameters follow the CPU's vector width; ``--list``
    prints them)."""
    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")
    rows = ["| implementation | pass | layout | targets | default for | what | parameters | "
            "supports | handles | precisions |", "|---|---|---|---|---|---|---|---|---|---|"]
    for impl in sorted(impls.values(), key=lambda i: (list(Pass).index(i.pass_), i.name)):
        rows.append("| " + " | ".join([
            f"`{impl.name}`", str(impl.pass_), str(impl.layout), ", ".join(impl.targets),
            ", ".join([*impl.default_for, *(f"rule {r.name} ({r.target})" for r in impl.wins)]),
            cell(impl.summary),
            ", ".join(f"`{p.name}`" for p in impl.params) or "none",
            cell(impl.constraints) or "every layer",
            ", ".join(impl.handles) or "the basic model",
            ", ".join(impl.precisions)])
            + " |")
    roles = [f"- `{role}`: {text}." for role, text in ROLES.items()]
    return "\n".join(rows + ["", "Roles (column *default for*):", ""] + roles) + "\n"
