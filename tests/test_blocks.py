"""The fused block epilogue (``convkernels.blocks.epilogue``, ``convbench.network.blocks``):
bias, LeakyReLU and 2x2x2 max-pool after a convolution, and their gradients, against
torch's unfused block in float64; plants in the generated code fail the check."""

import pytest

from convbench.layersets.layer import Layer
from convbench.network import blocks
from convkernels.blocks import epilogue

#: Output 6 x 4 x 8 (even: a 2x2x2 pool fits), 8 channels; and an odd one without a pool.
POOLED = Layer("block_pooled", 2, 3, 8, 6, 4, 8, 3, 3, 3, pad=1)
UNPOOLED = Layer("block_unpooled", 2, 3, 5, 5, 3, 7, 3, 3, 3, pad=1)
#: One pooled pixel (a 2^3 output): with one channel a map point (KB=1) every row is a
#: single element, which DaCe would make a scalar.
TINY = Layer("block_tiny", 1, 2, 3, 2, 2, 2, 3, 3, 3, pad=1)


class _Exp:
    """What :class:`blocks.Epilogue` reads of an experiment."""

    def __init__(self, cachedir):
        from convbench.build.precision import get_dtype
        self.dtype, self.device, self.cachedir, self.policy = (
            get_dtype("float32"), "cpu", cachedir, "reuse")


def _torch_block(y, b, pool: bool, g_seed: int = 7):
    """torch's unfused block in float64 on ``y`` (float32 values): its output, and the
    gradients of y and b for a random output gradient."""
    import torch
    import torch.nn.functional as F
    y64 = y.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    a = F.leaky_relu(y64 + b64.view(1, -1, 1, 1, 1), epilogue.SLOPE)
    out = F.max_pool3d(a, 2) if pool else a
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(g_seed),
                    dtype=torch.float64)
    out.backward(g)
    return out.detach(), g, y64.grad, b64.grad


def _run(layer, pool, cachedir, device="cpu"):
    import torch
    exp = _Exp(cachedir)
    exp.device = device
    ep = blocks.Epilogue(layer, pool, exp)
    gen = torch.Generator().manual_seed(3)
    y = torch.randn(layer.output_shape, generator=gen).to(
        memory_format=torch.channels_last_3d)
    b = torch.randn(layer.out_channels, generator=gen)
    ref, g64, gy_ref, db_ref = _torch_block(y, b, pool)
    on = "cuda" if device == "gpu" else "cpu"
    out, idx = ep.forward(y.to(on), b.to(on))
    gy, db = ep.backward(g64.float().to(on), out, idx)
    return out.cpu(), ref, gy.cpu(), gy_ref, db.cpu(), db_ref, g64


@pytest.mark.parametrize("layer, pool", [(POOLED, True), (POOLED, False), (UNPOOLED, False)],
                         ids=["pooled", "unpooled-even", "unpooled-odd"])
def test_the_fused_block_is_torchs(layer, pool, tmp_path, device="cpu"):
    """Output within 3 float32 roundoffs of torch float64's, the output gradient within
    3 roundoffs of torch's (the window's maximum gets it, the others none), the bias
    gradient within the sum's bound."""
    import torch
    out, ref, gy, gy_ref, db, db_ref, g64 = _run(layer, pool, tmp_path, device)
    u = 2.0 ** -24
    assert out.shape == ref.shape
    assert bool(((out.double() - ref).abs() <= 3 * u * ref.abs()).all())
    assert bool(((gy.double() - gy_ref).abs() <= 3 * u * gy_ref.abs()).all())
    if pool:  # exactly one gradient per window: the others are zeros, as torch's
        assert int((gy != 0).sum()) == int((gy_ref != 0).sum()) == g64.numel()
    n = g64.numel() // g64.shape[1]
    bound = 3 * n ** 0.5 * u * g64.abs().sum((0, 2, 3, 4))
    assert bool(((db.double() - db_ref).abs() <= bound).all())
    assert torch.isfinite(gy).all() and torch.isfinite(db).all()


