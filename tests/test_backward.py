"""The backward passes: --pass on the command line, and verification with teeth (a flipped
kernel, a wrong stride phase, a split-K chunk that drops planes, and in the register-blocked
kernels an unflipped filter, a dropped partial and a shifted width tap are caught)."""

import importlib.util
import inspect
import re
import sys

import pytest

from cases import ANISO, ANISO_IMPLS, IMPLS, case_params, cases, verify_case
from convbench import registry
from convbench.commands import profile_conv3d as cli
from convbench.check import references, verify
from convbench.build import toolchain
from convbench.layersets.layer import Layer
from convkernels.layouts import Pass
from convbench.registry import Implementation
from convkernels.auto import implicit_gemm
from convkernels.auto.schedules import auto_cpu

BACKWARD = sorted(n for n, i in registry.all_implementations().items() if i.pass_ != Pass.FWD)


def test_every_backward_pass_has_implementations():
    passes = {registry.get(n).pass_ for n in BACKWARD}
    assert passes == {Pass.BWD_DATA, Pass.BWD_FILTER}
    assert set(BACKWARD) >= {"implicitGemmBwdData", "implicitGemmBwdFilter",
                             "implicitGemmsplitKBwdFilter"}
    gemms = ("implicitGemmBwdData", "implicitGemmBwdFilter", "implicitGemmsplitKBwdFilter")
    for name in gemms:  # the GPU-capable ones; the register-blocked kernels are CPU-only
        assert registry.get(name).targets == ("cpu", "gpu")
    for name in set(BACKWARD) - set(gemms):
        assert "cpu" in registry.get(name).targets, name


def test_reference_is_autograd():
    """The backward references are the gradients torch's autograd computes."""
    import torch
    layer = Layer("g", 1, 2, 3, 5, 6, 4, 3, 3, 3, stride=2, pad=1)
    x = torch.rand(layer.input_shape, dtype=torch.float64, requires_grad=True)
    w = torch.rand(layer.filter_shape, dtype=torch.float64, requires_grad=True)
    dy = torch.rand(layer.output_shape, dtype=torch.float64)
    torch.nn.functional.conv3d(x, w, stride=2, padding=1).backward(dy)
    inputs = {"x": x.detach(), "w": w.detach(), "y": dy}
    assert torch.allclose(references.torch_pass(layer, Pass.BWD_DATA, inputs), x.grad)
    assert torch.allclose(references.torch_pass(layer, Pass.BWD_FILTER, inputs), w.grad)


def _planted(tmp_path, name, replacements):
    """A copy of ``convkernels/auto/implicit_gemm.py`` with ``replacements`` (old, new, count) applied, as
    a fresh module (DaCe parses programs from their source file)."""
    source = inspect.getsource(implicit_gemm)
    for old, new, count in replacements:
        assert source.count(old) >= count, old
        source = source.replace(old, new, count)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _verify(algorithm, pass_, layer, builds, reference, planted):
    impl = Implementation(name="planted", summary="a planted bug", layout="NDHWC",
                          pass_=pass_, algorithm=algorithm, schedules={"cpu": auto_cpu})
    build = builds(toolchain.make_spec(impl, layer, planted=planted))
    return verify.verify_build(build, reference(layer, pass_=pass_))[0]


LAYER = Layer("bwd_odd", 1, 3, 4, 7, 6, 5, 3, 3, 3, stride=2, pad=1)


def test_unplanted_copy_passes(tmp_path, builds, reference):
    """The copying machinery itself leaves a correct program (so the failures below come
    from the planted bugs alone)."""
    module = _planted(tmp_path, "bwd_copy", [])
    check = _verify(module.data_gradient, Pass.BWD_DATA, LAYER, builds, reference, "copy")
    assert check.ok, check.summary()


def test_flipped_kernel_is_caught(tmp_path, builds, reference):
    # The filter taps read mirrored: w[k, KD-1-kd, KH-1-kh, KW-1-kw, c].
    module = _planted(tmp_path, "bwd_flip", [('"\\nt = tap if ok else 0"',
                                              'f"\\nt = ({KX} - 1 - tap) if ok else 0"', 1)])
    check = _verify(module.data_gradient, Pass.BWD_DATA, LAYER, builds, reference, "flip")
    assert not check.ok, check.summary()


