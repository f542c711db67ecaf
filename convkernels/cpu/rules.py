"""Where the CPU kernels should win without a measurement: the rules
(:class:`convkernels.declarations.Rule`) that choose an implementation per layer and pass on a
machine with no stored winner (docs/tuning.md, "Choice by rule").

They come from the winners ``bench_cpu.py --store`` measured on the tuned machines
(``tuning/cpu.json``) and from the end-to-end runs of results/cpu/: Winograd F(2^3, 3^3)
does 3.4x fewer multiplications than the direct sum for a 3x3x3 stride-1 filter, and beats
the register-blocked direct kernels wherever its per-point GEMMs have channels to fill a
vector (16 or more in and out; for the data gradient, 16 or more to sum over) and the layer
has more than one tile per dimension and sample.  Its filter gradient sums each transform
point over every tile of the layer in one accumulator block: past 32^3 outputs per sample
the direct kernel's slices win. The direct kernels serve every other layer they support (few
channels, strides, other
filter sizes)."""

from convkernels.declarations import Rule

#: Channels in and out from which Winograd's GEMMs fill the vectors.
WINOGRAD_CHANNELS = 16
#: Input channels from which Winograd's data gradient wins (it won at 4, lost at 1).
WINOGRAD_DATA_CHANNELS = 4
#: Outputs per dimension from which a layer has at least two F(2) tiles along each.
WINOGRAD_OUTPUTS = 4
#: Outputs per sample up to which Winograd's filter gradient beats the direct one.
WINOGRAD_FILTER_VOXELS = 32 ** 3


def _winograd_layer(layer) -> bool:
    return (min(layer.in_channels // layer.groups, layer.out_channels) >= WINOGRAD_CHANNELS
            and min(layer.out_d, layer.out_h, layer.out_w) >= WINOGRAD_OUTPUTS)


WINOGRAD = Rule(
    "winograd-3x3x3",
    f"3x3x3 stride-1 layers (those Winograd supports) with at least {WINOGRAD_CHANNELS} "
    f"channels in and out and at least {WINOGRAD_OUTPUTS} outputs along each dimension",
    _winograd_layer, rank=2)

WINOGRAD_DATA = Rule(
    "winograd-3x3x3-data",
    f"3x3x3 stride-1 layers (those Winograd supports) whose data gradient sums over at "
    f"least {WINOGRAD_CHANNELS} output channels into at least {WINOGRAD_DATA_CHANNELS} input "
    f"channels, with at least {WINOGRAD_OUTPUTS} outputs along each dimension",
    lambda layer: (layer.out_channels // layer.groups >= WINOGRAD_CHANNELS
                   and layer.in_channels // layer.groups >= WINOGRAD_DATA_CHANNELS
                   and min(layer.out_d, layer.out_h, layer.out_w) >= WINOGRAD_OUTPUTS),
    rank=2)

WINOGRAD_FILTER = Rule(
    "winograd-3x3x3-filter",
    f"as winograd-3x3x3, with at most {WINOGRAD_FILTER_VOXELS} outputs per sample (32^3)",
    lambda layer: (_winograd_layer(layer)
                   and layer.out_d * layer.out_h * layer.out_w <= WINOGRAD_FILTER_VOXELS),
    rank=2)

DIRECT = Rule(
    "direct-blocked",
    "every layer it supports (few channels, strides, other filters): the CPU's general "
    "register-blocked kernel",
    lambda layer: True, rank=1)

#: Input channels up to which the few-channel forward kernel is chosen.
FEW_CHANNELS = 8

FEW = Rule(
    "few-channels",
    f"forward layers with at most {FEW_CHANNELS} input channels (CosmoFlow's conv1): the "
    "reduction per pixel is short and the output dominates, which the few-channel kernel's "
    "written-out reduction and streamed stores serve",
    lambda layer: layer.in_channels // layer.groups <= FEW_CHANNELS, rank=2)

#: Channels per AMX tile chunk: the tile kernels need multiples of it in and out.
AMX_CHANNELS = 32


def _amx_layer(layer) -> bool:
    return (layer.in_channels % AMX_CHANNELS == 0 and layer.out_channels % AMX_CHANNELS == 0
            and layer.stride == 1 and layer.groups == 1)


AMX = Rule(
    "amx-bf16",
    f"bfloat16 on CPUs with AMX-BF16: stride-1 layers with multiples of {AMX_CHANNELS} "
    "channels in and out (the tile kernels refuse other CPUs and precisions)",
    _amx_layer, rank=3)
