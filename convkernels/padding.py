"""The padded input: a forward algorithm's compute program reads the *padded* input;
:func:`pad_input` turns it into an SDFG with the harness's signature ``(x, w, y)`` by
adding a zero-fill and an interior copy in front of it, as plain maps that every
target's schedule can place.  And transients allocated once per loaded program
(:func:`persistent_buffers`).
"""

from __future__ import annotations

import dace

from convkernels.layer import Layer
from convkernels.layouts import Layout, stored_shape


def pad_input(program, layer: Layer, layout: Layout, halo: bool = False, storage=None):
    """:func:`pad_sdfg` of ``program``'s SDFG."""
    return pad_sdfg(program.to_sdfg(simplify=True), layer, layout, halo, storage)


def pad_sdfg(sdfg, layer: Layer, layout: Layout, halo: bool = False, storage=None):
    """``sdfg(x=padded input, w, y)`` made to take the unpadded ``x``.

    Without padding ``sdfg`` is returned as it is.  Otherwise its ``x`` becomes the
    transient ``xp``, and states before the computation zero ``xp`` and copy the new
    input ``x`` into its interior.  ``halo``: zero only the border (one slab below and
    one above the interior per padded dimension, see :func:`halo_slabs`) instead of the
    whole array, so the padded input is written once per call rather than about twice.
    (Not for the programs that go through DaCe's auto-optimize: its stencil tiling fails
    on the slab maps.)  ``storage`` (a 16-bit typeclass): the new ``x`` is stored in it
    while the program's ``x`` is float32, so the copy widens each input value once per
    call, padded or not, and the kernel reads floats.
    """
    if not any(layer.pads + layer.pads_end) and storage is None:
        return sdfg
    padded = sdfg.arrays["x"]
    sdfg.replace("x", "xp")
    padded.transient = True
    shape = stored_shape(layout, "x", layer.input_shape)
    spatial = (2, 3, 4) if layout == Layout.NCDHW else (1, 2, 3)
    sdfg.add_array("x", shape, storage or padded.dtype, storage=padded.storage)
    idx = [f"i{d}" for d in range(5)]
    zero = sdfg.add_state_before(sdfg.start_state, "pad_zero")
    boxes = (halo_slabs(padded.shape, shape, spatial, layer.pads) if halo
             else [[f"0:{s}" for s in padded.shape]]) if any(layer.pads + layer.pads_end) else []
    for n, ranges in enumerate(boxes):
        zero.add_mapped_tasklet(
            f"pad_zero_{n}", dict(zip(idx, ranges)), {}, "out = 0",
            {"out": dace.Memlet(f"xp[{','.join(idx)}]")}, external_edges=True)
    copy = sdfg.add_state_after(zero, "pad_copy")
    pads = dict(zip(spatial, layer.pads))
    dst = [f"{i} + {pads[d]}" if d in spatial else i for d, i in enumerate(idx)]
    copy.add_mapped_tasklet(
        "pad_copy", {i: f"0:{s}" for i, s in zip(idx, shape)},
        {"inp": dace.Memlet(f"x[{','.join(idx)}]")}, "out = inp",
        {"out": dace.Memlet(f"xp[{','.join(dst)}]")}, external_edges=True)
    return sdfg


def halo_slabs(padded_shape, shape, spatial, pads):
    """The border of a padded array as disjoint boxes (``"lo:hi"`` per dimension): per
    padded spatial dimension in turn, the slab below and the slab above the interior
    (``pads``: the front padding; the back's is what the padded size leaves),
    spanning the interior of the dimensions before it and all of those after it.
    Together with the interior they cover the array exactly once."""
    slabs = []
    for n, (dim, pad) in enumerate(zip(spatial, pads)):
        for lo, hi in ((0, pad), (pad + shape[dim], padded_shape[dim])):
            if hi <= lo:  # no padding at this end (the other may have some)
                continue
            ranges = []
            for d, size in enumerate(padded_shape):
                if d == dim:
                    ranges.append(f"{lo}:{hi}")
                elif d in spatial[:n]:
                    p = pads[spatial.index(d)]
                    ranges.append(f"{p}:{p + shape[d]}")
                else:
                    ranges.append(f"0:{size}")
            slabs.append(ranges)
    return slabs


def persistent_buffers(sdfg):
    """Allocate each top-level transient array that lives outside every map (the padded
    input ``xp``, a packed filter, partial sums) once per loaded program instead of on
    every call: fresh memory costs a page fault per 4 KiB on its first touch (for the
    80 MB padded input of CosmoFlow's conv2 backward-data pass at batch 2, a few ms per
    call).  Only correct for buffers that every call writes before it reads them, which
    is how the generated programs use them; the arrays a map defines per tile (its
    accumulators) stay per-thread."""
    scoped = set()
    for state in sdfg.states():
        for node in state.data_nodes():
            if state.entry_node(node) is not None:
                scoped.add(node.data)
    for name, desc in sdfg.arrays.items():
        if (desc.transient and name not in scoped and isinstance(desc, dace.data.Array)
                and not isinstance(desc, dace.data.View)):
            desc.lifetime = dace.AllocationLifetime.Persistent