def test_wrong_stride_phase_is_caught(tmp_path, builds, reference):
    # The phase taken from i instead of i + P (the padding forgotten in the phase).
    module = _planted(tmp_path, "bwd_phase", [('f"tap = (i + {P}) % {S} + {S} * j\\n"',
                                               'f"tap = i % {S} + {S} * j\\n"', 1),
                                              ('f"pos = (i + {P}) // {S} - j\\n"',
                                               'f"pos = i // {S} - j\\n"', 1)])
    check = _verify(module.data_gradient, Pass.BWD_DATA, LAYER, builds, reference, "phase")
    assert not check.ok, check.summary()


def test_split_k_dropping_planes_is_caught(tmp_path, builds, reference):
    # Chunk length rounded down: with Do = 4 planes and 3 chunks, each chunk reduces one
    # plane instead of two, so planes are never reduced.
    module = _planted(tmp_path, "bwd_split", [("for t in range(CH):",
                                               "for t in range(OD // nsplit):", 1)])
    layer = Layer("split", 1, 3, 4, 6, 5, 5, 3, 3, 3)  # Do = 4

    def algorithm(layer, dtype, params):
        return module.filter_gradient(layer, dtype, params, nsplit=3)
    check = _verify(algorithm, Pass.BWD_FILTER, layer, builds, reference, "split")
    assert not check.ok, check.summary()


def _verify_source(name, function, source, pad_layer, pass_, layer, builds, reference, fix=None):
    """Verify a register-blocked kernel generated from (planted) ``source`` text; its
    input padded as for ``pad_layer`` (None: the program reads it unpadded)."""
    from convkernels.cpu.direct.blocking import cpu_schedule
    from convkernels.padding import pad_input
    from convkernels.programs import program_from_source

    def algorithm(layer, dtype, params):
        program = program_from_source(source, function, name)
        sdfg = (pad_input(program, pad_layer, "NDHWC", halo=True) if pad_layer is not None
                else program.to_sdfg(simplify=True))
        return fix(sdfg) if fix else sdfg
    impl = Implementation(name=name, summary="a planted bug", layout="NDHWC", pass_=pass_,
                          algorithm=algorithm, schedules={"cpu": cpu_schedule})
    build = builds(toolchain.make_spec(impl, layer, planted=name))
    return verify.verify_build(build, reference(layer, pass_=pass_))[0]


#: Stride 1, a different padding per dimension, tails in every tile.
BLOCKED_LAYER = Layer("blocked_odd", 2, 3, 5, 6, 5, 7, 3, 3, 3, pad=1, pad_w=0)


#: Fast tier: the packed filter (the default); full tier: the filter read in place as well
#: (its unplanted form is verified in the fast tier by tests/test_blocked_kernels.py's EDGE).
@pytest.mark.parametrize("pack", [True, pytest.param(False, marks=pytest.mark.full)])
@pytest.mark.parametrize("plant", [None, "unflipped"])
def test_blocked_bwd_data_catches_an_unflipped_filter(pack, plant, builds, reference):
    """With the filter packed (flipped while copied) and read in place (flipped where
    read), the flip is planted away in either and must be caught."""
    from convkernels.cpu.direct import data_gradient as bd
    from convkernels.cpu.direct.blocking import blocked_source, channel_tiles_outer
    from convkernels.layer import layer_constants
    params = registry.get("directConvNDHWCblockedBwdData").resolve_params()
    t = bd.transposed_layer(BLOCKED_LAYER)
    L = layer_constants(t, "NDHWC")
    db, hb, wb, nb, nv = bd.tile_sizes(BLOCKED_LAYER, params)
    source = blocked_source(L, "float32", db, hb, wb, nb, channel_tiles_outer(t, 2), flip=True,
                            nv=nv, pack=pack)
    if plant:
        flipped, plain = ("2 - td, 2 - th, 2 - tw", "td, th, tw") if pack else \
            ("2 - kd, 2 - kh, 2 - kw", "kd, kh, kw")
        assert source.count(flipped) == 1
        source = source.replace(flipped, plain)
    check = _verify_source(f"bd_{plant}_{int(pack)}", "direct_blocked", source, t, Pass.BWD_DATA,
                           BLOCKED_LAYER, builds, reference, fix=bd.swap_roles)
    assert check.ok is (plant is None), check.summary()


