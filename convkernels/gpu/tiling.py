"""Machinery shared by the tiled implementations: index tables, the padded filter matrix,
and the schedule that maps tile levels onto a target.

Tiled programs follow one shape, chosen to stay clear of DaCe 1.0.2's frontend bugs
(docs/adding-an-implementation.md lists them; docs/kernel-design.md the shape):

* a top-level **block map** whose parameters start with ``blk_`` (one thread-block tile);
* inside it only **maps**, never Python ``for`` loops: a ``for`` loop in a map body
  becomes a nested SDFG, and an index that uses an enclosing loop's variable there
  loses its offset (spcl/dace#1739).  A sequential step (the K loop) is a map whose
  parameter the schedule marks sequential, and accumulation is ``+=`` (a sum
  write-conflict resolution that DaCe emits as a plain add in a sequential scope);
* **thread maps** over ``ti, tj`` (or ``t``), one iteration per thread;
* per-thread state that lives across sequential steps is a block-level array whose
  leading dimensions are the thread indices (``acc[ti, tj, r, s]``).

Flat indices (``m`` = output pixel, ``kk`` = filter tap) are never decoded with ``%`` or
``//`` in subscripts (the second bug of docs/adding-an-implementation.md); the programs read
precomputed **offset tables** instead, as cuDNN's IMPLICIT_PRECOMP_GEMM does.  The tables
and the padded filter are arguments of the program that the ``add_*_table`` functions and
:func:`add_filter_matrix` (through :func:`convkernels.gpu.igemm.finish`) turn into
transients filled by maps in front of the computation.

The same structure runs on both targets.  :func:`tiled_schedule` maps the block map
to ``GPU_Device`` or ``CPU_Multicore``, thread maps to ``GPU_ThreadBlock`` or sequential
loops, staging buffers to ``GPU_Shared`` or the stack, and, on the GPU, shrinks each
per-thread array to the calling thread's slice so that it lives in registers.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import dace
from dace.sdfg import nodes

from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout

S = dace.ScheduleType
ST = dace.StorageType

#: Threads per block of the plain element-wise kernels (padding, tables, reductions).
ELEMENTWISE_BLOCK = [256, 1, 1]
#: Largest thread block of a CUDA kernel.
MAX_THREADS = 1024


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fit_tile(tile: int, extent: int, smallest: int) -> int:
    """A power-of-two tile no larger than ``tile`` that is not much larger than ``extent``:
    the next power of two >= extent, but at least ``smallest``.  Small layers then run
    small blocks instead of mostly padding (a 512-pixel tile on a 2x2x2 plane)."""
    return min(tile, max(smallest, 1 << max(0, extent - 1).bit_length()))


# ---------------------------------------------------------------------------------------------
# Index tables
# ---------------------------------------------------------------------------------------------

def pixel_grid(layer: Layer):
    """Map ranges of the output pixels (b, od, oh, ow) and their flat index ``m``."""
    ranges = {"b": f"0:{layer.batch}", "od": f"0:{layer.out_d}", "oh": f"0:{layer.out_h}",
              "ow": f"0:{layer.out_w}"}
    flat = f"((b * {layer.out_d} + od) * {layer.out_h} + oh) * {layer.out_w} + ow"
    return ranges, flat


def input_strides(layer: Layer, layout: Layout) -> Dict[str, int]:
    """Element strides of the padded input per logical dimension (n, c, d, h, w)."""
    L = layer_constants(layer, layout)
    c, dp, hp, wp = L.C, L.DP, L.HP, L.WP
    if layout == Layout.NCDHW:
        return {"n": c * dp * hp * wp, "c": dp * hp * wp, "d": hp * wp, "h": wp, "w": 1}
    return {"n": dp * hp * wp * c, "d": hp * wp * c, "h": wp * c, "w": c, "c": 1}


def tap_dims(layer: Layer, layout: Layout) -> Tuple[Tuple[str, int], ...]:
    """The reduction dimensions (name, size) in the filter's memory order after ``k``."""
    taps = (("kd", layer.k_d), ("kh", layer.k_h), ("kw", layer.k_w))
    c = (("c", layer.in_channels),)
    return c + taps if layout == Layout.NCDHW else taps + c


