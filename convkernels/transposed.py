"""dL/dx of a stride-1 convolution as the forward convolution of dL/dy with the filter
flipped in space and its channel dimensions swapped (``dx[b, d, h, w, c] = sum dy[b, d +
p - t, ..., k] * w[k, t, ..., c]``; with ``t' = k - 1 - t`` that is the forward form on dL/dy
padded by ``k - 1 - p``): the transposed layer, the support rule, and the swap of the
program's roles.  Shared by the data-gradient kernels built on forward programs.
"""

from convkernels.layer import Layer


def transposed_layer(layer: Layer) -> Layer:
    """The stride-1 forward convolution whose output is dL/dx of ``layer``: a new layer of
    ``layer``'s own class (the harness's layer model, constructed with its positional
    sizes and keyword paddings)."""
    pd, ph, pw = layer.pads
    return type(layer)(f"{layer.name}_bwd_data", layer.batch, layer.out_channels,
                       layer.in_channels, layer.out_d, layer.out_h, layer.out_w, layer.k_d,
                       layer.k_h, layer.k_w, stride=1, pad=0, pad_d=layer.k_d - 1 - pd,
                       pad_h=layer.k_h - 1 - ph, pad_w=layer.k_w - 1 - pw)


def supports(layer, params):
    if layer.stride != 1:
        return f"stride {layer.stride}: only stride 1 is a flipped forward convolution"
    if any(p > k - 1 for p, k in zip(layer.pads, (layer.k_d, layer.k_h, layer.k_w))):
        return "padding larger than kernel - 1"
    return None


def swap_roles(sdfg):
    """The forward program reads its input as x and writes y; the harness passes dL/dy
    as y and takes dL/dx from x."""
    for old, new in (("x", "__dy"), ("y", "x"), ("__dy", "y")):
        sdfg.replace(old, new)
    return sdfg