@pytest.mark.parametrize("plant", [None, "stale_filter"])
def test_pixel_groups_catch_a_stale_filter_vector(plant, builds, reference):
    """With the micro-tile's pixels in several vector loops (``GROUP``), each loop loads
    the filter vectors again; a planted loop that reuses the previous loop's (the last
    lane's value, in the program's semantics) must be caught."""
    from convkernels.cpu.direct import forward as fw
    from convkernels.cpu.direct.blocking import blocked_source, channel_tiles_outer
    from convkernels.layer import layer_constants
    layer = Layer("groups", 2, 5, 16, 5, 6, 7, 3, 3, 3, pad=1)
    params = dict(registry.get("directConvNDHWCblocked").resolve_params(), PIX=7, NB=8,
                  NV=2, GROUP=3)
    db, hb, wb, nb, nv = fw.tile_sizes(layer, params)
    assert (db * hb * wb, nv) == (7, 2)
    source = blocked_source(layer_constants(layer, "NDHWC"), "float32", db, hb, wb, nb,
                            channel_tiles_outer(layer, 2), nv=nv, group=3)
    lines = source.splitlines()
    loops = [n for n, line in enumerate(lines) if line.strip() == "for j in range(8):"]
    assert len(loops) == 3  # 3 + 3 + 1 pixels
    if plant:  # the second loop keeps the first loop's filter vectors
        assert lines[loops[1] + 1].strip().startswith("wv0 = ")
        del lines[loops[1] + 1:loops[1] + 3]
        source = "\n".join(lines) + "\n"
    check = _verify_source(f"grp_{plant}", "direct_blocked", source, layer, Pass.FWD, layer,
                           builds, reference)
    assert check.ok is (plant is None), check.summary()


#: Fast tier: the forward kernel; full tier: the data gradient's as well (the same store
#: code; its unplanted channel blocks are verified in the fast tier by EDGE's CBLK case).
@pytest.mark.parametrize("pass_", [Pass.FWD, pytest.param(Pass.BWD_DATA, marks=pytest.mark.full)])
@pytest.mark.parametrize("plant", [None, "overwrite"])
def test_channel_blocks_catch_an_overwritten_output(pass_, plant, builds, reference):
    """With the reduction over input channels in blocks, each block adds to the output;
    a planted store that overwrites it keeps the last block only and must be caught."""
    from convkernels.cpu.direct import data_gradient as bd, forward as fw
    from convkernels.cpu.direct.blocking import blocked_source, channel_tiles_outer
    from convkernels.layer import layer_constants
    layer = Layer("cblk", 2, 12, 12, 5, 6, 7, 3, 3, 3, pad=1)
    module = fw if pass_ == Pass.FWD else bd
    params = dict(registry.get("directConvNDHWCblocked" if pass_ == Pass.FWD
                               else "directConvNDHWCblockedBwdData").resolve_params(), CBLK=4)
    conv = layer if pass_ == Pass.FWD else bd.transposed_layer(layer)
    db, hb, wb, nb, nv = module.tile_sizes(layer, params)
    source = blocked_source(layer_constants(conv, "NDHWC"), "float32", db, hb, wb, nb,
                            channel_tiles_outer(conv, 2), flip=pass_ == Pass.BWD_DATA, nv=nv,
                            cblk=4)
    assert "for cc in range(3):" in source
    if plant:
        stores = [line for line in source.splitlines() if "] + acc[" in line]
        assert stores
        for line in stores:
            target, value = line.split(" = ", 1)
            source = source.replace(line, f"{target} = acc[{value.split(' + acc[')[1]}")
    check = _verify_source(f"cb_{pass_}_{plant}", "direct_blocked", source, conv, pass_, layer,
                           builds, reference, fix=bd.swap_roles if pass_ == Pass.BWD_DATA
                           else None)
    assert check.ok is (plant is None), check.summary()


