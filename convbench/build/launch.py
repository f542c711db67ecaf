"""CUDA launch limits of GPU builds, checked and met before nvcc runs.

A kernel's grid may have up to 2^31 - 1 blocks along x but only 65535 along y and z.
DaCe 1.0.2 puts a GPU_Device map's last parameter on x, the one before on y, and the
product of all the others on z, and it checks the block size against the device's
limits but never the grid: a map over (channels, taps) or over (GEMM rows, columns)
compiles, and its launch fails on the GPU with "invalid argument" (the filter matrix of
CosmoFlow conv7 asks for a grid of (1, 3, 196608)).

:func:`fit_grids` reorders the parameters of such a map (iterations of a map are
independent, so their order is free).  It tries two orders: the last parameter kept on
x (usually the contiguous one) with the largest of the others on y, and the largest
parameter on x.  For element-wise kernels (a map with its own block size, as the tiled
schedules give their tables, padding and filter matrix) it takes the order whose x
parameter fills more of the block's threads, the first on a tie: the filter-matrix map
over (n, c, kd, kh, kw) would otherwise run 3 of each block's 256 threads, along kw.
Other kernels take the first order that fits, which keeps neighbouring threads on
neighbouring elements: for the direct backward-filter map the fuller order is slower,
since each thread there reduces over long strided rows (both measured in
results/gpu/).  :func:`grid_problems` then names every
kernel whose grid is still out of range, so that the build stops with the reason here,
on the CPU, instead of at the launch on a GPU.  The grid is computed by DaCe's own code
generator function, so these rules and the launch agree.
"""

from typing import Iterator, List, Optional, Sequence, Tuple

#: The largest grid per dimension (x, y, z), from the CUDA programming guide's table of
#: technical specifications (every compute capability since 3.0).
GRID_LIMITS = (2 ** 31 - 1, 65535, 65535)


class _Probe:
    """Stands in for DaCe's CUDA code generator, whose grid arithmetic reads nothing of
    the generator's state but this recursion."""

    def get_tb_maps_recursive(self, subgraph):
        from dace.codegen.targets.cuda import CUDACodeGen
        return CUDACodeGen.get_tb_maps_recursive(self, subgraph)


def _as_int(value) -> Optional[int]:
    try:
        return int(value)
    except TypeError:  # symbolic: the build depends on a run-time size
        return None


def kernels(sdfg) -> Iterator[Tuple[object, object]]:
    """(state, map entry) of every GPU kernel: GPU_Device maps outside any GPU scope."""
    from dace import dtypes
    from dace.sdfg import nodes
    from dace.sdfg.scope import is_devicelevel_gpu

    for node, state in sdfg.all_nodes_recursive():
        if (isinstance(node, nodes.MapEntry) and node.map.schedule == dtypes.ScheduleType.GPU_Device
                and state.entry_node(node) is None
                and not is_devicelevel_gpu(state.sdfg, state, node)):
            yield state, node


def _dimensions(state, entry):
    from dace.codegen.targets.cuda import CUDACodeGen
    return CUDACodeGen.get_kernel_dimensions(_Probe(), state.scope_subgraph(entry))


def grid(state, entry) -> Optional[List[int]]:
    """The grid (x, y, z) DaCe will launch ``entry``'s kernel with, or None if symbolic."""
    values = [_as_int(d) for d in _dimensions(state, entry)[0]]
    return None if None in values else values


def x_lane_use(state, entry) -> float:
    """Share of the threads along x that get an iteration of the map's x parameter: 1.0
    where thread-block maps define the threads (one block per iteration)."""
    grid_dims, block, has_thread_maps = _dimensions(state, entry)[:3]
    size_x, gx, bx = (_as_int(v) for v in (entry.map.range.size()[-1], grid_dims[0], block[0]))
    if has_thread_maps or None in (size_x, gx, bx):
        return 1.0
    return size_x / (gx * bx)


def _fits(dims: Optional[Sequence[int]]) -> bool:
    return dims is None or all(d <= limit for d, limit in zip(dims, GRID_LIMITS))


def _reorder(entry, order: Sequence[int]) -> None:
    from dace import subsets
    mp = entry.map
    mp.params = [mp.params[i] for i in order]
    mp.range = subsets.Range([mp.range[i] for i in order])


def _orders(sizes: Sequence[int]) -> Iterator[List[int]]:
    """Parameter orders to try, last parameter (grid x) last in each list."""
    n = len(sizes)
    rest = sorted(range(n - 1), key=lambda i: sizes[i])
    yield rest + [n - 1]                       # x kept; the largest other one on y
    yield sorted(range(n), key=lambda i: sizes[i])  # the largest on x


def fit_grids(sdfg) -> List[str]:
    """Reorder the parameters of kernels whose grid is out of range; returns what moved."""
    moved = []
    for state, entry in kernels(sdfg):
        before = grid(state, entry)
        if _fits(before):
            continue
        sizes = [_as_int(s) for s in entry.map.range.size()]
        if None in sizes:
            continue
        original = list(range(len(sizes)))
        params = list(entry.map.params)
        best = None  # (x-lane use, order, grid) of the best order that fits
        for order in _orders(sizes):
            _reorder(entry, order)
            after = grid(state, entry)
            if _fits(after):
                use = x_lane_use(state, entry) if entry.map.gpu_block_size else 0.0
                if best is None or use > best[0]:
                    best = (use, order, after)
            _reorder(entry, [order.index(i) for i in original])  # undo
        if best is not None:
            _reorder(entry, best[1])
            moved.append(f"{entry.map.label}: ({', '.join(params)}) -> "
                         f"({', '.join(entry.map.params)}), grid {tuple(before)} -> {tuple(best[2])}")
    return moved


def grid_problems(sdfg) -> List[str]:
    """One line per kernel whose grid exceeds :data:`GRID_LIMITS`."""
    problems = []
    for state, entry in kernels(sdfg):
        dims = grid(state, entry)
        if not _fits(dims):
            problems.append(f"kernel {entry.map.label} ({', '.join(entry.map.params)}) would launch "
                            f"a grid of {tuple(dims)}; CUDA allows at most {GRID_LIMITS}")
    return problems
