"""Precisions (convbench.build.precision): the 16-bit storage types convert exactly as IEEE and
torch do, the tolerance follows the precision, a kernel that sums in 16 bits fails, and
the flags refuse what does not exist with one line.

The sweep over both CosmoFlow sets and the ALCF set is in the full tier
(``test_precision_sweep``).
"""

import math
import subprocess
import sys

import dace
import numpy as np
import pytest
import torch

from cases import Case, case_params, cosmoflow, verify_case
from convbench.build import precision, toolchain
from convbench.check import verify
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers
from convkernels.layouts import Layout
from convbench.registry import ALL_PRECISIONS, Implementation
from convkernels.cpu.isa import has_feature
from convkernels.cpu.direct import bf16_dot
from convkernels.gpu.mma import layout as mma_layout
from convkernels.auto.schedules import auto_cpu
from convkernels.layer import layer_constants
from convkernels.padding import pad_input

HALF = ("float16", "bfloat16")
#: A reduction of 16 * 27 = 432 terms: summing it in 16 bits loses about sqrt(L / 3)
#: times the final rounding (see test_half_accumulator_fails).
LAYER = Layer("acc432", 1, 16, 5, 6, 5, 7, 3, 3, 3, pad=1)


# -- the precisions --------------------------------------------------------------------------

def test_flags_resolve_and_refuse():
    assert precision.get_dtype("float32") is precision.DTYPES["float32"]
    assert precision.get_dtype("float32", "tf32").label == "float32-tf32"
    for name, math_mode, flag in (("float8", None, "--dtype"), ("float16", "tf32", "--math"),
                                  ("float32", "fp8", "--math")):
        with pytest.raises(UsageError, match=flag):
            precision.get_dtype(name, math_mode)


def test_rounding_per_precision():
    f32, f16, bf16 = (precision.get_dtype(n) for n in ("float32", "float16", "bfloat16"))
    assert f32.rounding == precision.Rounding(accumulate=2.0 ** -24)
    assert f16.rounding.accumulate == bf16.rounding.accumulate == 2.0 ** -24
    assert (f16.rounding.output, bf16.rounding.output) == (2.0 ** -11, 2.0 ** -8)
    assert precision.get_dtype("float32", "tf32").rounding.operands == 2.0 ** -11


def test_float32_cache_keys_unchanged():
    """float32 keys carry no precision fields (builds cached before precisions stay
    valid); a 16-bit build's key names the header that defines its types."""
    from convbench import registry
    impl = registry.get("directConvNCDHW")
    key32 = toolchain.make_spec(impl, LAYER).key()
    assert set(key32) == {"impl", "layer", "dtype", "target", "params"}
    key16 = toolchain.make_spec(impl, LAYER, "float16").key()
    assert key16["halfprec"] == precision.header_digest() and key16["dtype"] == "float16"


def test_float32_only_implementation_refuses():
    from convbench import registry
    with pytest.raises(UsageError, match="float32"):
        toolchain.make_spec(registry.get("directConvNDHWCdot"), LAYER, "bfloat16")


# -- the C++ storage types -------------------------------------------------------------------