#: Fast tier: both forms without row blocks, and row blocks, each with its control and one
#: or two plants.  Full tier: the other plants (no slices, one vector loop per width tap),
#: and the same plants in a second configuration each.  The fast tier verifies the
#: unplanted slice-less and per-tap-loop forms on their own (tests/test_impls_cpu.py
#: MULTI_VECTOR_FAST; SPLIT 1 is the default).
_REPEATS = [pytest.param(*p, marks=pytest.mark.full) for p in (
    (0, 2, "stale_partial", 0), (0, None, None, 0), (0, None, "drop_batch", 0),
    (0, 2, None, 1), (0, 0, "last_tap", 1),
    (0, 0, "width_tap", 0), (0, 2, "drop_partial", 0), (0, 2, "width_tap", 0),
    (1, 0, "width_tap", 1), (1, 5, "width_tap", 0), (0, 2, "width_tap", 1))]


@pytest.mark.parametrize("form, rows, plant, split", [
    (0, 0, None, 0), (0, 0, "drop_partial", 0), (1, 0, None, 0), (1, 0, "width_tap", 0),
    (0, 2, None, 0), (0, 2, "restart_rows", 0)] + _REPEATS)
def test_blocked_bwd_filter_catches_planted_bugs(form, rows, plant, split, builds, reference):
    """``rows`` None: no slices (``SLICES=0``), the batch loops inside each tile.
    ``split``: one vector loop per width tap (``SPLIT=1``)."""
    from convkernels.cpu.direct import filter_gradient as bf
    from convkernels.layer import layer_constants
    params = dict(registry.get("directConvNDHWCblockedBwdFilter").resolve_params(),
                  SLICES=2 if rows is not None else 0, FORM=form, ROWS=rows or 0,
                  SPLIT=split)
    layer = BLOCKED_LAYER  # output depth 6: 2 chunks of 3 planes
    source = bf._source(layer_constants(layer, "NDHWC"), "float32",
                        bf.tile_sizes(layer, params))
    if plant == "drop_partial":  # the last depth chunk's partial is never added
        assert source.count("for dc in range(2):") == 1
        source = source.replace("for dc in range(2):", "for dc in range(1):")
    elif plant == "width_tap":  # the second width tap reads the first's input
        # (form 0: in one accumulator's statement; form 1: in its input vector)
        lines = source.splitlines()
        i = next(n for n, line in enumerate(lines)
                 if ("acc[0, 3, j] +=" if form == 0 else "xv1_0 = x[") in line)
        assert lines[i].count("3 + 1, ") == 1
        lines[i] = lines[i].replace("3 + 1, ", "3 + 0, ")
        source = "\n".join(lines) + "\n"
    elif plant == "last_tap":  # the last width tap's vector loop runs no lane
        loops = [n for n, line in enumerate(source.splitlines())
                 if re.fullmatch(r"for j in range\(\d+\):", line.strip())]
        assert len(loops) == 3, loops  # one per width tap
        lines = source.splitlines()
        lines[loops[-1]] = re.sub(r"range\(\d+\)", "range(0)", lines[loops[-1]])
        source = "\n".join(lines) + "\n"
    elif plant == "drop_batch":  # the second batch element is never reduced
        assert source.count("for b in range(2):") == 1
        source = source.replace("for b in range(2):", "for b in range(1):")
    elif plant == "stale_partial":  # the partial is not zeroed: the sums of the call
        # before stay in it (it is allocated once per loaded program; verification runs
        # every build twice)
        zero = "part[b, dc, z0, z1, z2, z3, z4, z5] = 0"
        assert source.count(zero) == 1
        source = source.replace(zero, f"{zero[:-4]} = {zero[:-4]}")
    elif plant == "restart_rows":  # each row block starts from zero, not from the partial
        loads = [line for line in source.splitlines() if "] = part[" in line]
        assert loads
        for line in loads:
            source = source.replace(line, line.split("] = part[")[0] + "] = 0")
    check = _verify_source(f"bf_{form}_{rows}_{plant}_{split}", "bwd_filter_blocked", source, None,
                           Pass.BWD_FILTER, layer, builds, reference)
    assert check.ok is (plant is None), check.summary()