def _linear(dims: Sequence[Tuple[str, int]]) -> str:
    """Row-major flat index of the named dims, e.g. ``((a) * 3 + b) * 4 + c``."""
    expr = dims[0][0]
    for name, size in dims[1:]:
        expr = f"({expr}) * {size} + {name}"
    return expr


def _add_table(sdfg, name: str, ranges: Mapping[str, str], index: str, value: str,
               length: int, valid: int):
    """``name[index] = value`` over ``ranges``; entries ``valid:length`` are zero."""
    desc = sdfg.arrays[name]
    if tuple(desc.shape) != (length,):
        raise ValueError(f"table {name} has shape {desc.shape}, expected ({length},)")
    desc.transient = True
    state = sdfg.add_state_before(sdfg.start_state, f"table_{name}")
    state.add_mapped_tasklet(
        f"table_{name}", dict(ranges), {}, f"out = {value}",
        {"out": dace.Memlet(f"{name}[{index}]")}, external_edges=True)
    if valid < length:
        fill = sdfg.add_state_before(sdfg.start_state, f"fill_{name}")
        fill.add_mapped_tasklet(
            f"fill_{name}", {"i": f"{valid}:{length}"}, {}, "out = 0",
            {"out": dace.Memlet(f"{name}[i]")}, external_edges=True)


def add_row_table(sdfg, name: str, layer: Layer, layout: Layout, length: int):
    """``name[m]``: offset in the flat padded input of the window origin of output pixel m."""
    st = input_strides(layer, layout)
    s = layer.stride
    ranges, flat = pixel_grid(layer)
    value = (f"b * {st['n']} + od * {s * st['d']} + oh * {s * st['h']} + ow * {s * st['w']}")
    _add_table(sdfg, name, ranges, flat, value, length, layer.gemm_m)


def add_plane_table(sdfg, name: str, layer: Layer, length: int):
    """NCDHW, one image and channel: ``name[p]`` for the flat output pixel p = (od, oh, ow)."""
    st = input_strides(layer, Layout.NCDHW)
    s = layer.stride
    ranges = {"od": f"0:{layer.out_d}", "oh": f"0:{layer.out_h}", "ow": f"0:{layer.out_w}"}
    flat = f"(od * {layer.out_h} + oh) * {layer.out_w} + ow"
    value = f"od * {s * st['d']} + oh * {s * st['h']} + ow * {s * st['w']}"
    _add_table(sdfg, name, ranges, flat, value, length, layer.out_d * layer.out_h * layer.out_w)


def add_tap_table(sdfg, name: str, layer: Layer, layout: Layout, length: int,
                  dims: Optional[Sequence[Tuple[str, int]]] = None):
    """``name[kk]``: offset of reduction tap kk from the window origin, kk in the filter's
    memory order (``dims`` restricts it, e.g. to the spatial taps of one channel)."""
    st = input_strides(layer, layout)
    dims = tuple(dims or tap_dims(layer, layout))
    ranges = {n: f"0:{size}" for n, size in dims}
    value = " + ".join(f"{n} * {st[n[-1]]}" for n, _ in dims)  # kd -> stride of d, c -> c
    _add_table(sdfg, name, ranges, _linear(dims), value, length, math.prod(s for _, s in dims))


def add_output_table(sdfg, name: str, layer: Layer, layout: Layout, length: int):
    """``name[m]``: offset in the flat output of (pixel m, channel 0).  Channel n of the
    pixel is at ``name[m] + n * output_channel_stride(layer, layout)``."""
    ranges, flat = pixel_grid(layer)
    k, plane = layer.out_channels, layer.out_d * layer.out_h * layer.out_w
    if layout == Layout.NCDHW:
        value = f"b * {k * plane} + (od * {layer.out_h} + oh) * {layer.out_w} + ow"
    else:
        value = f"({flat}) * {k}"
    _add_table(sdfg, name, ranges, flat, value, length, layer.gemm_m)


