"""Which implementation runs a pass on a layer where the user named none: the fastest
measured on this machine, else the highest-ranked rule, else the defaults by role (the
network's convolutions, and the float32 forward that ``convbench int8`` compares with)."""

from __future__ import annotations

from typing import Tuple

from convbench import registry
from convbench.build import tuned
from convbench.layersets.layer import Layer
from convbench.timing import devices
from convkernels.layouts import Pass


#: The implementations that handle every layer of the model (groups, dilation, strides,
#: asymmetric padding: docs/layers.md), the last resort of :func:`default_implementation`.
GENERAL = {Pass.FWD: "implicitGemm", Pass.BWD_DATA: "implicitGemmBwdData",
           Pass.BWD_FILTER: "implicitGemmBwdFilter"}


def default_implementation(layer: Layer, pass_: Pass, device: str, dtype=None) -> str:
    """The implementation :func:`default_choice` picks."""
    return default_choice(layer, pass_, device, dtype)[0]


def default_choice(layer: Layer, pass_: Pass, device: str, dtype=None) -> Tuple[str, str]:
    """``(implementation, how it was chosen)`` for ``pass_`` on ``layer`` where the user
    named none.  On the CPU: the fastest as measured on this machine in float32
    (``bench_cpu.py --store`` or ``--autotune``, :func:`convbench.build.tuned.best_implementation`;
    not in another precision, whose winner it does not say), else
    the highest-ranked implementation whose rule applies
    (:func:`convbench.registry.by_rule`, "rule <name>").  Then (and on the GPU) the one that
    declares ``network-cpu`` (CPU), ``network-hopper`` (a Hopper GPU, 16 bits or TF32: the
    wgmma kernels, refused elsewhere), ``network-tensor-cores`` (GPU, 16 bits or TF32),
    ``network``, ``cli``, else the general one (:data:`GENERAL`): the first that supports
    ``layer``.  Only implementations that build in the precision count: ``dtype`` (a
    :class:`~convbench.build.precision.DType`), float32 where it is None."""
    def usable(impl) -> bool:
        return (impl.pass_ == pass_ and device in impl.targets
                and (not impl.unsupported_dtype(dtype, device) if dtype is not None
                     else "float32" in impl.precisions)
                and not devices.arch_problem(impl.cuda_arch, device)
                and not impl.unsupported_reason(layer, tuned.tuned_params(impl, layer, device)))

    impls = registry.all_implementations()
    if device == "cpu":
        # the stored winners were timed in float32 (bench_cpu.py --store, the autotune)
        measured = (impls.get(tuned.best_implementation(str(pass_), layer, "cpu") or "")
                    if dtype is None or dtype.label == "float32" else None)
        if measured is not None and usable(measured):
            return measured.name, "measured here"
        ruled = registry.by_rule(pass_, layer, "cpu", usable)
        if ruled is not None:
            return ruled[0].name, f"rule {ruled[1].name}"
    tensor = device == "gpu" and dtype is not None and dtype.label != "float32"
    roles = (["network-cpu"] if device == "cpu" else []) + (
        ["network-hopper", "network-tensor-cores"] if tensor else []) + ["network", "cli"]
    candidates = [(registry.default(role, pass_), f"{role} default") for role in roles
                  if registry.members(role, pass_)] + [(GENERAL[Pass(pass_)], "general")]
    for name, why in candidates:
        if name in impls and usable(impls[name]):
            return name, why
    return registry.default("network", pass_), "network default"  # refused with its reason