_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "HEADER"
int main(int argc, char** argv) {
    // every float16 bit pattern to float, and floats (bits on stdin) to both formats
    for (unsigned h = 0; h < 65536; ++h) {
        float f = cb_half_to_float((uint16_t)h);
        printf("%08x\n", cb_bits_from_float(f));
    }
    unsigned u;
    while (scanf("%x", &u) == 1) {
        float f = cb_float_from_bits(u);
        printf("%04x %04x\n", cb_half(f).bits, cb_bfloat16(f).bits);
    }
    return 0;
}
"""


@np.errstate(invalid="ignore", over="ignore")
def _probe_floats(n=200_000):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    # values near float16's and bfloat16's rounding boundaries, ties and edges
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    spacing = np.abs(halves.astype(np.float64)) * 2.0 ** -11
    extra = np.concatenate([halves, (halves + spacing).astype(np.float32),
                            (halves - spacing).astype(np.float32),
                            np.array([65504, 65519.99, 65520, 6e-8, 3e-8, 2.9e-8, 1e-45],
                                     np.float32)])
    return np.concatenate([bits.view(np.float32), extra])


@pytest.mark.parametrize("f16c", [True, False], ids=["f16c-or-native", "portable"])
def test_storage_types_round_to_nearest_even(tmp_path, f16c):
    """halfprec.h against numpy (float16) and torch (bfloat16), on random bit patterns
    and on the points halfway between 16-bit numbers, with and without F16C."""
    src = tmp_path / "probe.cpp"
    src.write_text(_PROGRAM.replace("HEADER", str(precision.HEADER)))
    exe = tmp_path / "probe"
    flags = ["-march=native"] if f16c else ["-mno-f16c"]
    subprocess.run(["c++", "-O2", *flags, str(src), "-o", str(exe)], check=True)
    floats = _probe_floats()
    text = "\n".join(f"{b:08x}" for b in floats.view(np.uint32)) + "\n"
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    decoded = np.array([int(v, 16) for v in out[:65536]], np.uint32).view(np.float32)
    want = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    same = (decoded.view(np.uint32) == want.view(np.uint32)) | (np.isnan(decoded) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} float16 patterns decode wrongly"
    pairs = [line.split() for line in out[65536:] if line]
    h = np.array([int(a, 16) for a, _ in pairs], np.uint16)
    b = np.array([int(c, 16) for _, c in pairs], np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        want_h = floats.astype(np.float16).view(np.uint16)
    want_b = torch.from_numpy(floats.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(floats)
    assert (h[~nan] == want_h[~nan]).all(), "float16 rounding differs from numpy's"
    assert (b[~nan] == want_b[~nan]).all(), "bfloat16 rounding differs from torch's"
    assert np.isnan(h[nan].view(np.float16)).all()
    assert all((v & 0x7f80) == 0x7f80 and (v & 0x7f) for v in b[nan])


# -- verification --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
def test_inputs_are_rounded_to_storage(dtype):
    inputs = verify.make_inputs(LAYER, "fwd", seed=3, dtype=dtype)
    assert all(v.dtype == getattr(torch, dtype) for v in inputs.values())
    wide = verify.make_inputs(LAYER, "fwd", seed=3)
    assert torch.equal(inputs["x"], wide["x"].to(getattr(torch, dtype)))  # same draw


@pytest.mark.parametrize("dtype", HALF)
def test_tolerance_of_a_rounded_store(dtype):
    """The float64 truth rounded once to the storage type passes, as a correct kernel
    that sums in float32 does; that result with 1% of one element's terms lost fails."""
    truth = verify.make_truth(LAYER, seed=2, dtype=dtype)
    dt = precision.get_dtype(dtype)
    stored = truth.ref.to(dt.torch)
    check = verify.compare(stored, truth, dt)
    assert check.ok and check.worst_ratio > 0.3, check.summary()  # the store's rounding
    assert not verify.compare(stored, truth, dt.unit_roundoff).ok  # float32's tolerance
    wrong = truth.ref.clone()
    wrong[0, 0, 2, 2, 2] *= 1.05
    assert not verify.compare(wrong.to(dt.torch), truth, dt).ok


def _half_accumulator(L, dt):
    """directConvNCDHW's kernel with its accumulator in the storage type: every partial
    sum is rounded to 16 bits (the products are still exact, widened first)."""
    N, C, K, KD, KH, KW, S, OD, OH, OW = L.N, L.C, L.K, L.KD, L.KH, L.KW, L.S, L.OD, L.OH, L.OW

    @dace.program
    def conv(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape]):
        for n, k, od, oh, ow in dace.map[0:N, 0:K, 0:OD, 0:OH, 0:OW]:
            acc = np.zeros([1], dtype=dt)
            for c in range(C):
                for kd in range(KD):
                    for kh in range(KH):
                        for kw in range(KW):
                            acc[0] = acc[0] + (dace.float32(x[n, c, od * S + kd, oh * S + kh,
                                                              ow * S + kw])
                                               * dace.float32(w[k, c, kd, kh, kw]))
            y[n, k, od, oh, ow] = acc[0]
    return conv