def output_channel_stride(layer: Layer, layout: Layout) -> int:
    return layer.out_d * layer.out_h * layer.out_w if layout == Layout.NCDHW else 1


def add_filter_matrix(sdfg, name: str, layer: Layer, layout: Layout, flipped: bool = False):
    """``name[kk, n] = w[n, taps(kk)]``: the filter as the zero-padded GEMM operand B
    (reduction rows in the filter's memory order, output channels as columns).
    ``flipped``: ``layer`` is the stride-1 convolution that computes dL/dx of the layer
    whose filter ``w`` is (``transposed_layer``), and B is that filter flipped in space
    with its two channel dimensions swapped: ``w[c, k - 1 - taps, n]``."""
    desc = sdfg.arrays[name]
    desc.transient = True
    rows, cols = desc.shape
    dims = tap_dims(layer, layout)
    ranges = {"n": f"0:{layer.out_channels}", **{d: f"0:{s}" for d, s in dims}}
    if flipped:
        sizes = dict(dims)
        spatial = [f"{sizes[d] - 1} - {d}" for d in ("kd", "kh", "kw")]
        w_index = ", ".join(["c", "n", *spatial] if layout == Layout.NCDHW
                            else ["c", *spatial, "n"])
    else:
        w_index = ", ".join(["n"] + [d for d, _ in dims])
    copy = sdfg.add_state_before(sdfg.start_state, f"matrix_{name}")
    copy.add_mapped_tasklet(
        f"matrix_{name}", ranges, {"inp": dace.Memlet(f"w[{w_index}]")}, "out = inp",
        {"out": dace.Memlet(f"{name}[{_linear(dims)}, n]")}, external_edges=True)
    zero = sdfg.add_state_before(copy, f"zero_{name}")
    zero.add_mapped_tasklet(
        f"zero_{name}", {"i": f"0:{rows}", "j": f"0:{cols}"}, {}, "out = 0",
        {"out": dace.Memlet(f"{name}[i, j]")}, external_edges=True)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------

#: Offsets in the tables are int32.
INT32_MAX = 2 ** 31 - 1
#: Static shared memory per block that a kernel may use without opting in (CUDA).
SHARED_BYTES = 48 * 1024
#: Bytes per staged element (the workbench's arithmetic is float32).
ELEMENT_BYTES = 4

INT32_CONSTRAINT = "padded input and output below 2^31 elements each (int32 offset tables)"


def int32_offsets(layer: Layer, params=None) -> Optional[str]:
    """Why ``layer`` is too large for int32 offset tables, or None."""
    padded = math.prod(layer_constants(layer, Layout.NCDHW).xp_shape)
    out = math.prod(layer.output_shape)
    if max(padded, out) > INT32_MAX:
        return (f"padded input ({padded}) or output ({out}) elements exceed the int32 "
                f"offset tables ({INT32_MAX})")
    return None


def power_of_two(value: int) -> Optional[str]:
    return None if value & (value - 1) == 0 else "must be a power of two"


def require(*conditions: Tuple[bool, str]) -> Optional[str]:
    """The first message whose condition is false, else None."""
    for ok, message in conditions:
        if not ok:
            return message
    return None


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

def _map_entries(sdfg) -> Iterable[nodes.MapEntry]:
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, nodes.MapEntry):
            yield node


def _transients(sdfg, names: Iterable[str]):
    """Descriptors of the transients called ``names`` anywhere in the SDFG tree."""
    wanted = set(names)
    for sd in sdfg.all_sdfgs_recursive():
        for name, desc in sd.arrays.items():
            if name in wanted and desc.transient:
                yield sd, name, desc


