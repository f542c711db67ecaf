"""The tiles of Winograd F(m^3, 3^3): the filter's edge ``R``, the shipped output tile edge
:data:`M_OUT`, the tiles per dimension and in all, and the layers it cannot compute
(:func:`refusal`)."""

R = 3


#: The output tile edge of each shipped variant.
M_OUT = 2


def refusal(layer, m: int = M_OUT, algorithm: str = ""):
    """Why F(m^3, 3^3) (or ``algorithm``, by name) does not compute ``layer`` ("" where
    it does)."""
    if (layer.k_d, layer.k_h, layer.k_w) != (R, R, R):
        return (f"kernel {layer.k_d}x{layer.k_h}x{layer.k_w}: {algorithm or f'F({m}^3, 3^3)'} "
                "needs 3x3x3")
    if any(s != 1 for s in layer.strides):
        return f"stride {layer.strides}: Winograd tiles need stride 1"
    if any(d != 1 for d in layer.dilations):
        return f"dilation {layer.dilations}: Winograd tiles need dilation 1"
    if layer.groups != 1:
        return f"groups {layer.groups}: one GEMM per transform point needs groups 1"
    return ""


def tiles(size: int, m: int = M_OUT) -> int:
    """Output tiles along a dimension of ``size`` outputs (the last one cut short where
    ``m`` does not divide ``size``: its input beyond the padded array reads as zero, its
    output beyond ``size`` is not stored)."""
    return -(-size // m)


def tile_count(L, m: int = M_OUT) -> int:
    return L.N * tiles(L.OD, m) * tiles(L.OH, m) * tiles(L.OW, m)
