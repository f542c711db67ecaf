"""The tasklets of the pipelined programs (:mod:`convkernels.gpu.pipeline.skeleton`, the SIMT
filter gradient's and the tensor-core kernels on its skeleton): each found by its output
connectors, given its role's C++ for the target, its connectors typed, and the generated
file the helpers of ``cp.async``."""

import dace

from convkernels.gpu.pipeline.cp_async import CPU_HELPERS, GPU_HELPERS


#: The tasklets, by their output connectors ("reduce": the filter gradient's sum of its
#: slices, :mod:`convkernels.gpu.simt.filter_gradient`).
_ROLES = {frozenset({"acco", "sto", "sbo", "ao", "bo"}): "prologue",
          frozenset({"acco", "sto", "ao", "bo"}): "step",
          frozenset({"acco", "sto", "sbs", "ao", "bo"}): "step",  # steps 64-bit state too
          frozenset({"yo"}): "epilogue",
          frozenset({"wo"}): "reduce"}


def tasklets(sdfg):
    """(role, tasklet, its state) of the tasklets of a pipelined program."""
    for node, state in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.Tasklet):
            role = _ROLES.get(frozenset(node.out_connectors))
            if role:
                yield role, node, state


#: What each tasklet calls the shared stages and its state, before its code.
_PREAMBLE = {
    "prologue": "float* As_ = reinterpret_cast<float*>(ao);\n"
                "float* Bs_ = reinterpret_cast<float*>(bo);\n",
    "step": "float* As_ = reinterpret_cast<float*>(ao);\n"
            "float* Bs_ = reinterpret_cast<float*>(bo);\n",
    "epilogue": "",
    "reduce": "",
}


def set_code(sdfg, s, gpu: bool, code) -> None:
    """Give the tasklets the C++ of the target (``code``: role -> ``f(s, gpu)``), and the
    generated file its helpers.  Every connector reads or writes a whole array: it is
    typed a pointer to the array's elements (DaCe 1.0.2 cannot infer the type of a
    connector on a reshaped view)."""
    found = set()
    for role, node, state in tasklets(sdfg):
        node.code = dace.properties.CodeBlock(_PREAMBLE[role] + code[role](s, gpu),
                                              dace.Language.CPP)
        found.add(role)
        arrays = state.parent.arrays
        for edge in state.in_edges(node):
            node.in_connectors[edge.dst_conn] = dace.pointer(arrays[edge.data.data].dtype)
        for edge in state.out_edges(node):
            node.out_connectors[edge.src_conn] = dace.pointer(arrays[edge.data.data].dtype)
    if found != set(code):
        raise ValueError(f"{sdfg.name}: tasklets {sorted(set(code) - found)} not found")
    for location in ("cuda", "frame"):
        sdfg.global_code.pop(location, None)
    sdfg.append_global_code(GPU_HELPERS if gpu else CPU_HELPERS, "cuda" if gpu else "frame")


def indent(text: str, n: int) -> str:
    """``text`` with every line indented by ``n`` spaces (C++ nested in generated code)."""
    return "\n".join(" " * n + line for line in text.splitlines())
