"""The code DaCe generates for a build, without compiling it, and its digest: what changes
when a kernel changes and stays when only the Python around it moves.

Every implementation is generated on a named set of layers (:data:`LAYERS`), for each of
its targets and precisions, at its default parameters, and each case's files are hashed
(:func:`digest`).  The committed hashes (``results/codegen/``) make "nothing changed in
what is built" a check (``convbench codegen-hashes --check``).

What the code depends on besides the kernel's text is pinned, so that the digests are
the same on every machine that runs the check:

* **Python's string hashing.**  DaCe 1.0.2 orders some independent statements and
  arguments by set iteration, which follows the hash seed of the process: two processes
  can write them in different orders.  The cases run in a process started with
  ``PYTHONHASHSEED=0`` and in workers forked from it (:func:`run`).
* **The CPU's vector ISA.**  The register-blocked kernels size their tiles by it: the
  digests are per ISA, pinned with ``$CONVBENCH_ISA`` (a cap, so a host generates its own
  widest ISA and every narrower one).
* **The GPU architecture** (``$CONVBENCH_CUDA_ARCH``, 90).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from convkernels.cpu.caches import reference_setting

#: The layers every implementation is generated on: a first layer (1 channel, padding),
#: a deep odd strided one and its stride-1 form (channel blocks and tails), the first
#: MLPerf CosmoFlow layer (4 channels: the tensor cores' packed taps), and CosmoFlow's
#: conv5 at batch 16 (the SASS tables' layer).
LAYERS = (
    ("small", "conv1_small", dict(batch=1, in_channels=1, out_channels=16, in_d=20, in_h=20,
                                   in_w=20, k_d=3, k_h=3, k_w=3, pad=1)),
    ("odd", "deep_s2", dict(batch=2, in_channels=37, out_channels=36, in_d=6, in_h=7, in_w=5,
                            k_d=3, k_h=3, k_w=3, stride=2, pad=2)),
    ("odd", "deep_noncubic", dict(batch=2, in_channels=37, out_channels=36, in_d=5, in_h=7,
                                  in_w=9, k_d=3, k_h=3, k_w=3)),
    ("cosmoflow_mlperf", "conv1", dict(batch=2)),
    ("cosmoflow", "conv5", dict(batch=16)),
)
#: The GPU architecture the digests are for.
CUDA_ARCH = "90"
#: The environment of the processes that generate code (see the module).
#: The hash seed, the GPU architecture and the CPU caches the CPU blockings are derived
#: from (:data:`convkernels.cpu.caches.REFERENCE`), so that a digest does not depend on the
#: machine that generates it.
PINNED_ENV = {"PYTHONHASHSEED": "0", "CONVBENCH_CUDA_ARCH": CUDA_ARCH,
              "CONVBENCH_CACHES": reference_setting()}


def layers() -> List[Tuple[str, object]]:
    """``(set name, layer)`` of :data:`LAYERS`."""
    from convbench.layersets.layer import Layer
    from convbench.layersets.sets import load_layers
    out = []
    for set_name, name, fields in LAYERS:
        if set_name in ("small", "odd"):
            out.append((set_name, Layer(name, **fields)))
        else:
            layer = next(la for la in load_layers(set_name) if la.name == name)
            out.append((set_name, layer.with_batch(fields["batch"])))
    return out


def case_key(impl: str, target: str, precision: str, set_name: str, layer) -> str:
    return f"{impl}|{target}|{precision}|{set_name}:{layer.name}:b{layer.batch}"


def cases(names: Optional[Sequence[str]] = None, targets: Sequence[str] = ("cpu", "gpu"),
          first_precision: bool = False, layer_names: Optional[Sequence[str]] = None):
    """Every ``(impl, target, precision, set name, layer)`` of the named implementations
    (default: all), their targets among ``targets`` and their precisions (only the first
    with ``first_precision``), on :data:`LAYERS` (or those of ``layer_names``)."""
    from convbench import registry
    impls = registry.all_implementations()
    unknown = sorted(set(names or ()) - set(impls))
    if unknown:
        from convbench.base.errors import UsageError
        raise UsageError(f"unknown implementation(s): {', '.join(unknown)}")
    chosen = [(s, la) for s, la in layers() if not layer_names or la.name in layer_names]
    out = []
    for name in sorted(names or impls):
        impl = impls[name]
        for target in impl.targets:
            if target not in targets:
                continue
            for precision in impl.precisions[:1] if first_precision else impl.precisions:
                out += [(name, target, precision, s, la) for s, la in chosen]
    return out


def generate(impl_name: str, target: str, precision: str, layer) -> Dict[str, str]:
    """The files DaCe generates for ``impl_name`` on ``layer`` (default parameters), by
    name (``<target>/<file>``), without compiling them."""
    from convbench import registry
    from convbench.build import toolchain
    impl = registry.get(impl_name)
    spec = toolchain.make_spec(impl, layer, precision, target=target)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DaCe's (a build keeps them in its log)
        with toolchain.dace_config(target, Path(tmp), spec.dtype, spec.arch):
            sdfg = toolchain.make_sdfg(spec)
            sdfg.build_folder = str(Path(tmp) / "build")
            codes = sdfg.generate_code()
    return {f"{c.target.target_name}/{c.name}.{c.language}": c.clean_code for c in codes}


def digest(files: Mapping[str, str]) -> str:
    """SHA-256 over the files' names and texts, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()


