"""Shared memory beyond 48 KiB in DaCe-built kernels: an extension of DaCe 1.0.2's CUDA code
generator that the kernel library registers (:func:`register`).

DaCe declares every ``GPU_Shared`` array as a static ``__shared__`` array, and a kernel's
static shared memory is capped at 48 KiB; it never asks for more (the opt-in attribute
``cudaFuncAttributeMaxDynamicSharedMemorySize``), and it refuses a shared array of symbolic
size ("Dynamic shared memory unsupported").  Hopper gives a block up to 227 KiB, which the
deep stages of the ``wgmma`` main loop need.

:class:`DynamicSharedCodeGen` is DaCe's CUDA code generator with one rule added: **a kernel
whose shared arrays together exceed** :data:`STATIC_LIMIT` **bytes keeps them in dynamic
shared memory.**  For such a kernel it

- declares one ``extern __shared__`` buffer and places each shared array in it at an offset
  aligned to :data:`ALIGN` bytes (1024: the period of the 128-byte swizzle that ``wgmma``
  and TMA read), the buffer itself aligned at run time, so no static declaration or
  compiler placement can misalign it;
- launches with the buffer's bytes as the launch's dynamic shared memory, through DaCe's own
  launch statement: DaCe passes there the sum, over the kernel's access nodes, of the sizes
  of shared arrays of symbolic size, so while the kernel is generated its first array's
  size reads as the symbol ``__cb_dsmem_<kernel>`` divided by the number of times that sum
  meets the array (an array written in two places has two access nodes), and a macro
  written after the kernel defines the symbol as a call that sets the opt-in attribute
  (once per kernel and device) and returns the bytes.

Kernels within the static limit are generated exactly as DaCe generates them (the project's
code digests, ``convbench codegen-hashes``, check that).  The bytes of each dynamic kernel
are also recorded in the generated code as ``// cb-dynamic-shared <kernel> <bytes>`` for the
build verdict and the occupancy model (:mod:`convbench.build.gpubuild`), since ptxas reports
static shared memory only.
"""

import re
from typing import Dict, Optional, Tuple

import dace
from dace import dtypes
from dace.codegen.targets import cuda as dace_cuda  # before the dispatcher: an import cycle
from dace.codegen.dispatcher import DefinedType
from dace.codegen.targets.target import TargetCodeGenerator
from dace.sdfg import nodes

#: Bytes of static shared memory a block may declare; above, a kernel goes dynamic.
STATIC_LIMIT = 48 * 1024
#: Alignment of each array in the dynamic buffer (and of the buffer).
ALIGN = 1024
#: The name of the dynamic buffer in a kernel.
BUFFER = "__cb_dynamic_shared"
#: How the generated code records a dynamic kernel's bytes: kernel name, bytes.
RECORD = re.compile(r"^// cb-dynamic-shared (\w+) (\d+)$", re.M)

#: C++ the generated file gets with its first dynamic kernel: the opt-in, checked.
_OPT_IN = r"""
#ifndef CB_DYNAMIC_SHARED
#define CB_DYNAMIC_SHARED
#include <cstdio>
// Allow `kernel` `bytes` of dynamic shared memory (beyond the 48 KiB default) on the
// current device, once per device (`done`: the kernel's flags), and return them, for the
// launch: a failure is printed here and the launch then reports its error.
static inline size_t cb_dynamic_shared_opt_in(const void* kernel, const char* name, int bytes,
                                              bool (&done)[64]) {
    int device = 0;
    cudaGetDevice(&device);
    if (!done[device & 63]) {
        const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess)
            fprintf(stderr, "%s: %d bytes of dynamic shared memory refused: %s\n", name,
                    bytes, cudaGetErrorString(e));
        done[device & 63] = e == cudaSuccess;
    }
    return (size_t)bytes;
}
#endif
"""