#: Both CosmoFlow sets and the model each belongs to (which of its blocks pool).
SETS = {"cosmoflow": "v1", "cosmoflow_mlperf": "mlperf"}


@pytest.mark.full
@pytest.mark.parametrize("layer_set", sorted(SETS))
def test_every_cosmoflow_block_fuses_as_torch(layer_set, tmp_path):
    """Every layer of both sets at batch 1 (at full size: v1 conv1's output is 16 x 128^3),
    pooled as its model pools it."""
    from convbench.layersets.sets import load_layers
    from convbench.network.cosmoflow import MODELS
    pools = MODELS[SETS[layer_set]].pools
    for i, layer in enumerate(load_layers(layer_set)):
        test_the_fused_block_is_torchs(layer.with_batch(1), i < pools, tmp_path)


def test_the_window_holds_one_pool_each():
    offsets = epilogue.window_offsets(POOLED, 2)
    K, H, W = POOLED.out_channels, POOLED.out_h, POOLED.out_w
    assert offsets == sorted(offsets) and len(set(offsets)) == 8
    assert offsets[1] == K and offsets[2] == W * K and offsets[4] == H * W * K


def test_odd_sizes_refuse_a_pool():
    with pytest.raises(ValueError, match="even output sizes"):
        epilogue.forward(UNPOOLED, None, {"POOL": 2})


def test_only_float32_on_ndhwc_fuses():
    from convbench import registry
    ndhwc, ncdhw = registry.get("directConvNDHWCblocked"), registry.get("directConvNCDHW")
    pipelined = registry.get("implicitGemmPipelined")
    assert blocks.fusable(ndhwc, "cpu", "float32") is None
    assert blocks.fusable(pipelined, "gpu", "float32") is None
    assert "NCDHW" in blocks.fusable(ncdhw, "cpu", "float32")
    assert "float32" in blocks.fusable(ndhwc, "cpu", "bfloat16")


@pytest.mark.parametrize("kb, layer", [(1, POOLED), (4, POOLED), (1, TINY)],
                         ids=["KB1", "KB4", "KB1-one-pixel"])
def test_channel_blocks_give_the_same_block(kb, layer, tmp_path, monkeypatch):
    """The GPU's decomposition (a map point per channel, KB=1) and a block of 4, run on
    the CPU: the same results as one point per row; also where a row is one pooled
    pixel of one channel."""
    monkeypatch.setattr(blocks, "epilogue_params",
                        lambda pool, device: {"POOL": 2 if pool else 1, "KB": kb})
    test_the_fused_block_is_torchs(layer, True, tmp_path)


def test_the_gpu_schedule_wants_a_thread_per_channel():
    sdfg = epilogue.forward(POOLED, None, {"POOL": 2, "KB": 0})
    with pytest.raises(ValueError, match="KB=1"):
        epilogue.gpu_schedule(sdfg, POOLED, {"POOL": 2, "KB": 0})


def test_torch_indices_name_the_window_maxima():
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(5)
    y = torch.randn(2, 3, 4, 6, 8, generator=gen)
    want, idx_t = F.max_pool3d(y, 2, return_indices=True)
    # the window positions (4a + 2b + c) of torch's indices, stored NDHWC
    d, rem = idx_t // (6 * 8), idx_t % (6 * 8)
    h, w = rem // 8, rem % 8
    local = ((d % 2) * 4 + (h % 2) * 2 + (w % 2)).to(torch.uint8)
    stored = local.permute(0, 2, 3, 4, 1).contiguous()
    assert torch.equal(blocks.torch_indices(stored, 6, 8), idx_t)


@pytest.mark.gpu
@pytest.mark.parametrize("layer, pool", [(POOLED, True), (UNPOOLED, False)],
                         ids=["pooled", "unpooled-odd"])
def test_the_fused_block_on_the_gpu(layer, pool, tmp_path):
    """The GPU schedule (a thread per row and channel) against torch float64."""
    test_the_fused_block_is_torchs(layer, pool, tmp_path, device="gpu")
