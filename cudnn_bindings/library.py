"""Finding and loading libcudnn with ctypes, the C prototypes, and error checking.

Search order (the first that exists is used; :func:`candidates` lists them):

1. ``$CONVBENCH_CUDNN``: a libcudnn file, or a folder holding one.  If it is set,
   nothing else is tried, so a typo fails loudly instead of picking another cuDNN.
2. The cuDNN that torch ships: the ``nvidia-cudnn-cu*`` wheel's
   ``site-packages/nvidia/cudnn/lib`` (or ``nvidia/cu*/lib``), then ``torch/lib``.
   When torch already loaded it, ``dlopen`` returns that same library.
3. The system's: ``ctypes.util.find_library("cudnn")``, then ``libcudnn.so.9``.

cuDNN 9's ``libcudnn.so.9`` is a shim that exports the whole API and loads its
sub-libraries on demand, so one handle serves every call here.  Loading it needs no
GPU, and neither do ``cudnnGetVersion`` nor the descriptor functions; creating a
handle does.
"""

import ctypes
import ctypes.util
import functools
import importlib.util
import os
import re
from pathlib import Path
from typing import List, Optional, Tuple

from .enums import Status

ENV_VAR = "CONVBENCH_CUDNN"
_NAMES = ("libcudnn.so.9", "libcudnn.so")

c_int_p = ctypes.POINTER(ctypes.c_int)
c_size_p = ctypes.POINTER(ctypes.c_size_t)
_P = ctypes.c_void_p  # handles, descriptors, device pointers, streams
_I = ctypes.c_int     # enums and ints
_INTS = ctypes.POINTER(ctypes.c_int)


class CudnnNotFound(RuntimeError):
    """No libcudnn could be loaded."""


class CudnnError(RuntimeError):
    """A cuDNN call returned an error status."""

    def __init__(self, call: str, status: int, name: str, detail: str = ""):
        self.call, self.status, self.status_name, self.detail = call, status, name, detail
        text = f"{call} failed: {name} ({status})"
        super().__init__(text + (f": {detail}" if detail else ""))


