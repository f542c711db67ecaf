"""Building blocks shared by the implementations: layer constants, input padding and the
auto-optimize schedules.

Algorithms are written per layer with every size a Python integer
(:func:`layer_constants`), so each compiled SDFG has constant sizes.  A forward
algorithm's compute program reads the *padded* input; :func:`pad_input` turns it
into an SDFG with the harness's signature ``(x, w, y)`` by adding a zero-fill and
an interior copy in front of it, as plain maps that every target's schedule can
place.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import dace

from convbench.registry import Layer
from convbench.registry import Layout, stored_shape
from impls._fold import fold_indices


@dataclasses.dataclass(frozen=True)
class LayerSizes:
    """The sizes a generated program is written with, as plain integers (each compiled
    SDFG has constant sizes), and the stored shapes for one layout."""

    N: int    # batch
    C: int    # input channels
    K: int    # output channels
    D: int    # input depth, height, width
    H: int
    W: int
    KD: int   # kernel depth, height, width
    KH: int
    KW: int
    S: int    # Layer.stride (SD SH SW per dimension)
    P: int    # Layer.pad (PD PH PW per dimension)
    PD: int
    PH: int
    PW: int
    SD: int
    SH: int
    SW: int
    ED: int   # dilation per dimension
    EH: int
    EW: int
    G: int    # groups, with CG = C/G input and KG = K/G output channels each
    CG: int
    KG: int
    DP: int   # padded input: D + 2*PD, ...
    HP: int
    WP: int
    OD: int   # output depth, height, width
    OH: int
    OW: int
    GM: int   # the implicit GEMM's sizes
    GN: int
    GK: int
    xp_shape: Tuple[int, ...]  # padded input, filter and output as stored
    w_shape: Tuple[int, ...]
    y_shape: Tuple[int, ...]


def layer_constants(layer: Layer, layout: Layout) -> LayerSizes:
    """The :class:`LayerSizes` of ``layer``, with the stored shapes for ``layout``."""
    (pd, ph, pw), (ed, eh, ew) = layer.pads, layer.pads_end
    padded = (layer.batch, layer.in_channels, layer.in_d + pd + ed, layer.in_h + ph + eh,
              layer.in_w + pw + ew)
    return LayerSizes(
        N=layer.batch, C=layer.in_channels, K=layer.out_channels, D=layer.in_d, H=layer.in_h,
        W=layer.in_w, KD=layer.k_d, KH=layer.k_h, KW=layer.k_w, S=layer.stride, P=layer.pad,
        PD=pd, PH=ph, PW=pw, SD=layer.strides[0], SH=layer.strides[1], SW=layer.strides[2],
        ED=layer.dilations[0], EH=layer.dilations[1], EW=layer.dilations[2], G=layer.groups,
        CG=layer.in_channels // layer.groups, KG=layer.out_channels // layer.groups,
        DP=padded[2], HP=padded[3], WP=padded[4], OD=layer.out_d, OH=layer.out_h,
        OW=layer.out_w, GM=layer.gemm_m, GN=layer.gemm_n, GK=layer.gemm_k,
        xp_shape=stored_shape(layout, "x", padded),
        w_shape=stored_shape(layout, "w", layer.filter_shape),
        y_shape=stored_shape(layout, "y", layer.output_shape))


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


def auto_cpu(sdfg, layer, params):
    """CPU schedule: DaCe's auto-optimize for the CPU (OpenMP)."""
    from dace.transformation.auto.auto_optimize import auto_optimize
    auto_optimize(sdfg, dace.DeviceType.CPU)


def auto_gpu(sdfg, layer, params):
    """GPU schedule: DaCe's auto-optimize for the GPU.  The arguments live in GPU global
    memory (the harness passes torch CUDA tensors), so no host-device copies are made."""
    from dace.sdfg.validation import InvalidSDFGError
    from dace.transformation.auto.auto_optimize import auto_optimize
    try:
        auto_optimize(sdfg, dace.DeviceType.GPU, use_gpu_storage=True)
    except InvalidSDFGError as err:
        raise ValueError(f"{DACE_NESTED_PROPAGATION_BUG} (DaCe: {str(err).splitlines()[0]})") from None


#: Why some GPU builds of the auto-scheduled programs stop (batch 1 with a 3x1x5
#: kernel, for example).  The GPU transformation re-propagates
#: memlets out of nested SDFGs; when the nested SDFG's view of the input dropped one
#: unit dimension (the batch index) and kept another (a kernel extent of 1), DaCe 1.0.2
#: aligns the dimensions wrongly and the SDFG fails validation.  A known DaCe 1.x
#: defect of squeezed nested-SDFG views (spcl/dace#1739; the no-view nested SDFGs of
#: spcl/dace#1696 remove it).  The CPU schedule does not re-propagate and is unaffected.
DACE_NESTED_PROPAGATION_BUG = (
    "DaCe 1.0.2's GPU transformation mis-propagates a nested SDFG's squeezed input "
    "(spcl/dace#1739) on this layer (seen with batch 1 and a kernel extent of 1); "
    "the CPU build of this implementation, or another GPU implementation, handles it")


def program_from_source(source: str, function: str, name: str, namespace=None):
    """The ``@dace.program`` named ``function`` defined by Python ``source`` text.

    For programs whose statements are generated (unrolled) per layer.  DaCe parses a
    program from its source file, so the text is written to a module file named after
    ``name`` and a hash of the text (in ``$TMPDIR/convbench-generated``, rewritten
    atomically, shared by every process) and imported from there.  (Source that only
    :mod:`linecache` knows is not enough: DaCe 1.0.2 then misreads array shapes.)
    ``namespace``: names the text uses that have no source form (a DaCe type object),
    set in the module before its text runs.  Index expressions are folded first
    (:func:`impls._fold.fold_indices`).
    """
    import hashlib
    import importlib.util
    import os
    import re
    import tempfile
    from pathlib import Path
    source = fold_indices(source)  # the same program, cheaper for DaCe to parse
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    module = re.sub(r"[^A-Za-z0-9_]", "_", f"cb_gen_{name}_{digest}")
    folder = Path(tempfile.gettempdir()) / "convbench-generated"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    if not path.is_file() or path.read_text() != source:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(module, path)
    loaded = importlib.util.module_from_spec(spec)
    loaded.__dict__.update(namespace or {})
    spec.loader.exec_module(loaded)
    return getattr(loaded, function)
