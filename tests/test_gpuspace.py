"""The GPU tune space (``convbench.tuning.gpuspace``): what ptxas says, occupancy, the verdict
that keeps a configuration off the GPU, the ranking, and the tune tier's plan, winners
and tuning file."""

import csv
import dataclasses
import json
import shutil

import pytest

from conftest import in_process, load_script
from convbench import registry
from convbench import campaign
from convbench.campaign import cli as campaign_cli
from convbench.build import gpubuild, tuned as tuning
from convbench.tuning import gpuspace
from convbench.campaign import report
from convbench.layersets.sets import load_layers

script = load_script("gpu_campaign.py")

PTXAS = """\
ptxas info    : 41 bytes gmem
ptxas info    : Compiling entry function '_ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv' for 'sm_90'
ptxas info    : Function properties for _ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers
ptxas info    : Compiling entry function '_Z33impls__igemm_igemm_warp_142_0_0_0PKfPKiS2_S0_PfS2_' for 'sm_90'
ptxas info    : Function properties for _Z33impls__igemm_igemm_warp_142_0_0_0PKfPKiS2_S0_PfS2_
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem
ptxas info    : Compiling entry function '_Z22table_rowoff_map_0_1_0Pi' for 'sm_90'
ptxas info    : Function properties for _Z22table_rowoff_map_0_1_0Pi
ptxas info    : Used 12 registers, used 0 barriers
"""

NVLINK = """\
nvlink info    : Function properties for '_Z22table_rowoff_map_0_1_0Pi':
nvlink info    : used 12 registers, used 0 barriers, 0 stack, 0 bytes smem, 536 bytes cmem[0], 0 bytes lmem
nvlink info    : Function properties for '_Z33impls__igemm_igemm_warp_142_0_0_0PKfPKiS2_S0_PfS2_':
nvlink info    : used 64 registers, used 1 barriers, 0 stack, 9216 bytes smem, 576 bytes cmem[0], 0 bytes lmem
"""

CU = """\
    gpuError_t __err = cudaLaunchKernel((void*)table_rowoff_map_0_1_0, dim3(1, 2, 32), dim3(256, 1, 1), args, 0, nullptr);
    gpuError_t __err = cudaLaunchKernel((void*)impls__igemm_igemm_warp_142_0_0_0, dim3(2, 4, 1), dim3(16, 16, 1), args, 0, nullptr);
"""


def _layer(layer_set, name, batch):
    return next(la for la in load_layers(layer_set) if la.name == name).with_batch(batch)


# -- what ptxas and the generated code say --------------------------------------------------------

def test_ptxas_output_is_read_per_kernel():
    kernels = gpubuild.parse_ptxas(PTXAS)
    k = kernels["impls__igemm_igemm_warp_142_0_0_0"]
    assert (k.registers, k.shared, k.stack, k.spill_stores, k.spill_loads) == (255, 8192, 24, 20, 16)
    row = kernels["table_rowoff_map_0_1_0"]
    assert (row.registers, row.shared, row.spill_stores) == (12, 0, 0)
    assert gpubuild.parse_launches(CU) == {"table_rowoff_map_0_1_0": (64, 256),
                                           "impls__igemm_igemm_warp_142_0_0_0": (8, 256)}