def one(case, dump: Optional[str] = None) -> Tuple[str, Dict[str, object]]:
    """``(key, outcome)`` of one case: ``{"files": n, "sha256": ...}``, ``{"refused":
    why}`` where the implementation does not handle the layer, or ``{"error": ...}``."""
    impl_name, target, precision, set_name, layer = case
    from convbench import registry
    impl = registry.get(impl_name)
    key = case_key(impl_name, target, precision, set_name, layer)
    reason = impl.unsupported_reason(layer, impl.resolve_params(None))
    if reason:
        return key, {"refused": reason}
    try:
        files = generate(impl_name, target, precision, layer)
    except Exception as err:  # noqa: BLE001 - a case DaCe cannot generate is an outcome
        return key, {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
    if dump:
        folder = Path(dump) / key.replace("|", "__").replace(":", "_")
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    return key, {"files": len(files), "sha256": digest(files)}


def pinned(isa: str) -> Dict[str, str]:
    """The environment a process generating digests for the CPU ISA ``isa`` must start
    with: :data:`PINNED_ENV` and ``$CONVBENCH_ISA``, read when the harness is imported (the
    CPU kernels' default tiles follow the ISA)."""
    return dict(PINNED_ENV, CONVBENCH_ISA=isa)


def is_pinned(isa: str) -> bool:
    """Whether this process started with :func:`pinned`'s environment."""
    return all(os.environ.get(k) == v for k, v in pinned(isa).items())


def run(todo: Sequence[tuple], isa: str, jobs: int, dump: Optional[str] = None,
        say: Callable[[str], None] = print) -> Dict[str, Dict[str, object]]:
    """The outcome of every case of ``todo``, in the order of ``todo``, in ``jobs`` worker
    processes forked from this one, which must have started with :func:`pinned`'s
    environment for ``isa`` (the workers inherit its hash seed)."""
    if not is_pinned(isa):
        raise RuntimeError(f"generating digests needs a process started with {pinned(isa)}")
    context = multiprocessing.get_context("fork")
    results: Dict[str, Dict[str, object]] = {}
    with cf.ProcessPoolExecutor(max(1, jobs), mp_context=context) as pool:
        futures = [pool.submit(one, case, dump) for case in todo]
        for n, future in enumerate(futures, 1):
            key, outcome = future.result()
            results[key] = outcome
            if n % 25 == 0 or n == len(futures):
                say(f"  {isa}: {n}/{len(futures)} cases generated")
    return results


def hashes_file(folder: Path, isa: str) -> Path:
    """The committed digests for the CPU ISA ``isa`` in ``folder``."""
    return Path(folder) / f"hashes_{isa}.json"


def write(path: Path, results: Mapping[str, Mapping[str, object]], isa: str) -> None:
    import dace
    from convbench.base.files import write_atomic
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = {"isa": isa, "cuda_arch": CUDA_ARCH, "dace": dace.__version__,
            "layers": [f"{s}:{n}:b{f.get('batch', '')}" for s, n, f in LAYERS],
            "cases": dict(sorted(results.items()))}
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def compare(expected: Mapping[str, Mapping[str, object]],
            got: Mapping[str, Mapping[str, object]]) -> List[str]:
    """One line per case whose outcome differs (or that one side lacks), of the cases
    ``got`` holds."""
    lines = []
    for key in got:
        if key not in expected:
            lines.append(f"{key}: not in the committed hashes")
        elif expected[key] != got[key]:
            lines.append(f"{key}: {_short(expected[key])} -> {_short(got[key])}")
    return lines


def _short(outcome: Mapping[str, object]) -> str:
    if "sha256" in outcome:
        return f"{outcome['files']} files {str(outcome['sha256'])[:12]}"
    return "; ".join(f"{k}: {v}" for k, v in outcome.items())[:120]
