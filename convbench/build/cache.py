"""The build cache: compiled SDFGs stored per build, reloaded without parsing,
transforming or compiling.

docs/build-cache.md describes the key, the stale and
corrupt checks, the locks and why a cache folder can move between hosts.  An entry::

    <root>/<build name>/            DaCe's build folder of one BuildSpec
        program.sdfg                the scheduled SDFG (DaCe writes it when compiling)
        program.<sha16>.pickle      the same SDFG, pickled at its first load (see _read_sdfg)
        build/lib<name>.so          the compiled program
        build/libdacestub_<name>.so DaCe's loader stub (not used; absent where the build was
                                    replayed, see convbench/build/replay.py)
        manifest.json               written last: the full key and the files' checksums
    <root>/.locks/<build name>.lock

A builder removes the manifest before touching the entry and writes the new one
atomically at the end, so a reader never trusts a half-built entry.
"""

import concurrent.futures as cf
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Tuple

from convbench.build import toolchain
from convbench.base.files import write_atomic
from convbench.layersets.layer import Layer

#: Bumped when the manifest's meaning changes: older entries become stale.
CACHE_FORMAT = 1
MANIFEST = "manifest.json"
POLICIES = ("rebuild", "reuse", "require")


class CacheMiss(RuntimeError):
    """``require`` policy: no valid stored build."""


@dataclasses.dataclass
class Lookup:
    """What the cache holds for one spec."""

    #: ``valid``, ``missing``, ``stale`` or ``corrupt``.
    status: str
    reason: str
    manifest: Optional[Dict[str, Any]] = None

    @property
    def valid(self) -> bool:
        return self.status == "valid"


def source_hash(impl) -> str:
    """SHA-256 over the implementation's source files (with the whole kernel library) and the
    harness's own code that shapes the SDFG (the toolchain's schedules and settings, the
    layer model's sizes)."""
    from convbench.layersets import layer
    files = list(impl.source_files())
    files += [str(Path(toolchain.__file__).resolve()), str(Path(layer.__file__).resolve())]
    digest = hashlib.sha256()
    # Each file by its name and text, in that order, so that the hash depends on neither
    # where the checkout is nor which folder a file of a given name and text sits in.
    for name, text in sorted({(Path(f).name, Path(f).read_bytes()) for f in set(files)}):
        digest.update(name.encode() + b"\0")
        digest.update(text + b"\0")
    return digest.hexdigest()