PLANTED = Implementation(
    name="planted_half_accumulator", summary="planted bug: sums in the storage type",
    layout="NCDHW", pass_="fwd", schedules={"cpu": auto_cpu}, precisions=ALL_PRECISIONS,
    algorithm=lambda layer, dtype, params: pad_input(
        _half_accumulator(layer_constants(layer, Layout.NCDHW), dtype.dace), layer,
        Layout.NCDHW))


@pytest.mark.parametrize("dtype", [pytest.param("float16"),
                                   pytest.param("bfloat16", marks=pytest.mark.full)])
def test_half_accumulator_fails(dtype, builds, reference):
    """A kernel that claims float32 sums but keeps its partial sums in 16 bits fails:
    its error grows with the reduction (about sqrt(L / 3) final roundings here), while
    the tolerance allows one final rounding and float32's share of the sums."""
    spec = toolchain.make_spec(PLANTED, LAYER, dtype, planted="half_accumulator")
    check = verify.verify_build(builds(spec), reference(LAYER, dtype=dtype))[0]
    assert not check.ok and check.worst_ratio > 3, check.summary()


@pytest.mark.parametrize("case", case_params(
    [Case("directConvNCDHW", LAYER, "precision", dtype="float16")],
    [Case("directConvNCDHW", LAYER, "precision", dtype="bfloat16")]), ids=lambda c: c.id)
def test_correct_kernel_passes(case, builds, reference, coverage):
    """The kernel the bug is planted in, summing in float32, passes."""
    verify_case(case, builds, reference, coverage)