def _privatize(sdfg, name: str, thread_dims: int):
    """Shrink per-thread array ``name`` (leading ``thread_dims`` dims = thread index) to
    one thread's slice.  Valid on the GPU only, where code outside thread-block maps is
    run by every thread, so each thread already holds its own copy of the array."""
    found = False
    for sd, arr, desc in list(_transients(sdfg, [name])):
        found = True
        desc.set_shape((1,) * thread_dims + tuple(desc.shape[thread_dims:]))
        for state in sd.states():
            for edge in state.edges():
                m = edge.data
                if m.data != arr:
                    if m.other_subset is not None and arr in (
                            getattr(edge.src, "data", None), getattr(edge.dst, "data", None)):
                        raise NotImplementedError(f"copy into per-thread array {arr}")
                    continue
                ranges = list(m.subset.ranges)
                m.subset = dace.subsets.Range([(0, 0, 1)] * thread_dims + ranges[thread_dims:])
                if m.wcr is not None:
                    # Without the thread index the accumulation looks conflicted and
                    # DaCe would emit atomics, which registers do not support.
                    m.wcr_nonatomic = True
    if not found:
        raise ValueError(f"no per-thread array '{name}' in {sdfg.name}")


def kernel_faults(sdfg) -> list:
    """What in a GPU schedule would run wrong or never finish, as sentences (empty: none).

    * A device-level map inside a kernel: DaCe 1.0.2 launches it as extra grid blocks
      behind a grid-wide barrier (``cub::GridBarrier``), which deadlocks once the grid has
      more blocks than the GPU holds at once.
    * A transient in global memory that only one kernel's inside uses: DaCe allocates it
      once, outside the kernel, so every block of the grid shares it (a race that the
      CPU schedule, which allocates it per iteration, cannot show).  One that two kernels
      use (partials one writes and the next reads) is how kernels pass data.
    """
    faults = []
    inside = {}  # transient -> (name, every access seen inside a kernel, those kernels)

    def walk(graph, around):  # around: the kernel map enclosing this nested SDFG, if any
        for state in graph.states():
            scope = state.scope_dict()
            for node in state.nodes():
                outer, kernel = scope[node], around
                while outer is not None:
                    if outer.map.schedule == S.GPU_Device:
                        kernel = outer
                    outer = scope[outer]
                if isinstance(node, nodes.MapEntry) and kernel is not None and \
                        node.map.schedule in (S.GPU_Device, S.GPU_Persistent):
                    faults.append(f"map {', '.join(node.map.params)} is a "
                                  f"{node.map.schedule.name} map inside kernel "
                                  f"{', '.join(kernel.map.params)}")
                elif isinstance(node, nodes.AccessNode):
                    desc = graph.arrays[node.data]
                    if desc.transient and desc.storage == ST.GPU_Global:
                        key = (id(graph), node.data)
                        _, only, kernels = inside.get(key, (0, True, frozenset()))
                        inside[key] = (node.data, only and kernel is not None,
                                       kernels | {id(kernel)})
                elif isinstance(node, nodes.NestedSDFG):
                    walk(node.sdfg, kernel)

    walk(sdfg, None)
    faults += [f"transient {name} is in global memory but used only inside a kernel: "
               f"every block shares it" for name, only, kernels in
               sorted(inside.values(), key=lambda v: v[0]) if only and len(kernels) == 1]
    return faults


def check_kernels(sdfg) -> None:
    faults = kernel_faults(sdfg)
    if faults:
        raise ValueError(f"GPU schedule of {sdfg.name}: " + "; ".join(faults))


def const_inputs(sdfg, connectors):
    """Make DaCe 1.0.2 cast the pointers of tasklet ``connectors`` that read a whole input
    array (a gather into the flat view of the input, say): on the GPU it declares such a
    pointer non-const inside the kernel, whose argument is const, and initialises it
    without a cast unless the connector's type reads differently.  ``::T`` is the same type
    as ``T`` in other words (``dace::float32`` is ``float``)."""
    import copy
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, dace.nodes.Tasklet):
            continue
        for conn in set(connectors) & set(node.in_connectors):
            edge, = [e for e in state.in_edges(node) if e.dst_conn == conn]
            same = copy.copy(state.parent.arrays[edge.data.data].dtype)
            # a builtin type has no ``::`` spelling; DaCe names float32 ``dace::float32``
            same.ctype = same.ctype_unaligned = ("dace::float32" if same.ctype == "float"
                                                 else f"::{same.ctype}")
            node.in_connectors[conn] = dace.pointer(same)