@pytest.mark.parametrize("plant", [None, "one_plane"])
def test_blocked_bwd_filter_row_blocks_of_several_planes(plant, builds, reference):
    """``PLANES``: a row block spans 2 rows of each of 2 depth planes (one slice of 6
    planes per batch element); planted: only the first plane of each block is reduced."""
    from convkernels.cpu.direct import filter_gradient as bf
    from convkernels.layer import layer_constants
    params = dict(registry.get("directConvNDHWCblockedBwdFilter").resolve_params(),
                  SLICES=1, ROWS=2, PLANES=2, CB=2)
    layer = BLOCKED_LAYER
    source = bf._source(layer_constants(layer, "NDHWC"), "float32",
                        bf.tile_sizes(layer, params))
    assert source.count("for tp in range(2):") == 1 and "for t in range(3):" in source
    if plant == "one_plane":
        source = source.replace("for tp in range(2):", "for tp in range(1):")
    check = _verify_source(f"bf_planes_{plant}", "bwd_filter_blocked", source, None,
                           Pass.BWD_FILTER, layer, builds, reference)
    assert check.ok is (plant is None), check.summary()


#: Padded in every dimension: the border rows, planes and width pixels are bounded away.
BORDER_LAYER = Layer("bf_border", 2, 3, 16, 5, 6, 7, 3, 3, 3, pad=1)


@pytest.mark.parametrize("rows, plant", [
    (0, None), (2, None), (0, "row"), (2, "edge_pixel"), (2, "border_row")]
    + [pytest.param(*p, marks=pytest.mark.full) for p in (
        (2, "plane"), (0, "plane_range"),  # the depth bounds (the rows' stay in the fast tier)
        (2, "row"), (0, "edge_pixel"), (0, "border_row"))])  # the same plants, other form
def test_blocked_bwd_filter_reads_only_the_input(rows, plant, builds, reference):
    """The kernel reads x in place, bounding its rows and planes to those that read the
    input and running at the border pixels only the width taps that do; the input lies
    between NaN guards when verified.  Planted: a row or a plane that reads the input
    skipped, a border pixel's first tap dropped, a row of the border read (in place:
    the row before, or NaN before the input)."""
    from convkernels.cpu.direct import filter_gradient as bf
    from convkernels.layer import layer_constants
    params = dict(registry.get("directConvNDHWCblockedBwdFilter").resolve_params(),
                  SLICES=1, ROWS=rows, CB=2, NB=8)
    source = bf._source(layer_constants(BORDER_LAYER, "NDHWC"), "float32",
                        bf.tile_sizes(BORDER_LAYER, params))
    lines = source.splitlines()
    if plant == "row":  # the rows' lower bound one too high
        assert source.count("max(0, 1 - (kh))") == 1
        source = source.replace("max(0, 1 - (kh))", "max(0, 2 - (kh))")
    elif plant == "border_row":  # the rows' lower bound one too low: reads the border
        assert source.count("max(0, 1 - (kh))") == 1
        source = source.replace("max(0, 1 - (kh))", "max(0, 0 - (kh))")
    elif plant in ("plane", "plane_range"):  # the first plane that reads the input
        # counted as border (rows: its rows' range empty; slices: the planes' lower bound)
        assert source.count("max(0, 1 - (kd))") == 1
        source = source.replace("max(0, 1 - (kd))", "max(0, 2 - (kd))")
    elif plant == "edge_pixel":  # the first peeled pixel's first width tap dropped
        loop = next(n for n, line in enumerate(lines) if line.strip().startswith("for ow in"))
        depth = len(lines[loop]) - len(lines[loop].lstrip())
        first = next(n for n in range(loop + 1, len(lines))
                     if len(lines[n]) - len(lines[n].lstrip()) == depth)
        assert lines[first].strip() == "for j in range(8):"
        end = next(n for n in range(first + 1, len(lines))
                   if len(lines[n]) - len(lines[n].lstrip()) <= depth)
        source = "\n".join(lines[:first] + lines[end:]) + "\n"
    check = _verify_source(f"bf_border_{rows}_{plant}", "bwd_filter_blocked", source,
                           None, Pass.BWD_FILTER, BORDER_LAYER, builds, reference)
    assert check.ok is (plant is None), check.summary()