# -- the command line ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--dtype", "float8"], "--dtype: unknown precision 'float8'"),
    (["--dtype", "bfloat16", "--math", "tf32"], "--math tf32 applies to --dtype float32 only"),
    (["--math", "tf32", "--device", "cpu"], "--math tf32: the CPU has no TF32 arithmetic"),
    (["--dtype", "float16", "--implementation", "directConvNDHWCdot"],
     "--dtype float16: directConvNDHWCdot has no float16 version"),
])
def test_cli_refuses_with_one_line(args, message):
    run = subprocess.run([sys.executable, "profile_conv3d.py", "--verify", "--currlayer", "6",
                          *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], run.stderr


# -- the sweep (full tier) -----------------------------------------------------------------------

#: Two or more implementations per pass that sum in float32 from 16-bit storage.
SWEEP_IMPLS = ("directConvNCDHW", "implicitGemmNCDHW", "directConvNDHWCblocked",
               "directConvNCDHWBwdData", "implicitGemmBwdData", "directConvNDHWCblockedBwdData",
               "directConvNCDHWBwdFilter", "implicitGemmBwdFilter",
               "implicitGemmsplitKBwdFilter", "directConvNDHWCblockedBwdFilter")


def _sweep_layers():
    alcf = [("alcf_conv2d", layer.with_batch(1)) for layer in load_layers("alcf_conv2d")]
    return cosmoflow(batches=(1,)) + alcf


SWEEP = [Case(name, layer, layer_set, dtype=dtype) for dtype in HALF
         for layer_set, layer in _sweep_layers() for name in SWEEP_IMPLS]
#: The ALCF conv2d set in float32 too: the set in all three precisions and passes.
SWEEP += [Case(name, layer, layer_set, dtype="float32") for layer_set, layer in _sweep_layers()
          if layer_set == "alcf_conv2d" for name in SWEEP_IMPLS]


@pytest.mark.parametrize("case", case_params([], SWEEP))
def test_precision_sweep(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


#: The tensor-core kernels (mma.sync and wgmma) in each of their precisions on both
#: CosmoFlow sets (batch 1; layers over their CPU budget are deferred to the GPU campaign,
#: which verifies them).
MMA_IMPLS = ("implicitGemmMMA", "implicitGemmMMABwdData", "implicitGemmMMABwdFilter",
             "implicitGemmWGMMA", "implicitGemmWGMMABwdData", "implicitGemmWGMMABwdFilter")
MMA_SWEEP = [Case(name, layer, layer_set, dtype=dtype) for name in MMA_IMPLS
             for dtype in ("float16", "bfloat16", "float32-tf32")
             for layer_set, layer in cosmoflow(batches=(1,))]


@pytest.mark.parametrize("case", case_params([], MMA_SWEEP))
def test_mma_sweep(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)


# -- the tensor-core kernels' emulation ------------------------------------------------------------

#: 6 input channels: taps packed into K tiles (``convkernels.gpu.mma.tiles.Shape.packed``; 4-byte copies,
#: each its own tap, the flat reduction's tail zero-filled), 40 output channels (a column
#: tail), stride 2 and padding 2.
MMA_LAYER = Layer("mma", 2, 6, 40, 6, 7, 5, 3, 3, 3, stride=2, pad=2)
#: 20 input channels: a K tile per tap (8-byte copies, the channels' tail zero-filled).
MMA_DEEP_LAYER = Layer("mma_deep", 2, 20, 40, 5, 6, 5, 3, 3, 3, pad=1)
#: A stride-1 layer for the data gradient: 6 reduction channels, 24 output channels
#: (three 16-byte chunks of the N-major filter in 16 bits, a column tail).
MMA_BWD_LAYER = Layer("mma_bwd", 2, 24, 6, 6, 7, 5, 3, 3, 3, pad=1)

#: The filter gradient: 6 channels (a chunk spans taps: 4-byte copies, each its own tap),
#: 40 output channels (tails), 5-pixel output rows (a K tile part-filled), stride 2.
MMA_WGRAD_LAYER = Layer("mma_wgrad", 2, 6, 40, 6, 7, 9, 3, 3, 3, stride=2, pad=1)
#: The layer and the pass of each case's key.
MMA_LAYERS = {"fwd": (MMA_LAYER, "fwd"), "fwd_deep": (MMA_DEEP_LAYER, "fwd"),
              "bwd_data": (MMA_BWD_LAYER, "bwd_data"),
              "bwd_filter": (MMA_WGRAD_LAYER, "bwd_filter")}

MMA_CASES = [("implicitGemmMMA", "float16", "fwd"), ("implicitGemmMMA", "float32-tf32", "fwd"),
             ("implicitGemmMMA", "float16", "fwd_deep"),
             ("implicitGemmMMABwdData", "bfloat16", "bwd_data"),
             ("implicitGemmMMABwdFilter", "float16", "bwd_filter"),
             ("implicitGemmMMABwdFilter", "float32-tf32", "bwd_filter")]
MMA_FULL = [("implicitGemmMMA", "bfloat16", "fwd"),
            ("implicitGemmMMA", "float32-tf32", "fwd_deep"),
            ("implicitGemmMMABwdData", "float16", "bwd_data"),
            ("implicitGemmMMABwdData", "float32-tf32", "bwd_data"),
            ("implicitGemmMMABwdFilter", "bfloat16", "bwd_filter")]

_ORIGINAL = {f: getattr(mma_layout, f) for f in ("a_address", "b_address")}


def _unswizzle(right):
    wrong = right.replace(" ^ ", " + 0 * ", 1)
    assert wrong != right
    return wrong


def _unswizzled_a(s):
    """A's fragments read where an unswizzled layout would put them (the copies still
    write the swizzled one); in TF32's blocked layout, where plain N-major rows would."""
    if s.a_mode == "lds":
        return (f"((kk * 8 + (ln & 3) + (j >> 1) * 4) * {s.TM} + wm * {s.WM} + fm * 16 "
                f"+ (ln >> 2) + (j & 1) * 8) * 4")
    return _unswizzle(_ORIGINAL["a_address"](s))


def _swapped_b_matrices(s):
    """B's ldmatrix.x4 with its second and third matrices exchanged: registers b1 of the
    first tile and b0 of the second come from each other's rows."""
    right = _ORIGINAL["b_address"](s)
    if s.b_mode == "lds":  # registers 1 and 2: rows t + 4 of tile 2 fp, rows t of the next
        swapped = right.replace("(j & 1)", "@").replace("(j >> 1)", "(j & 1)").replace(
            "@", "(j >> 1)")
    elif s.b_mode == "trans":
        swapped = right.replace("((ln >> 3) & 1) * 8", "(ln >> 4) * 8", 1).replace(
            "fp * 16 + (ln >> 4) * 8", "fp * 16 + ((ln >> 3) & 1) * 8", 1)
    else:
        swapped = right.replace("(ln >> 4) * 8", "((ln >> 3) & 1) * 8", 1).replace(
            "kk * 2 + ((ln >> 3) & 1)", "kk * 2 + (ln >> 4)", 1)
    assert swapped != right
    return swapped


#: Each plant, by the functions it replaces.
MMA_PLANTS = {"unswizzled_a": {"a_address": _unswizzled_a},
              "swapped_b_matrices": {"b_address": _swapped_b_matrices}}


@pytest.mark.parametrize("name, dtype, key", [pytest.param(*c, id="-".join(c))
                                              for c in MMA_CASES]
                         + [pytest.param(*c, id="-".join(c), marks=pytest.mark.full)
                            for c in MMA_FULL])
def test_mma_emulation_checks_layout_and_fragments(name, dtype, key, builds, reference,
                                                   monkeypatch):
    """The tensor-core kernels verify in their CPU emulation (ldmatrix and mma.sync lane by
    lane; TF32 operands truncated as the tensor cores read float32 registers); with A read
    unswizzled, or B's fragments in the wrong registers (the N-major ``.trans`` paths of
    the 16-bit gradients too), they fail."""
    from convbench import registry
    impl = registry.get(name)
    layer, pass_ = MMA_LAYERS[key]
    truth = reference(layer, pass_=pass_, dtype=dtype)
    good = verify.verify_build(builds(toolchain.make_spec(impl, layer, dtype)), truth)[0]
    assert good.ok, good.summary()
    for plant, functions in MMA_PLANTS.items():
        for function, planted in functions.items():
            monkeypatch.setattr(mma_layout, function, planted)
        spec = toolchain.make_spec(impl, layer, dtype, planted=f"mma_{plant}")
        bad = verify.verify_build(builds(spec), truth)[0]
        assert not bad.ok, f"{plant}: {bad.summary()}"
        monkeypatch.undo()


def test_tf32_emulation_truncates_operands(builds, reference):
    """The emulated TF32 MMA drops each operand's low 13 bits, as the tensor cores read a
    float32 register: its output passes the TF32 bound and fails float32's, which products
    of whole operands would pass."""
    from convbench import registry
    impl = registry.get("implicitGemmMMA")
    truth = reference(MMA_LAYER, dtype="float32-tf32")
    out = verify.run_build(builds(toolchain.make_spec(impl, MMA_LAYER, "float32-tf32")), truth)
    assert verify.check_output(out, truth, precision.get_dtype("float32", "tf32"))[0].ok
    ieee = verify.check_output(out, truth, precision.get_dtype("float32"))[0]
    assert not ieee.ok, ieee.summary()


def test_swizzle_spreads_each_ldmatrix_phase_over_the_banks():
    """For every row length the kernels use, the eight 16-byte rows one ldmatrix phase
    reads (eight consecutive rows, one chunk) land in eight different 16-byte bank groups,
    and the swizzle permutes the chunks of each 128-byte line (nothing written twice)."""
    for cpr in (2, 4, 8, 16, 32):
        index = lambda r, c: eval(mma_layout.swizzle(cpr, str(r), str(c)).replace("/", "//"))
        rows = 64
        stored = [index(r, c) for r in range(rows) for c in range(cpr)]
        assert sorted(stored) == list(range(rows * cpr)), cpr
        assert all(index(r, c) // 8 == (r * cpr + c) // 8 for r in range(rows) for c in range(cpr))
        for r0 in range(0, rows, 8):
            for c in range(cpr):
                assert len({index(r0 + i, c) % 8 for i in range(8)}) == 8, (cpr, r0, c)


def test_blocked_layout_spreads_each_32bit_load_over_the_banks():
    """N-major TF32 tiles (read with 32-bit loads): the layout is a permutation of the
    tile; the 32 words one load reads (8 consecutive values in each of 4 rows from a
    multiple of 4) land in 32 different banks; the threads of a round stage every chunk
    of its rows once, each 8 consecutive threads 128 consecutive bytes."""
    for cpr in (4, 8, 16, 32):
        index = lambda r, c: eval(mma_layout.blocked(cpr, str(r), str(c)))
        rows = 16
        stored = [index(r, c) for r in range(rows) for c in range(cpr)]
        assert sorted(stored) == list(range(rows * cpr)), cpr
        for r0 in range(0, rows, 4):
            for c0 in range(0, cpr, 2):
                banks = {(index(r0 + t, c0 + g // 4) * 4 + g % 4) % 32
                         for t in range(4) for g in range(8)}
                assert len(banks) == 32, (cpr, r0, c0)
        for nt in (cpr * 4, cpr * 8):
            row, chunk = mma_layout.blocked_thread(cpr)
            at = [tuple(eval(e.replace("(int)t", str(t)).replace("/", "//")) for e in (row, chunk))
                  for t in range(nt)]
            assert sorted(at) == [(r, c) for r in range(nt // cpr) for c in range(cpr)]
            assert [index(r, c) for r, c in at] == list(range(nt)), (cpr, nt)
            # round i stages rows nt / cpr on: each chunk i * nt chunks on (the stagings'
            # constant offsets)
            rows = nt // cpr
            assert all(index(r + i * rows, c) == index(r, c) + i * nt
                       for r, c in at for i in range(3)), (cpr, nt)


# -- the vdpbf16ps kernel (CPUs with AVX512_BF16) --------------------------------------------------

needs_dpbf16 = pytest.mark.skipif(not has_feature(bf16_dot.FEATURE),
                                  reason=f"this CPU has no {bf16_dot.FEATURE}")

#: Reduction runs (KW x C) of odd and even length, padded and not, strided, 1 and 2
#: vectors of 16 channels per tile.
DP_LAYERS = [
    Layer("dp_c1_odd", 2, 1, 16, 7, 9, 20, 3, 3, 3, pad=1),      # run 3: a lone last value
    Layer("dp_c3_s2", 1, 3, 32, 9, 11, 13, 3, 3, 3, stride=2, pad=1),
    Layer("dp_c4_k48", 1, 4, 48, 6, 7, 8, 3, 3, 3),             # run 12, unpadded, nv 3
]


#: Data gradients (stride 1) whose transposed layers have 16k output channels: reduction
#: runs of 72 (even, padded) and 15 (odd, unpadded since pad = k - 1).
DP_BWD_LAYERS = [
    Layer("dp_bwd_c16_k24", 1, 16, 24, 6, 7, 9, 3, 3, 3, pad=1),
    Layer("dp_bwd_c32_k5", 2, 32, 5, 5, 6, 7, 3, 3, 3, pad=2),
]


def _dp_verify(layer, builds, reference, planted="", impl="directConvNDHWCblocked",
               pass_="fwd"):
    from convbench import registry
    from convkernels.transposed import transposed_layer
    kernel = registry.get(impl)
    assert bf16_dot.refusal(layer if pass_ == "fwd" else transposed_layer(layer), "bfloat16") == ""
    spec = toolchain.make_spec(kernel, layer, "bfloat16", planted=planted)
    return verify.verify_build(builds(spec), reference(layer, pass_=pass_, dtype="bfloat16"))[0]


DP_CASES = ([(la, "directConvNDHWCblocked", "fwd") for la in DP_LAYERS]
            + [(la, "directConvNDHWCblockedBwdData", "bwd_data") for la in DP_BWD_LAYERS])


@needs_dpbf16
@pytest.mark.parametrize("layer, impl, pass_",
                         [pytest.param(*c, id=c[0].name, marks=() if n in (0, 3) else
                                       pytest.mark.full) for n, c in enumerate(DP_CASES)])
def test_dpbf16_kernel_verifies(layer, impl, pass_, builds, reference):
    result = _dp_verify(layer, builds, reference, impl=impl, pass_=pass_)
    assert result.ok, result.summary()


@needs_dpbf16
@pytest.mark.parametrize("plant, case", [("tail_dropped", DP_CASES[0]),
                                         ("pair_swapped", DP_CASES[0]),
                                         ("pair_swapped", DP_CASES[4])],
                         ids=["tail_dropped", "pair_swapped", "pair_swapped_bwd_data"])
def test_dpbf16_plants_fail(plant, case, builds, reference, monkeypatch):
    """The input pair broadcast with its halves swapped (so it meets the wrong filter
    value), or the odd run's last value left out: both fail."""
    original = bf16_dot.tile_code
    if plant == "pair_swapped":
        monkeypatch.setattr(bf16_dot, "_u32", lambda e: f"(int)(((unsigned)cb_u32({e}) << 16) "
                                                       f"| ((unsigned)cb_u32({e}) >> 16))")
    else:
        def no_tail(L, tile, nv, Q):
            code = original(L, tile, nv, Q)
            head, _, rest = code.partition("    {\n")  # the lone value's block
            return head + rest[rest.index("\n    }\n") + len("\n    }\n"):]
        monkeypatch.setattr(bf16_dot, "tile_code", no_tail)
    layer, impl, pass_ = case
    result = _dp_verify(layer, builds, reference, planted=f"dpbf16_{plant}", impl=impl,
                        pass_=pass_)
    assert not result.ok, result.summary()


@pytest.mark.parametrize("case", case_params(
    [Case("directConvNDHWCblocked", DP_LAYERS[0], "precision", dtype="float16"),
     Case("directConvNDHWCblockedBwdData", DP_LAYERS[2], "precision", dtype="bfloat16"),
     Case("directConvNDHWCblockedBwdFilter", DP_LAYERS[0], "precision", dtype="bfloat16")],
    [Case("directConvNDHWCblocked", DP_LAYERS[1], "precision", dtype="bfloat16",
          params=(("DOT", 0),)),
     Case("directConvNDHWCblockedBwdData", DP_LAYERS[0], "precision", dtype="float16"),
     Case("directConvNDHWCblockedBwdFilter", DP_LAYERS[1], "precision", dtype="float16",
          params=(("TAPS", 1),)),
     Case("directConvNDHWCblockedBwdFilter", DP_LAYERS[2], "precision", dtype="bfloat16",
          params=(("ROWS", 4), ("SLICES", 2)))]))
def test_blocked_kernels_widen_once(case, builds, reference, coverage):
    """The generic blocked kernels in 16 bits: the input widened into the float32 copy
    (padded or not), the filter packed in float32 (bfloat16 with DOT=0: the kernel that
    CPUs without AVX512_BF16 run); the filter gradient widening what it reads in place,
    its partial sums in float32 (one rounding, at the store)."""
    verify_case(case, builds, reference, coverage)


def test_dpbf16_refusals():
    assert bf16_dot.refusal(LAYER, "float16") == "bfloat16 only"
    assert "multiple of 16" in bf16_dot.refusal(LAYER, "bfloat16")  # K = 5
    grouped = Layer("g", 1, 16, 16, 5, 5, 5, 3, 3, 3, pad=1, groups=2)
    assert "groups" in bf16_dot.refusal(grouped, "bfloat16")