def _perf_struct(name: str):
    """``cudnnConvolution*AlgoPerf_t``: algo, status, time (ms), memory, determinism,
    mathType, reserved[3] (the same layout for the three passes)."""
    return type(name, (ctypes.Structure,), {"_fields_": [
        ("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]})


FwdAlgoPerf = _perf_struct("FwdAlgoPerf")
BwdDataAlgoPerf = _perf_struct("BwdDataAlgoPerf")
BwdFilterAlgoPerf = _perf_struct("BwdFilterAlgoPerf")

#: name -> argtypes (every function returns cudnnStatus_t unless listed in _RESTYPES).
_PROTOTYPES = {
    "cudnnGetVersion": [],
    "cudnnGetCudartVersion": [],
    "cudnnGetErrorString": [_I],
    "cudnnGetLastErrorString": [ctypes.c_char_p, ctypes.c_size_t],
    "cudnnCreate": [ctypes.POINTER(_P)],
    "cudnnDestroy": [_P],
    "cudnnSetStream": [_P, _P],
    "cudnnCreateTensorDescriptor": [ctypes.POINTER(_P)],
    "cudnnSetTensorNdDescriptor": [_P, _I, _I, _INTS, _INTS],
    "cudnnDestroyTensorDescriptor": [_P],
    "cudnnCreateFilterDescriptor": [ctypes.POINTER(_P)],
    "cudnnSetFilterNdDescriptor": [_P, _I, _I, _I, _INTS],
    "cudnnDestroyFilterDescriptor": [_P],
    "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(_P)],
    "cudnnSetConvolutionNdDescriptor": [_P, _I, _INTS, _INTS, _INTS, _I, _I],
    "cudnnSetConvolutionMathType": [_P, _I],
    "cudnnSetConvolutionGroupCount": [_P, _I],
    "cudnnDestroyConvolutionDescriptor": [_P],
    "cudnnGetConvolutionNdForwardOutputDim": [_P, _P, _P, _I, _INTS],
}
# The three passes take the same kinds of arguments in the same places:
#   Get*_v7(handle, 4 descriptors, requested, *returned, perf*)
#   Find*Ex(handle, (descriptor, pointer) x 2, conv descriptor, descriptor, pointer,
#           requested, *returned, perf*, workspace, workspace bytes)
#   Get*WorkspaceSize(handle, 4 descriptors, algo, *bytes)
#   run(handle, alpha*, (descriptor, pointer) x 2, conv descriptor, algo, workspace,
#       workspace bytes, beta*, descriptor, pointer)
for _get, _find, _size, _run, _perf in (
        ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
         "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward", FwdAlgoPerf),
        ("cudnnGetConvolutionBackwardDataAlgorithm_v7",
         "cudnnFindConvolutionBackwardDataAlgorithmEx",
         "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData",
         BwdDataAlgoPerf),
        ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
         "cudnnFindConvolutionBackwardFilterAlgorithmEx",
         "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter",
         BwdFilterAlgoPerf)):
    _perf_p = ctypes.POINTER(_perf)
    _PROTOTYPES[_get] = [_P] * 5 + [_I, c_int_p, _perf_p]
    _PROTOTYPES[_find] = [_P] * 8 + [_I, c_int_p, _perf_p, _P, ctypes.c_size_t]
    _PROTOTYPES[_size] = [_P] * 5 + [_I, c_size_p]
    _PROTOTYPES[_run] = [_P] * 7 + [_I, _P, ctypes.c_size_t, _P, _P, _P]

_RESTYPES = {"cudnnGetVersion": ctypes.c_size_t, "cudnnGetCudartVersion": ctypes.c_size_t,
             "cudnnGetErrorString": ctypes.c_char_p, "cudnnGetLastErrorString": None}


class Library:
    """A loaded libcudnn with typed functions: ``lib.cudnnCreate(...)``."""

    def __init__(self, path: Path, source: str):
        self.path, self.source = Path(path), source
        self._dll = ctypes.CDLL(str(path))
        for name, argtypes in _PROTOTYPES.items():
            fn = getattr(self._dll, name)
            fn.argtypes = argtypes
            fn.restype = _RESTYPES.get(name, ctypes.c_int)
            setattr(self, name, fn)

    @property
    def version(self) -> int:
        """``cudnnGetVersion()``, e.g. 92800 for 9.28.0."""
        return int(self.cudnnGetVersion())

    @property
    def version_tuple(self) -> Tuple[int, int, int]:
        v = self.version
        return v // 10000, (v % 10000) // 100, v % 100

    def error_string(self, status: int) -> str:
        return self.cudnnGetErrorString(int(status)).decode(errors="replace")

    def last_error(self) -> str:
        buf = ctypes.create_string_buffer(1024)
        self.cudnnGetLastErrorString(buf, len(buf))
        return buf.value.decode(errors="replace").strip()

    def check(self, call: str, status: int) -> None:
        """Raise :class:`CudnnError` naming ``call`` unless ``status`` is success."""
        if status != Status.SUCCESS:
            raise CudnnError(call, int(status), self.error_string(status), self.last_error())

    def __call__(self, name: str, *args) -> None:
        """Call ``name`` and check its status: ``lib("cudnnCreate", byref(h))``."""
        self.check(name, getattr(self, name)(*args))


def _wheel_folders() -> List[Path]:
    folders = []
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        folders += [Path(base) / "cudnn" / "lib"] + sorted(Path(base).glob("cu[0-9]*/lib"))
    torch_spec = importlib.util.find_spec("torch")
    if torch_spec and torch_spec.origin:
        folders.append(Path(torch_spec.origin).parent / "lib")
    return folders


def _in_folder(folder: Path) -> Optional[Path]:
    for name in _NAMES:
        if (folder / name).is_file():
            return folder / name
    versioned = sorted(folder.glob("libcudnn.so.[0-9]*")) if folder.is_dir() else []
    return versioned[0] if versioned else None


def candidates() -> List[Tuple[str, str]]:
    """(where, path or name) in search order (see the module docstring)."""
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env)
        found = _in_folder(path) if path.is_dir() else path
        return [(f"${ENV_VAR}", str(found or path))]
    out = []
    for folder in _wheel_folders():
        found = _in_folder(folder)
        if found:
            out.append(("torch's cuDNN wheel" if "nvidia" in str(folder) else "torch/lib",
                        str(found)))
    system = ctypes.util.find_library("cudnn")
    out += [("system", name) for name in ([system] if system else []) + list(_NAMES)]
    unique, seen = [], set()
    for where, path in out:
        real = os.path.realpath(path) if os.path.isabs(path) else path
        if real not in seen:
            seen.add(real)
            unique.append((where, path))
    return unique


@functools.lru_cache(maxsize=None)
def load() -> Library:
    """The first loadable candidate; :class:`CudnnNotFound` lists what was tried."""
    tried = []
    for where, path in candidates():
        try:
            return Library(Path(path), where)
        except OSError as err:
            tried.append(f"{where}: {path} ({str(err).splitlines()[0]})")
        except AttributeError as err:  # a libcudnn without the API we need
            tried.append(f"{where}: {path} (not a cuDNN 9 library: {err})")
    raise CudnnNotFound("libcudnn not found; tried " + "; ".join(tried) +
                        f". Set ${ENV_VAR} to a libcudnn.so.9 or its folder.")


def include_dirs() -> List[Path]:
    """Folders that may hold the cuDNN headers: next to the library, then the system's."""
    out = []
    try:
        out.append(load().path.resolve().parent.parent / "include")
    except CudnnNotFound:
        pass
    out += [Path("/usr/include"), Path("/usr/local/cuda/include")]
    return [d for d in out if (d / "cudnn_graph.h").is_file() or (d / "cudnn_graph_v9.h").is_file()]


def header_values(folder: Path) -> dict:
    """``CUDNN_NAME -> value`` for every ``CUDNN_... = <int>`` in the headers of ``folder``."""
    values = {}
    for header in sorted(folder.glob("cudnn*.h")):
        for name, value in re.findall(r"\b(CUDNN_[A-Z0-9_]+)\s*=\s*(-?\d+)\b", header.read_text(
                errors="replace")):
            values.setdefault(name, int(value))
    return values


def enum_mismatches(values: dict) -> list:
    """Differences between :mod:`cudnn_bindings.enums` and header values (``header_values``):
    one line per C name that is missing or has another value."""
    from .enums import PREFIXES, c_name
    out = []
    for cls in PREFIXES:
        for member in cls:
            name = c_name(member)
            if name not in values:
                out.append(f"{name}: not in the headers")
            elif values[name] != int(member):
                out.append(f"{name}: headers say {values[name]}, the bindings {int(member)}")
    return out