@pytest.mark.parametrize("args, words", [
    (["--pass", "bwd"], "--pass: unknown pass 'bwd' (choose from fwd, bwd_data, bwd_filter)"),
    (["--pass", "bwd_data", "--implementation", "implicitGemm"],
     "--pass bwd_data: implicitGemm computes fwd, not bwd_data (implementations of "
     "bwd_data: directConvNCDHWBwdData, directConvNDHWCamxBwdData, "
     "directConvNDHWCblockedBwdData, "
     "directConvNDHWCdotBwdData, implicitGemmBwdData, implicitGemmMMABwdData, "
     "implicitGemmPipelinedBwdData, implicitGemmPipelinedNCDHWBwdData, "
     "implicitGemmWGMMABwdData, winogradF2BwdData, winogradF2BwdDataAdjoint, "
     "winogradF2TiledBwdData)"),
    (["--pass", "fwd", "--implementation", "implicitGemmBwdFilter"],
     "--pass fwd: implicitGemmBwdFilter computes bwd_filter, not fwd"),
])
def test_pass_errors(capsys, args, words):
    assert cli.main(["--verify", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_list_filters_by_pass(capsys):
    assert cli.main(["--list", "--pass", "bwd_filter"]) == 0
    out = capsys.readouterr().out
    names = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert names == ["directConvNCDHWBwdFilter", "directConvNDHWCamxBwdFilter",
                     "directConvNDHWCblockedBwdFilter",
                     "implicitGemmBwdFilter", "implicitGemmMMABwdFilter",
                     "implicitGemmPipelinedBwdFilter",
                     "implicitGemmPipelinedNCDHWBwdFilter", "implicitGemmsplitKBwdFilter",
                     "implicitGemmWGMMABwdFilter", "winogradF2BwdFilter"]
    assert "pass: bwd_filter" in out


def test_compareprof_times_a_backward_pass(tmp_path, capsys):
    import csv
    path = tmp_path / "l.csv"
    path.write_text("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,"
                    "pad\nt,1,2,3,5,4,6,3,3,3,1,1\n")
    rc = cli.main(["--implementation", "implicitGemmBwdFilter", "--compareprof", "--verify",
                   "--device", "cpu", "--paramscsv", str(path), "--cachedir",
                   str(tmp_path / "c"), "--outdir", str(tmp_path / "run"), "--warmupiter", "1",
                   "--totaliter", "3", "--no-flush"])
    assert rc == 0, capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "run" / "summary.csv")))
    assert [r["backend"] for r in rows] == ["dace", "torch"]
    import json
    assert json.loads((tmp_path / "run" / "metadata.json").read_text())["pass"] == "bwd_filter"


# -- padding per dimension (2D layers written as 3D) -----------------------------------------

def test_layer_pads_per_dimension():
    layer = ANISO[2]
    assert layer.pads == (2, 1, 0) and layer.anisotropic
    assert (layer.out_d, layer.out_h, layer.out_w) == (4, 3, 3)
    assert "p2,1,0" in layer.describe() and layer.key().endswith("_p2x1x0")
    iso = Layer("i", 1, 2, 3, 5, 6, 7, 3, 3, 3, pad=1, pad_d=1)
    assert not iso.anisotropic and iso.key() == Layer("j", 1, 2, 3, 5, 6, 7, 3, 3, 3, 1, 1).key()