def test_the_device_link_gives_registers_and_shared_memory():
    """A GPU build compiles with -rdc=true: ptxas then reports no shared memory, and the
    registers it reports are the device link's (64 for implicitGemmNCDHW's defaults, as
    Nsight Compute measured on the H100 and H200: 4 blocks of 256 threads per SM)."""
    assert gpubuild.parse_nvlink(NVLINK) == {"table_rowoff_map_0_1_0": (12, 0, 0),
                                             "impls__igemm_igemm_warp_142_0_0_0": (64, 0, 9216)}
    ptxas = PTXAS.replace("24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads",
                          "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    k = {k.name: k for k in gpubuild.describe_kernels(ptxas, CU, nvlink_text=NVLINK)}
    main = k["impls__igemm_igemm_warp_142_0_0_0"]
    assert (main.registers, main.shared, main.blocks_per_sm, main.occupancy) == (64, 9216, 4, 0.5)


@pytest.mark.parametrize("threads, registers, shared, expected", [
    (256, 40, 8192, (6, 0.75, "registers")),     # 1280 registers per warp: 51 warps
    (256, 32, 0, (8, 1.0, "threads")),
    (128, 32, 48 * 1024, (4, 0.25, "shared")),   # 50176 bytes with the reserved 1 KiB
    (1024, 255, 0, (0, 0.0, "registers")),        # 8192 per warp: 8 warps of 32 needed
    (32, 16, 0, (32, 0.5, "blocks")),
    (64, 100, 0, (8, 0.25, "registers")),        # 3328 per warp: 4 warps per sub-partition
])
def test_occupancy_on_sm90(threads, registers, shared, expected):
    blocks, occ, limiter = gpubuild.occupancy(threads, registers, shared)
    assert (blocks, round(occ, 4), limiter) == expected


def test_a_kernel_that_spills_or_does_not_fit_is_refused_with_its_name():
    kernels = gpubuild.describe_kernels(PTXAS, CU)
    reason = gpubuild.verdict(kernels)
    assert reason and "impls__igemm_igemm_warp_142_0_0_0 spills" in reason
    clean = gpubuild.parse_ptxas(PTXAS.replace("24 bytes stack frame, 20 bytes spill stores, "
                                               "16 bytes spill loads",
                                               "0 bytes stack frame, 0 bytes spill stores, "
                                               "0 bytes spill loads").replace("Used 255", "Used 40"))
    kernels = [clean[n] for n in ("impls__igemm_igemm_warp_142_0_0_0", "table_rowoff_map_0_1_0")]
    for k in kernels:
        k.threads = 256
        k.blocks_per_sm, k.occupancy, k.limiter = gpubuild.occupancy(256, k.registers, k.shared)
    assert gpubuild.verdict(kernels) is None
    kernels[0].stack = 16
    assert "local memory" in gpubuild.verdict(kernels)
    kernels[0].stack, kernels[0].registers = 0, 255
    kernels[0].threads = 1024
    kernels[0].blocks_per_sm = gpubuild.occupancy(1024, 255, 8192)[0]
    assert "does not fit an SM" in gpubuild.verdict(kernels)


def test_a_layer_that_refuses_a_configuration_is_not_its_verdict():
    """Split-K's partial sums overflow int32 on MLPerf conv1 at batch 8: that refusal is
    the layer's, so the configuration passes on what the deep layer's ptxas says; a
    spill on any layer refuses it; refused by every layer, it has no verdict."""
    impl = "implicitGemmsplitK"
    a, b, c = (gpuspace.tag(x) for x in gpuspace.space(impl)[:3])

    def row(config, layer, verdict, registers=40):
        return {"impl": impl, "config": config, "layer_set": "s", "layer": layer, "batch": 1,
                "verdict": verdict, "registers": registers, "blocks_per_sm": 4}
    table = [row(a, "big", "refused: partial sums exceed int32"), row(a, "deep", "ok"),
             row(b, "big", "refused: partial sums exceed int32"),
             row(b, "deep", "k spills (12 bytes stored, 12 loaded)"),
             row(c, "big", "refused: x", 0), row(c, "deep", "refused: y", 0)]
    configs = {gpuspace.tag(x["params"]): x
               for x in gpuspace.summarize(table)["implementations"][impl]["configs"]}
    assert configs[a]["verdict"] == "ok" and configs[a]["refused_on"] == ["s/big/b1"]
    assert "spills" in configs[b]["verdict"]
    assert configs[c]["verdict"].startswith("every probe layer refuses it")


# -- the space and its ranking ---------------------------------------------------------------------

@pytest.mark.parametrize("impl", sorted(gpuspace.SPACES))
def test_every_space_holds_the_defaults_under_distinct_names(impl):
    configs = gpuspace.space(impl)
    assert dict(registry.get(impl).resolve_params({})) in configs
    assert len({gpuspace.tag(c) for c in configs}) == len(configs)


def test_rank_keeps_split_k_for_layers_that_leave_sms_idle():
    configs = [dict(c, _blocks_per_sm=4) for c in gpuspace.space("implicitGemmsplitK")]
    deep = gpuspace.rank("implicitGemmsplitK", _layer("cosmoflow", "conv7", 16), configs)
    wide = gpuspace.rank("implicitGemmsplitK", _layer("cosmoflow", "conv2", 16), configs)
    assert deep and not wide
    assert not any(k.startswith("_") for c in deep for k in c)
    plain = [dict(c, _blocks_per_sm=4) for c in gpuspace.space("implicitGemmNCDHW")]
    first = _layer("cosmoflow_mlperf", "conv1", 8)  # 32 output channels
    ranked = gpuspace.rank("implicitGemmNCDHW", first, plain)
    assert ranked and all(c["CTAtileN"] <= 32 for c in ranked)


def test_score_prefers_full_waves_and_real_work():
    layer = _layer("cosmoflow", "conv7", 16)  # GEMM 128 x 256
    base = {"CTAtileM": 64, "CTAtileN": 64, "CTAtileK": 16, "threadTileM": 4, "threadTileN": 4}
    few = gpuspace.score(base, layer, blocks_per_sm=4)          # 8 blocks on 528 slots
    split = gpuspace.score(dict(base, nsplitK=8), layer, blocks_per_sm=4)
    assert split > few
    assert gpuspace.score(dict(base, threadTileM=8, threadTileN=8), layer, 4) > few


def test_a_configuration_that_issues_more_fma_ranks_first():
    """With every configuration's SASS read, the ranking follows the main loop's FMA
    share where nothing else differs, whatever the register tile's paper reuse says."""
    layer = _layer("cosmoflow", "conv3", 16)
    small = {"CTAtileM": 64, "CTAtileN": 64, "CTAtileK": 16, "threadTileM": 4, "threadTileN": 4}
    large = dict(small, threadTileM=8, threadTileN=8)
    assert gpuspace.score(large, layer, 4) > gpuspace.score(small, layer, 4)  # paper model
    read = [dict(small, _blocks_per_sm=4, _fma_share=0.62), dict(large, _blocks_per_sm=4,
                                                                 _fma_share=0.48)]
    assert gpuspace.rank("implicitGemmNCDHW", layer, read) == [small, large]
    read[0]["_fma_share"], read[1]["_fma_share"] = 0.40, 0.70
    assert gpuspace.rank("implicitGemmNCDHW", layer, read) == [large, small]
    # one configuration unread: the paper model for all (the scales differ)
    del read[1]["_fma_share"]
    read[0]["_fma_share"] = 0.99
    assert gpuspace.rank("implicitGemmNCDHW", layer, read) == [large, small]


def test_the_sass_columns_reach_the_table_the_summary_and_the_ranking(tmp_path):
    """A kernel's reading goes into its row (resources.csv), the configuration's lowest
    FMA share into space.json, and from there into what the tune tier ranks."""
    from convbench.build import sass
    listing = (__import__("pathlib").Path(__file__).parent / "data" / "sass" /
               "lds128.sass").read_text().replace("_Z6lds128", "_Z33impls__igemm_igemm_warp_142_0_0_0")
    clean = PTXAS.replace("24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads",
                          "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    kernels = gpubuild.describe_kernels(clean, CU, nvlink_text=NVLINK, sass_text=listing)
    main = max(kernels, key=lambda k: k.fma)
    assert main.name == "impls__igemm_igemm_warp_142_0_0_0" and main.sass.fma == 16
    impl = "implicitGemmNCDHW"
    params = gpuspace.space(impl)[0]
    probe = gpubuild.Probe(impl, "cosmoflow", "conv7", 16, params, kernels=kernels)
    assert probe.main is main
    row, = gpuspace.rows([probe])
    assert set(gpuspace.COLUMNS) == set(row)
    assert (row["fma_kind"], row["fma_share"], row["lds128_per_fma"]) == ("FFMA", 0.327, 0.5)
    gpuspace.write_space(tmp_path, [probe], {"nvcc": "test"})
    assert list(csv.DictReader(open(tmp_path / "resources.csv")))[0]["fma_share"] == "0.327"
    assert "FFMA 33%" in (tmp_path / "README.md").read_text()
    entry = json.loads((tmp_path / "space.json").read_text())["implementations"][impl]
    config, = [c for c in entry["configs"] if c["layers"]]
    assert (config["fma_share"], config["fma_kind"]) == (0.327, "FFMA")
    passed = gpuspace.passed(tmp_path)[impl]
    assert any(c.get("_fma_share") == 0.327 for c in passed)
    unread = gpuspace.rows([gpubuild.Probe(impl, "s", "l", 1, params,
                                           kernels=gpubuild.describe_kernels(PTXAS, CU))])[0]
    assert unread["fma_share"] == "" and unread["registers"] == 255
    assert sass.COLUMNS[0] in unread


def test_the_ranking_is_checked_against_a_tune_campaigns_times():
    """On a layer where the configuration with the higher FMA share was the faster, the
    SASS model ranks it first and the reuse model (8x8 over 4x4) does not; a tie for
    first place gets half a hit."""
    impl = "implicitGemmNCDHW"
    small = {"CTAtileM": 64, "CTAtileN": 64, "CTAtileK": 16, "threadTileM": 4, "threadTileN": 4}
    large = dict(small, threadTileM=8, threadTileN=8)
    middle = dict(small, threadTileM=8)
    table = [{"impl": impl, "config": gpuspace.tag(p), "blocks_per_sm": 4, "fma_share": s}
             for p, s in ((small, 0.7), (large, 0.5), (middle, 0.6))]
    layer = dataclasses.asdict(_layer("cosmoflow", "conv3", 16))

    def rec(params, ms, status="verified"):
        return {"status": status, "timings": {"dace": {"median_ms": ms}},
                "case": {"impl": impl, "layer_set": "cosmoflow", "layer": layer,
                         "params": list(params.items())}}
    found = gpuspace.ranking_check([rec(small, 1.0), rec(large, 2.0), rec(middle, 1.5),
                                    rec(large, 0.1, "wrong")], table)
    assert found["sass"] == {"layers": 1, "first": 1.0, "rho": 1.0}
    assert found["paper"] == {"layers": 1, "first": 0.0, "rho": -1.0}
    table[1]["fma_share"] = 0.7  # a tie for first: the SASS model cannot tell them apart
    assert gpuspace.ranking_check([rec(small, 1.0), rec(large, 2.0)], table)["sass"]["first"] == 0.5


# -- the tune tier -------------------------------------------------------------------------------

def _space_dir(tmp_path, verdict=lambda impl, c: "ok"):
    data = {"arch": "sm_90", "implementations": {
        impl: {"space": gpuspace.SPACES[impl], "configs": [
            {"params": c, "verdict": verdict(impl, c), "layers": [], "registers": [40, 40],
             "blocks_per_sm": 3} for c in gpuspace.space(impl)]}
        for impl in gpuspace.SPACES}}
    (tmp_path / "space.json").write_text(json.dumps(data))
    return tmp_path


def test_tune_plan_times_defaults_and_ranked_configurations_that_passed(tmp_path, monkeypatch):
    """On the training step's layers, most work first, then on the v1 set's at batch 16:
    every pass's pipelined kernel (but the first layer's data gradient, which the step
    leaves out), its defaults whatever their verdict, candidates only from the
    configurations that passed (no stored winners here: those are timed again whatever
    their verdict, see below), and the defaults split (``splitK=0``) exactly where their
    tiles give fewer than 264 blocks."""
    from convbench.tuning.gpuspace import gemm_shape
    from convkernels.gpu.simt.tiles import AUTO_BLOCKS
    monkeypatch.setenv("CONVBENCH_TUNING", "off")
    refused = {"CTAtileK": 16}  # the defaults' K tile is 8: timed whatever its verdict
    space = _space_dir(tmp_path, lambda impl, c: "x spills" if c["CTAtileK"] == 16 and
                       impl == "implicitGemmPipelined" else "ok")
    cases = campaign.plan_cases("tune", "gpu", planted=False, space_dir=space)
    assert len({c.id for c in cases}) == len(cases)
    steps = campaign.plan.end2end_layers()
    v1 = [layer.with_batch(16) for layer in campaign.load_layers("cosmoflow")]
    assert [(c.layer_set, c.layer) for c in cases[:1]] == [("cosmoflow_mlperf", steps[1])]
    first = [c for c in cases if c.layer_set == "cosmoflow_mlperf"]
    assert cases[:len(first)] == first  # the training step's layers first
    for group in (first, cases[len(first):]):
        flops = [c.layer.flops() for c in group]
        assert flops == sorted(flops, reverse=True)
    assert {c.layer for c in cases} == set(steps) | set(v1)
    for c in cases:
        params = dict(c.params)
        if registry.get(c.impl).pass_ == "bwd_filter":
            continue
        rows, cols, _ = gemm_shape(c.layer, registry.get(c.impl).pass_)
        blocks = -(-rows // params["CTAtileM"]) * -(-cols // params["CTAtileN"])
        default = dict(registry.get(c.impl).resolve_params({}))
        few = -(-rows // default["CTAtileM"]) * -(-cols // default["CTAtileN"]) < AUTO_BLOCKS
        twins = [d for d in cases if d.impl == c.impl and d.layer == c.layer
                 and dict(d.params) == {**default, "splitK": 0}]
        assert len(twins) == few, (c.id, few)
        if params["splitK"] == 0:
            assert blocks < AUTO_BLOCKS, c.id
    for layer in steps + v1:
        for impl in campaign.plan.TUNE_PER_LAYER:
            mine = [c for c in cases if c.layer == layer and c.impl == impl]
            if layer in (steps[0], v1[0]) and registry.get(impl).pass_ == "bwd_data":
                assert not mine
                continue
            if not gpuspace.rank(impl, layer, gpuspace.passed(space).get(impl, [])):
                assert not mine  # no tile of the space fits the layer (v1 conv1's 16 x 27)
                continue
            defaults = dict(registry.get(impl).resolve_params({}))
            assert any(dict(c.params) == defaults for c in mine)
            assert sum(c.time_refs for c in mine) == 1
    assert {c.impl for c in cases} == set(campaign.plan.TUNE_PER_LAYER)
    assert not [c for c in cases if c.impl == "implicitGemmPipelined"
                and dict(c.params)["CTAtileK"] == refused["CTAtileK"]]
    c = cases[1]
    back = campaign.Case.from_json(json.loads(json.dumps(c.to_json())))
    assert back == c and back.id == c.id and dict(back.resolved_params()) == dict(c.params)


def test_tune_plan_times_the_incumbents_again(tmp_path, monkeypatch):
    """A configuration tuned for a layer on any GPU is timed again beside the defaults
    and takes the place of the lowest-ranked candidate, so that a new search never
    files a winner slower than the last one."""
    space = _space_dir(tmp_path)
    layer = _layer("cosmoflow_mlperf", "conv3", 2)
    impl = "implicitGemmPipelined"
    configs = [dict(c, _blocks_per_sm=3) for c in gpuspace.space(impl)]
    ranked = gpuspace.rank(impl, layer, configs)
    incumbent = ranked[-1]  # the model's last choice
    tuned = tmp_path / "gpu.json"
    tuned.write_text(json.dumps({"machines": {"Some GPU (CUDA 13.0)": {"entries": {
        impl: {layer.key(): incumbent}}}}}))
    monkeypatch.setenv("CONVBENCH_TUNING", str(tuned))
    cases = [c for c in campaign.plan_cases("tune", "gpu", planted=False, space_dir=space)
             if c.impl == impl and c.layer == layer]
    params = [dict(c.params) for c in cases]
    default = dict(registry.get(impl).resolve_params({}))
    n = campaign.plan.TUNE_PER_LAYER[impl]
    assert params[:2] == [default, incumbent] and len(params) == 1 + n
    assert params[2:] == [p for p in ranked if p not in (default, incumbent)][:n - 1]


def test_tune_dry_run_fits_with_the_end_to_end_run(tmp_path, capsys):
    result = in_process(script, capsys)("--dry-run", "--tier", "tune", "--space",
                                        str(_space_dir(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "end2end" in result.stdout and "budget 15 min: fits" in result.stdout


def test_the_committed_space_plans_a_tune_tier_that_fits():
    """The table `gpu_campaign.py space` wrote: every configuration compiled or refused
    with its reason, and the tune plan from it, with the end-to-end run, within 15
    device-minutes."""
    data = json.loads((gpuspace.DEFAULT_OUT / "space.json").read_text())
    for impl, text in gpuspace.SPACES.items():
        entry = data["implementations"][impl]
        assert entry["space"] == text, f"{impl}: the space changed; run gpu_campaign.py space"
        assert {gpuspace.tag(c["params"]) for c in entry["configs"]} == \
            {gpuspace.tag(c) for c in gpuspace.space(impl)}
        assert all(c["verdict"] for c in entry["configs"])
    options = campaign.Options(tier="tune")
    text = campaign.format_plan(options, campaign.plan_cases("tune", "gpu", False))
    assert "budget 15 min: fits" in text, text


def test_tune_space_usage_errors(capsys):
    main = in_process(script, capsys)
    result = main("space", "--implementation", "directConvNCDHW")
    assert result.returncode == 2 and "no GPU search space" in result.stderr
    result = main("run", "--dry-run", "--tier", "tune", "--space", "/nonexistent")
    assert result.returncode == 2 and "space.json" in result.stderr


def _record(impl, layer, params, ms, status="verified"):
    return {"id": "x", "status": status, "case": {
        "impl": impl, "layer_set": "cosmoflow", "layer": layer, "target": "gpu",
        "group": "tune", "planted": "", "params": sorted(params.items())},
        "timings": {"dace": {"median_ms": ms}}}


def test_winners_are_the_fastest_verified_configuration(tmp_path, monkeypatch):
    layer = _layer("cosmoflow", "conv7", 16)
    ld = dataclasses.asdict(layer)
    default = dict(registry.get("implicitGemmNCDHW").resolve_params({}))
    fast = dict(default, CTAtileM=128, threadTileM=8)
    wrong = dict(default, CTAtileK=32)
    records = [_record("implicitGemmNCDHW", ld, default, 1.0),
               _record("implicitGemmNCDHW", ld, fast, 0.5),
               _record("implicitGemmNCDHW", ld, wrong, 0.1, status="wrong"),
               _record("implicitGemmsplitK", ld, dict(default, nsplitK=4), 0.4)]
    won = report.tune_winners(records)
    assert won["entries"]["implicitGemmNCDHW"][layer.key()] == fast
    assert "best" not in won  # the tier never times the untuned implementations
    row = next(r for r in won["rows"] if r[3] == "implicitGemmNCDHW")
    assert row[4] == "1.000" and row[6] == "0.500" and row[7] == "2.00"

    # unpack files them under the device; a build for that GPU takes them and says so.
    folder = tmp_path / "camp"
    folder.mkdir()
    (folder / "tuning.json").write_text(json.dumps({"device": "NVIDIA H200 (CUDA 13.0)",
                                                    "target": "gpu",
                                                    "entries": won["entries"]}))
    monkeypatch.setenv("CONVBENCH_TUNING", str(tmp_path / "gpu.json"))
    monkeypatch.setenv(tuning.GPU_ENV, "NVIDIA H200 (CUDA 13.0)")
    tuning.machine_id.cache_clear()
    try:
        campaign_cli.file_tuning(folder / "tuning.json")
        impl = registry.get("implicitGemmNCDHW")
        got = tuning.tuned_params(impl, layer, "gpu")
        assert dict(got) == fast
        assert tuning.best_implementation("fwd", layer, "gpu") is None
        # another GPU of the same architecture (sm_90) borrows them; one of another, not
        monkeypatch.setenv(tuning.GPU_ENV, "NVIDIA H100 80GB HBM3 (CUDA 13.0)")
        tuning.machine_id.cache_clear()
        assert dict(tuning.tuned_params(impl, layer, "gpu")) == fast
        monkeypatch.setenv(tuning.GPU_ENV, "NVIDIA A100-SXM4-80GB (CUDA 13.0)")
        tuning.machine_id.cache_clear()
        assert dict(tuning.tuned_params(impl, layer, "gpu")) == default
    finally:
        tuning.machine_id.cache_clear()


@pytest.mark.full
def test_tune_rehearsal_on_the_cpu_writes_winners_that_unpack_leaves_out(tmp_path, capsys):
    """The tune tier end to end on the CPU (the smoke layer; per pass's pipelined kernel
    its defaults and the best-ranked of its first four configurations): every case
    verified and timed, the Tuning table and tuning.json written, the training step run
    with the winners; unpack files no CPU rehearsal in tuning/gpu.json."""
    import tarfile
    pick = {impl: [gpuspace.tag(c) for c in gpuspace.space(impl)][:4]
            for impl in campaign.plan.TUNE_PER_LAYER}
    data = {"arch": "sm_90", "implementations": {
        impl: {"space": gpuspace.SPACES[impl], "configs": [
            {"params": c, "verdict": "ok", "layers": [], "registers": [40, 40],
             "blocks_per_sm": 1} for c in gpuspace.space(impl) if gpuspace.tag(c) in tags]}
        for impl, tags in pick.items()}}
    (tmp_path / "space.json").write_text(json.dumps(data))
    out = tmp_path / "tunecpu"
    result = in_process(script, capsys)("run", "--tier", "tune", "--target", "cpu", "--space",
                                        str(tmp_path), "--out", str(out), "--cachedir",
                                        str(tmp_path / "cache"), "--iterations", "3",
                                        "--warmup", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(p.read_text()) for p in (out / "cases").glob("*.json")]
    assert {r["case"]["impl"] for r in records} == set(pick)
    assert all(r["status"] == "verified" for r in records)
    won = json.loads((out / "tuning.json").read_text())
    assert set(won["entries"]) == set(pick) and won["target"] == "cpu"
    readme = (out / "README.md").read_text()
    assert "## Tuning" in readme and "## End to end" in readme
    assert json.loads((out / "end2end.json").read_text())["exit"] == 0, readme
    with tarfile.open(tmp_path / "c.tar.gz", "w:gz") as tar:
        tar.add(out, arcname=out.name)
    result = in_process(script, capsys)("unpack", str(tmp_path / "c.tar.gz"), "--into",
                                        str(tmp_path / "gpu"))
    assert result.returncode == 0 and "not filed" in result.stdout, result.stdout


# -- nvcc ------------------------------------------------------------------------------------------

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
@pytest.mark.full
def test_probe_compiles_a_configuration_and_refuses_one_that_spills():
    """Real nvcc output: the 8x8 register tile fits (over 64 registers, no spill); a 16x16
    register tile (256 accumulators per thread, more than the 255 registers a thread can
    have) spills, and the filter keeps it off the GPU."""
    layer = _layer("cosmoflow", "conv7", 16)
    base = dict(registry.get("implicitGemmNCDHW").resolve_params({}))
    ok = gpubuild.probe("implicitGemmNCDHW", "cosmoflow", layer,
                        dict(base, threadTileM=8, threadTileN=8))
    assert ok.reason is None, ok.reason
    main = ok.main
    assert main.registers > 64 and main.shared > 0 and main.threads == 64
    assert main.blocks_per_sm >= 1 and main.limiter
    big = dict(base, CTAtileM=128, CTAtileN=128, CTAtileK=16, threadTileM=16, threadTileN=16)
    spilled = gpubuild.probe("implicitGemmNCDHW", "cosmoflow", layer, big)
    assert spilled.reason and "spills" in spilled.reason, spilled.reason