def _shared_arrays(sdfg, dfg_scope):
    """(SDFG, name, descriptor, bytes) of each shared transient in a kernel's scope, nested
    SDFGs included, each name once, in the order DaCe meets them."""
    found = {}
    for node in dfg_scope.nodes():
        if isinstance(node, nodes.AccessNode):
            desc = sdfg.arrays[node.data]
            if desc.storage == dtypes.StorageType.GPU_Shared and desc.transient:
                found.setdefault((id(sdfg), node.data), (sdfg, node.data, desc))
        elif isinstance(node, nodes.NestedSDFG):
            for sd, name, desc in node.sdfg.arrays_recursive():
                if (desc is not None and desc.storage == dtypes.StorageType.GPU_Shared
                        and desc.transient):
                    found.setdefault((id(sd), name), (sd, name, desc))
    out = []
    for sd, name, desc in found.values():
        size = desc.total_size * desc.dtype.bytes
        if dace.symbolic.issymbolic(size, sd.constants):
            return None  # symbolic sizes: DaCe's own path (which refuses them)
        out.append((sd, name, desc, int(size)))
    return out


def _launch_sum_count(dfg_scope, name) -> int:
    """How many times DaCe's sum of a kernel's symbolic shared memory (CUDACodeGen's
    launch, ``dynsmem_size``) meets array ``name`` of the kernel's own SDFG: once per access
    node of it in the scope."""
    return sum(1 for node in dfg_scope.nodes()
               if isinstance(node, nodes.AccessNode) and node.data == name)