def cache_key(spec: "toolchain.BuildSpec") -> Dict[str, Any]:
    """The full key of a build: the spec plus source, DaCe and toolchain."""
    key = {"format": CACHE_FORMAT, **spec.key(), "name": spec.name,
           "source_sha256": source_hash(spec.impl),
           "toolchain": toolchain.toolchain_flags(spec.target, spec.arch)}
    if spec.target == "cpu":  # the CPU blockings follow the caches they were made for
        from convkernels.cpu.caches import caches
        c = caches()
        key["caches"] = {"l1d": c.l1d, "l2": c.l2, "l3": c.l3}
    return key


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _differences(old: Any, new: Any, prefix: str = "") -> list:
    """Dotted names of the entries that differ between two keys."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]


class BuildCache:
    """A cache folder of compiled builds."""

    def __init__(self, root: Optional[os.PathLike] = None):
        self.root = Path(root) if root is not None else toolchain.default_cachedir()

    def entry(self, spec) -> Path:
        return self.root / spec.name

    @contextlib.contextmanager
    def lock(self, spec, exclusive: bool) -> Iterator[None]:
        """Hold the entry's lock (exclusive for building, shared for loading)."""
        folder = self.root / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{spec.name}.lock", "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # -- looking ----------------------------------------------------------------------------
    def inspect(self, spec, key: Optional[Dict[str, Any]] = None) -> Lookup:
        """Is there a valid stored build of ``spec``?  (Takes no lock.)"""
        key = cache_key(spec) if key is None else key
        path = self.entry(spec) / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            return Lookup("missing", f"no stored build in {self.entry(spec)}")
        except (OSError, ValueError) as err:
            return Lookup("corrupt", f"unreadable manifest {path}: {err}")
        if manifest.get("key") != key:
            changed = _differences(manifest.get("key"), key) or ["format"]
            return Lookup("stale", "stored build is stale (changed: " + ", ".join(changed[:6])
                          + (", ..." if len(changed) > 6 else "") + ")", manifest)
        for rel, info in manifest.get("files", {}).items():
            file = self.entry(spec) / rel
            if not file.is_file():
                return Lookup("corrupt", f"{rel} is missing from {self.entry(spec)}", manifest)
            size = file.stat().st_size
            if size != info["size"]:
                return Lookup("corrupt", f"{rel} has {size} bytes, the manifest says "
                              f"{info['size']} (truncated or overwritten)", manifest)
            if _sha256(file) != info["sha256"]:
                return Lookup("corrupt", f"{rel} does not match its checksum", manifest)
        return Lookup("valid", "valid", manifest)

    # -- loading and building ---------------------------------------------------------------
    def get(self, spec, policy: str = "rebuild", load: bool = True) -> "toolchain.Build":
        """The build of ``spec``: ``rebuild`` always compiles (and stores the result);
        ``reuse`` loads a valid stored build and compiles on a miss; ``require`` loads
        a valid stored build and raises :class:`CacheMiss` otherwise."""
        if policy not in POLICIES:
            raise ValueError(f"unknown cache policy {policy!r} (known: {POLICIES})")
        key = cache_key(spec)
        if policy != "rebuild":
            with self.lock(spec, exclusive=False):
                found = self.inspect(spec, key)
                if found.valid:
                    return self._load(spec, found.manifest, load)
            if policy == "require":
                raise CacheMiss(f"no usable precompiled build of {spec.impl.name} for layer "
                                f"{spec.layer.name} ({spec.target}): {found.reason}")
        with self.lock(spec, exclusive=True):
            if policy == "reuse":  # another process may have built it while we waited
                found = self.inspect(spec, key)
                if found.valid:
                    return self._load(spec, found.manifest, load)
            return self._build(spec, key, load)

    def _load(self, spec, manifest: Dict[str, Any], load: bool) -> "toolchain.Build":
        folder = self.entry(spec)
        t0 = time.perf_counter()
        library = folder / manifest["library"]
        sdfg = program = None
        if load:
            sdfg = _read_sdfg(folder, manifest)
            program = toolchain.load_program(library, sdfg)
        return toolchain.Build(spec=spec, folder=folder, program=program,
                               times={"load": time.perf_counter() - t0}, library=library,
                               sdfg=sdfg, origin="loaded")

    def _build(self, spec, key: Dict[str, Any], load: bool) -> "toolchain.Build":
        folder = self.entry(spec)
        (folder / MANIFEST).unlink(missing_ok=True)
        sdfg, library, times = toolchain.compile_spec(spec, folder)
        # The object files are not needed to load the library.
        shutil.rmtree(folder / "build" / "CMakeFiles", ignore_errors=True)
        stub = Path(library).with_name(f"libdacestub_{spec.name}{library.suffix}")
        # convbench.build.loader needs no stub; CPU builds replayed by convbench.build.replay have none.
        files = [Path(library), folder / "program.sdfg"] + ([stub] if stub.is_file() else [])
        manifest = {
            "key": key,
            "library": os.path.relpath(library, folder),
            "sdfg": "program.sdfg",
            "files": {os.path.relpath(f, folder): {"size": f.stat().st_size, "sha256": _sha256(f)}
                      for f in files},
            "build_seconds": times,
            "toolchain_versions": toolchain.toolchain_versions(spec.target),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": os.uname().nodename,
        }
        write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True), sync=True)
        program = toolchain.load_program(library, sdfg) if load else None
        return toolchain.Build(spec=spec, folder=folder, program=program, times=times,
                               library=Path(library), sdfg=sdfg, origin="built")

    def entries(self) -> Iterator[Path]:
        """Entry folders that have a manifest."""
        if self.root.is_dir():
            yield from sorted(p.parent for p in self.root.glob(f"*/{MANIFEST}"))