@pytest.mark.parametrize("layout", ["NDHWC", "NCDHW"])
@pytest.mark.parametrize("pads", [(1, 1, 1), (2, 1, 0), (0, 0, 3), (0, 2, 0)])
def test_halo_slabs_cover_the_border_exactly_once(layout, pads):
    """The zeroed slabs and the copied interior together write every element of the
    padded input once: a missed element would be read as whatever the buffer (allocated
    once per loaded program) held."""
    import numpy as np
    from convkernels.padding import halo_slabs
    from convbench.registry import stored_shape
    layer = Layer("h", 2, 3, 4, 5, 6, 7, 3, 3, 3, pad=pads[0], pad_d=pads[0], pad_h=pads[1],
                  pad_w=pads[2])
    spatial = (2, 3, 4) if layout == "NCDHW" else (1, 2, 3)
    shape = stored_shape(layout, "x", layer.input_shape)
    padded = list(shape)
    for d, p in zip(spatial, pads):
        padded[d] += 2 * p
    count = np.zeros(padded, dtype=int)
    for box in halo_slabs(tuple(padded), shape, spatial, pads):
        count[tuple(slice(*map(int, r.split(":"))) for r in box)] += 1
    count[tuple(slice(pads[spatial.index(d)], pads[spatial.index(d)] + s) if d in spatial
                else slice(None) for d, s in enumerate(shape))] += 1
    assert count.min() == count.max() == 1


def test_csv_optional_pad_columns(write_csv):
    from convbench.base.errors import LayerFileError
    from convbench.layersets.sets import load_layers
    head = "layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad,pad_d\n"
    layers = load_layers(str(write_csv(head + "a,1,2,3,1,5,5,1,3,3,1,1,0\nb,1,2,3,4,5,5,3,3,3,1,1,\n")))
    assert [x.pads for x in layers] == [(0, 1, 1), (1, 1, 1)]
    with pytest.raises(LayerFileError, match="field 'pad_d': must be a non-negative integer"):
        load_layers(str(write_csv(head + "a,1,2,3,1,5,5,1,3,3,1,1,-1\n", "bad.csv")))


def test_alcf_layer_set_counts_2d_flops():
    from convbench.layersets.sets import load_layers
    layers = {x.name: x for x in load_layers("alcf_conv2d")}
    assert len(layers) == 4
    for layer in layers.values():
        assert layer.in_d == layer.k_d == layer.out_d == 1
        n, k, c = layer.batch, layer.out_channels, layer.in_channels
        assert layer.flops() == 2 * n * k * c * layer.out_h * layer.out_w * layer.k_h * layer.k_w
    assert layers["conv14x14x128"].output_shape == (4096, 256, 1, 14, 14)
    assert layers["conv128x128x128"].output_shape == (32, 128, 1, 124, 124)


def test_padding_per_dimension_is_handled_or_refused():
    """Every implementation either declares per-dimension padding (and is verified on it
    below) or refuses such layers with the reason: none computes them."""
    assert {registry.get(n).pass_ for n in ANISO_IMPLS} == set(Pass)  # each pass has one
    for name in IMPLS:
        impl = registry.get(name)
        params = impl.resolve_params()
        for layer in (x for x in ANISO if x.anisotropic):
            reason = impl.unsupported_reason(layer, params)
            if "anisotropic padding" in impl.handles:
                assert reason is None or "anisotropic padding" not in reason, (name, layer.name)
            else:
                assert reason and "does not handle anisotropic padding" in reason, (
                    name, layer.name)
        # a per-dimension padding equal to pad is no anisotropy (kernels with channel
        # constraints, the few-channel and the AMX ones, may refuse the layer otherwise)
        reason = impl.unsupported_reason(Layer("iso", 1, 2, 3, 5, 6, 7, 3, 3, 3, pad=1,
                                               pad_d=1), params)
        assert reason is None or "anisotropic" not in reason, (name, reason)


#: Fast tier: the 3D layer with three different paddings; full tier: every layer.
ANISO_FAST = cases(ANISO_IMPLS, [("aniso", ANISO[2])])
ANISO_FULL = cases(ANISO_IMPLS, [("aniso", layer) for layer in ANISO])


@pytest.mark.parametrize("case", case_params(ANISO_FAST, ANISO_FULL))
def test_anisotropic_padding_verifies(case, builds, reference, coverage):
    verify_case(case, builds, reference, coverage)