def layout(arrays) -> Tuple[Dict[Tuple[int, str], int], int]:
    """Offsets of the arrays ``(sdfg, name, desc, bytes)`` in the dynamic buffer, each at a
    multiple of :data:`ALIGN`, and the bytes to launch with (the last array's end, plus
    :data:`ALIGN` for aligning the buffer at run time)."""
    offsets, end = {}, 0
    for sd, name, _, size in arrays:
        offsets[(id(sd), name)] = end
        end += -(-size // ALIGN) * ALIGN
    return offsets, end + ALIGN


def kernel_bytes(code: str) -> Dict[str, int]:
    """The dynamic shared memory of each kernel of generated CUDA code, by kernel name."""
    return {m.group(1): int(m.group(2)) for m in RECORD.finditer(code)}


class DynamicSharedCodeGen(dace_cuda.CUDACodeGen):
    """DaCe's CUDA code generator, with kernels over :data:`STATIC_LIMIT` bytes of shared
    arrays in dynamic shared memory (the module docstring)."""

    def __init__(self, frame_codegen, sdfg):
        super().__init__(frame_codegen, sdfg)
        self._cb_offsets: Optional[Dict[Tuple[int, str], int]] = None
        self._cb_bytes = 0
        self._cb_kernel = ""
        self._cb_declared = False
        self._cb_helpers = False

    def generate_scope(self, sdfg, cfg, dfg_scope, state_id, function_stream, callsite_stream):
        entry = dfg_scope.source_nodes()[0]
        device = (self._kernel_map is not None
                  and self._kernel_map.map.schedule in dtypes.GPU_SCHEDULES)
        arrays = None if device else _shared_arrays(sdfg, dfg_scope)
        if not arrays or sum(a[3] for a in arrays) <= STATIC_LIMIT:
            return super().generate_scope(sdfg, cfg, dfg_scope, state_id, function_stream,
                                          callsite_stream)
        state = cfg.state(state_id)
        # DaCe's own kernel name (CUDACodeGen.generate_scope); generate_kernel_scope checks it
        self._cb_kernel = '%s_%d_%d_%d' % (entry.map.label, sdfg.cfg_id, sdfg.node_id(state),
                                           state.node_id(entry))
        self._cb_offsets, self._cb_bytes = layout(arrays)
        self._cb_declared = False
        if not self._cb_helpers:
            self._globalcode.write(_OPT_IN)
            self._cb_helpers = True
        # DaCe launches with the sum of the symbolic-sized shared arrays over the scope's
        # access nodes: while this kernel is generated, its first array's size reads as the
        # symbol the macro defines over the times the sum meets it, so the sum is the symbol
        first_sdfg, first_name, first, _ = arrays[0]
        meets = _launch_sum_count(dfg_scope, first_name) if first_sdfg is sdfg else 0
        if not meets:
            raise NotImplementedError(f"dynamic shared memory: {first_name} is not in the "
                                      f"scope of kernel {self._cb_kernel}")
        shape = first.shape
        first.shape = (dace.symbolic.symbol(f"__cb_dsmem_{self._cb_kernel}") / meets,)
        try:
            super().generate_scope(sdfg, cfg, dfg_scope, state_id, function_stream,
                                   callsite_stream)
        finally:
            first.shape = shape
            self._cb_offsets = None

    def generate_kernel_scope(self, sdfg, cfg, dfg_scope, state_id, kernel_map, kernel_name,
                              *args, **kwargs):
        if self._cb_offsets is not None:
            if kernel_name != self._cb_kernel:
                raise RuntimeError(f"dynamic shared memory: kernel {kernel_name} generated "
                                   f"as {self._cb_kernel}")
            # at namespace scope between the kernel and the function that launches it
            self.scope_exit_stream.write(
                f"// cb-dynamic-shared {kernel_name} {self._cb_bytes}\n"
                f"#define __cb_dsmem_{kernel_name} ([] {{ static bool done[64] = {{}}; "
                f"return cb_dynamic_shared_opt_in((const void*){kernel_name}, "
                f"\"{kernel_name}\", {self._cb_bytes}, done); }}())\n")
        return super().generate_kernel_scope(sdfg, cfg, dfg_scope, state_id, kernel_map,
                                             kernel_name, *args, **kwargs)

    def allocate_array(self, sdfg, cfg, dfg, state_id, node, nodedesc, function_stream,
                       declaration_stream, allocation_stream):
        offset = (None if self._cb_offsets is None
                  else self._cb_offsets.get((id(sdfg), node.data)))
        if offset is None or nodedesc.storage != dtypes.StorageType.GPU_Shared:
            return super().allocate_array(sdfg, cfg, dfg, state_id, node, nodedesc,
                                          function_stream, declaration_stream,
                                          allocation_stream)
        if node.setzero:
            raise NotImplementedError(f"dynamic shared memory: {node.data} is zeroed at "
                                      "allocation (setzero), which this extension does not do")
        name = dace.codegen.targets.cpp.ptr(node.data, nodedesc, sdfg, self._frame)
        try:
            self._dispatcher.defined_vars.get(name)
            return
        except KeyError:
            pass
        ctype = nodedesc.dtype.ctype
        if not self._cb_declared:
            declaration_stream.write(
                f"extern __shared__ __align__({ALIGN}) unsigned char {BUFFER}_raw[];\n"
                f"unsigned char* {BUFFER} = {BUFFER}_raw + (({ALIGN}u - "
                f"((unsigned)__cvta_generic_to_shared({BUFFER}_raw) & {ALIGN - 1}u)) "
                f"& {ALIGN - 1}u);\n", cfg, state_id, node)
            self._cb_declared = True
        declaration_stream.write(
            f"{ctype}* {name} = reinterpret_cast<{ctype}*>({BUFFER} + {offset});\n",
            cfg, state_id, node)
        self._dispatcher.defined_vars.add(name, DefinedType.Pointer, f"{ctype} *")


def register() -> None:
    """Make :class:`DynamicSharedCodeGen` DaCe's ``cuda`` target (idempotent)."""
    registry = TargetCodeGenerator.extensions()
    if DynamicSharedCodeGen in registry:
        return
    for cls in [c for c, v in registry.items() if v.get("name") == "cuda"]:
        TargetCodeGenerator.unregister(cls)
    TargetCodeGenerator.register(DynamicSharedCodeGen, name="cuda")


def registered() -> bool:
    """Whether DaCe generates CUDA through :class:`DynamicSharedCodeGen`."""
    return DynamicSharedCodeGen in TargetCodeGenerator.extensions()
