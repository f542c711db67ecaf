"""The SDFG scaffolding of the CPU programs written in C++ (the Winograd kernels,
:mod:`~convkernels.cpu.winograd.forward`, :mod:`~convkernels.cpu.winograd.adjoint`,
:mod:`~convkernels.cpu.winograd.filter_gradient`, and the few-channel direct forward,
:mod:`~convkernels.cpu.direct.few`): the layer's arrays, parallel maps whose body is one
call into the program's C++ code, that code added with every connector a pointer, and the
text of the C++ headers it is made of."""

import os

import dace


def include(module_file: str, name: str) -> str:
    """The text of ``include/<name>`` beside the module ``module_file`` (a kernel's C++,
    included by content in its generated code, so that each build's source, and the
    cache's hash of the package's files, holds it)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(module_file)), "include", name)) as f:
        return f.read()


def layer_sdfg(name: str, layer, L, w_shape=None, dtype=dace.float32):
    """The SDFG every C++ CPU program starts from: the layer's ``x`` (NDHWC), ``w`` and
    ``y`` arrays of ``dtype`` (float32, or a 16-bit storage type), and nothing else yet."""
    from convkernels.layouts import Layout, stored_shape
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", stored_shape(Layout.NDHWC, "x", layer.input_shape), dtype)
    sdfg.add_array("w", w_shape or L.w_shape, dtype)
    sdfg.add_array("y", L.y_shape, dtype)
    return sdfg


def call_map(state, label: str, ranges, inputs, call: str, outputs) -> None:
    """A parallel CPU map whose body is one call into the program's C++ code; ``inputs``
    and ``outputs`` map each connector to the array it sees whole."""
    sdfg = state.sdfg
    def whole(conns):
        return {c: dace.Memlet.from_array(a, sdfg.arrays[a]) for c, a in conns.items()}
    state.add_mapped_tasklet(label, ranges, whole(inputs), call, whole(outputs),
                             schedule=dace.ScheduleType.CPU_Multicore,
                             language=dace.Language.CPP, external_edges=True)


def finish(sdfg, code: str, dtype=dace.float32):
    """The program's C++ code added and every connector a pointer (:func:`pointer_connectors`)."""
    sdfg.append_global_code(code)
    return pointer_connectors(sdfg, dtype)


def pointer_connectors(sdfg, dtype=dace.float32):
    """Every tasklet connector a pointer to its whole array of ``dtype`` (every array of
    the program has it), also where the array has one element (DaCe would pass that one
    as a value)."""
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.Tasklet):
            for conns in (node.in_connectors, node.out_connectors):
                for name in conns:
                    conns[name] = dace.pointer(dtype)
    return sdfg