def vector_shared(sdfg, names: Sequence[str], connectors: Sequence[str]) -> None:
    """The shared arrays ``names`` as arrays of 16-byte vectors, and the tasklet
    ``connectors`` that take them whole as pointers to those: DaCe 1.0.2 declares a
    shared array with its element type's alignment, and 128-bit loads and 16-byte
    ``cp.async`` copies need 16."""
    vec = dace.vector(dace.float32, 4)
    for sd, name, desc in _transients(sdfg, names):
        (size,), = [desc.shape]
        desc.dtype = vec
        desc.set_shape((size // 4,))
        for state in sd.states():
            for edge in state.edges():
                if edge.data.data == name:
                    edge.data.subset = dace.subsets.Range([(0, size // 4 - 1, 1)])
                for node in (edge.src, edge.dst):
                    if isinstance(node, nodes.Tasklet):
                        for conns in (node.in_connectors, node.out_connectors):
                            for conn in conns:
                                if conn in connectors:
                                    conns[conn] = dace.pointer(vec)


def tiled_schedule(target: str, block: str = "blk_", threads: Sequence[str] = ("ti", "tj"),
                   sequential: Sequence[str] = (), shared: Sequence[str] = (),
                   private: Mapping[str, int] = None) -> Callable:
    """Schedule for the tiled programs described in the module docstring.

    ``block``: prefix of the block map's parameters.  ``threads``: parameters of thread
    maps.  ``sequential``: parameters of maps that must run in order (the K loop), never
    unrolled.  ``shared``: staging buffers.  ``private``: per-thread arrays and how many
    leading dimensions index the thread.
    """
    private = dict(private or {})

    def schedule(sdfg, layer, params):
        gpu = target == "gpu"
        if gpu:
            for desc in sdfg.arrays.values():  # arguments, tables, views: device memory
                desc.storage = ST.GPU_Global
        # maps at the outermost scope of the root SDFG's states: each its own kernel
        top_level = {n for st in sdfg.states() for n, scope in st.scope_dict().items()
                     if scope is None}
        for entry in _map_entries(sdfg):
            mp = entry.map
            if mp.params[0].startswith(block):
                mp.schedule = S.GPU_Device if gpu else S.CPU_Multicore
                if not gpu:
                    mp.collapse = len(mp.params)
            elif tuple(mp.params) == tuple(threads):
                mp.schedule = S.GPU_ThreadBlock if gpu else S.Sequential
            elif entry in top_level:  # an element-wise kernel: tables, padding, reductions
                mp.schedule = S.GPU_Device if gpu else S.CPU_Multicore
                if gpu:
                    mp.gpu_block_size = list(ELEMENTWISE_BLOCK)
                else:
                    mp.collapse = len(mp.params)
            elif any(p in sequential for p in mp.params):
                mp.schedule = S.Sequential
            else:  # a small register-tile map inside a thread: unrolled on the GPU
                mp.schedule = S.Sequential
                mp.unroll = gpu
        for names, kind in ((shared, "staging buffer"), (private, "per-thread array")):
            missing = set(names) - {name for _, name, _ in _transients(sdfg, names)}
            if missing:  # e.g. renamed by simplify: it would stay in global memory
                raise ValueError(f"no {kind} {', '.join(sorted(missing))} in {sdfg.name}")
        for _, _, desc in _transients(sdfg, shared):
            desc.storage = ST.GPU_Shared if gpu else ST.Register
            desc.lifetime = dace.AllocationLifetime.Scope
        for _, _, desc in _transients(sdfg, private):
            desc.storage = ST.Register
        if gpu:
            for name, dims in private.items():
                _privatize(sdfg, name, dims)
            check_kernels(sdfg)

    schedule.__doc__ = (f"{target.upper()} schedule of a tiled program: block map -> "
                        f"{'GPU_Device' if target == 'gpu' else 'CPU_Multicore'}, thread maps -> "
                        f"{'GPU_ThreadBlock' if target == 'gpu' else 'sequential loops'}.")
    return schedule