def build(spec: "toolchain.BuildSpec", cachedir: Optional[os.PathLike] = None, load: bool = True,
          policy: str = "rebuild") -> "toolchain.Build":
    """The build of ``spec`` from the cache in ``cachedir`` (``policy``: see
    :meth:`BuildCache.get`)."""
    return BuildCache(cachedir).get(spec, policy=policy, load=load)


# -- filling a cache in parallel ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Job:
    """One build for :func:`fill`, by name, so that it can cross to a worker process."""

    impl: str
    layer: Layer
    target: str = "cpu"
    params: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    #: What progress lines call it (default: implementation, layer, batch, target).
    label: str = ""

    def spec(self):
        from convbench import registry
        return toolchain.make_spec(registry.get(self.impl), self.layer, self.dtype, self.target,
                                   self.params)

    def describe(self) -> str:
        return self.label or f"{self.impl} {self.layer.name} b{self.layer.batch} {self.target}"


def _fill_one(job: Job, cachedir: str, force: bool) -> Tuple[str, float, str]:
    """Worker: (outcome, seconds, message); outcome is built, cached or failed."""
    t0 = time.perf_counter()
    warnings.simplefilter("ignore")  # DaCe's codegen warnings would garble the progress
    try:
        spec = job.spec()
        cache = BuildCache(cachedir)
        if not force and cache.inspect(spec).valid:
            return "cached", time.perf_counter() - t0, ""
        build = cache.get(spec, policy="rebuild" if force else "reuse", load=False)
        # "loaded": another builder finished it while this one waited for the lock.
        return ("built" if build.origin == "built" else "cached"), time.perf_counter() - t0, ""
    except Exception as err:  # noqa: BLE001 - reported per build
        last = traceback.format_exception_only(type(err), err)[-1].strip()
        return "failed", time.perf_counter() - t0, last.splitlines()[0][:300]


def _read_sdfg(folder: Path, manifest: Dict[str, Any]):
    """The SDFG of an entry whose files the manifest vouched for (:meth:`BuildCache.inspect`).

    DaCe's JSON reader takes ten times as long as a pickle of the same SDFG (0.21 s against
    0.014 s for the register-blocked forward kernel of MLPerf CosmoFlow conv1 at 32^3;
    results/cpu/epyc_f25m17_avx512/sdfg_load/).  So the first load writes one next to
    ``program.sdfg``, named after that file's checksum (a rebuilt entry never reads the old
    one), and later loads, in any process, read it.  One that cannot be read (another Python
    or DaCe, a partial
    copy) or written (a read-only cache) leaves the JSON to be read as before."""
    import pickle

    import dace
    quick = folder / f"program.{manifest['files'][manifest['sdfg']]['sha256'][:16]}.pickle"
    try:
        with open(quick, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - missing or unreadable: the JSON is the truth
        pass
    sdfg = dace.SDFG.from_file(str(folder / manifest["sdfg"]))
    with contextlib.suppress(Exception):
        write_atomic(quick, pickle.dumps(sdfg, protocol=pickle.HIGHEST_PROTOCOL))
    return sdfg


def fill(jobs: Iterable[Job], cachedir: os.PathLike, workers: int,
         force: bool = False) -> Iterator[Tuple[Job, str, float, str]]:
    """Build ``jobs`` into the cache at ``cachedir`` with ``workers`` processes.

    Yields ``(job, outcome, seconds, message)`` as builds finish; ``outcome`` is
    ``built``, ``cached`` (valid already, skipped unless ``force``) or ``failed`` (with
    the error's last line as ``message``).  Workers are spawned, not forked (DaCe and
    torch do not survive a fork), and build under the cache's locks, so other processes
    may use the same folder meanwhile.  Closing the iterator early cancels the builds
    that have not started.
    """
    jobs = list(jobs)
    if not jobs:
        return
    ctx = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=ctx)
    try:
        futures = {pool.submit(_fill_one, job, str(cachedir), force): job for job in jobs}
        for fut in cf.as_completed(futures):
            try:
                result = fut.result()
            except Exception as err:  # noqa: BLE001 - a worker died (killed for memory, say)
                result = ("failed", 0.0, f"{type(err).__name__}: {err}".splitlines()[0][:300])
            yield (futures[fut], *result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
