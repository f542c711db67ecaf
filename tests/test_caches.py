"""The CPU's caches read from the machine (convkernels/cpu/caches.py), and the blockings
that follow them: the Winograd kernels' budgets, the int8 kernels' blocks, the build
cache's key and every run's metadata."""

import pytest

from convbench.layersets.layer import Layer
from convkernels.cpu import caches
from convkernels.cpu.caches import ENV, parse_size, read_sysfs


def _index(root, n, level, kind, size, shared="0"):
    d = root / f"index{n}"
    d.mkdir(parents=True)
    for name, text in (("level", str(level)), ("type", kind), ("size", size),
                       ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_sysfs_is_read(tmp_path):
    """A Xeon-like sysfs: 48K L1d, 2M L2, 105M L3 shared by 0-55 (the instruction cache is
    skipped)."""
    _index(tmp_path, 0, 1, "Data", "48K")
    _index(tmp_path, 1, 1, "Instruction", "32K")
    _index(tmp_path, 2, 2, "Unified", "2048K")
    _index(tmp_path, 3, 3, "Unified", "107520K", "0-55")
    assert read_sysfs(tmp_path) == {"l1d": 48 << 10, "l2": 2 << 20, "l3": 107520 << 10,
                                    "l3_sharing": 56}
    assert read_sysfs(tmp_path / "nothing") is None  # no L2: the reference caches


def test_sizes_and_the_override(monkeypatch):
    assert parse_size("32K") == 32768 and parse_size("2M") == 2 << 20
    assert parse_size("1048576") == 1 << 20 and parse_size("1G") == 1 << 30
    with pytest.raises(caches.CachesError, match="not a size"):
        parse_size("lots")
    monkeypatch.setenv(ENV, "l2=512K")
    c = caches.caches()
    assert (c.l2, c.l3, c.source) == (512 << 10, caches.REFERENCE["l3"], f"${ENV}")
    monkeypatch.setenv(ENV, "l4=1M")
    with pytest.raises(caches.CachesError, match="unknown cache 'l4'"):
        caches.caches()


def test_a_bad_setting_is_one_line(monkeypatch, capsys):
    """A command run with a bad ``$CONVBENCH_CACHES`` says so on one line, status 2."""
    from convbench.commands import int8 as command
    monkeypatch.setenv(ENV, "l2=lots")
    assert command.main(["verify", "--kernel", "winograd", "--layer", "conv3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "$CONVBENCH_CACHES: not a size: 'lots'" in err, err


#: A layer with many tiles (MLPerf conv3 at batch 2): the forward's blocks are cut until
#: they fit half the L2.
MANY = Layer("many", batch=2, in_channels=64, out_channels=128, in_d=32, in_h=32, in_w=32,
             k_d=3, k_h=3, k_w=3, stride=1, pad=1)


def test_the_winograd_blocking_follows_the_l2(monkeypatch):
    """Half the L2 holds a block's V and M: a larger L2 gives the forward more tiles or
    channels per block, and the int8 kernel more tiles."""
    from convbench import registry
    from convkernels.cpu.winograd import forward, int8 as wq
    from convkernels.layer import layer_constants
    from convkernels.layouts import Layout
    L = layer_constants(MANY, Layout.NDHWC)
    params = registry.get("winogradF2").resolve_params({})
    per_l2 = {}
    for l2 in ("512K", "2M", "8M"):
        monkeypatch.setenv(ENV, f"l2={l2}")
        b = forward.blocking(L, params, threads=2)
        assert 4 * 64 * b.T * (b.CB + b.KG) <= forward.scratch_bytes() or b.T <= b.RT
        p8 = {"ISA": 1, "T": 0, "NV": 0, "RT": 0, "KQ": 0, "GROUP": 2, "OUT": 1, "PLANT": 0}
        per_l2[l2] = (b.T * (b.CB + b.KG), wq.blocking(MANY, p8)[0])
    small, ref, big = per_l2["512K"], per_l2["2M"], per_l2["8M"]
    assert small[0] < ref[0] < big[0], per_l2      # the forward's block grows with the L2
    assert small[1] < ref[1] <= big[1], per_l2     # so does the int8 kernel's


def test_the_build_key_and_the_metadata_name_the_caches(monkeypatch, tmp_path):
    from convbench import registry
    from convbench.build import cache, toolchain
    from convbench.build.toolchain import PROJECT_ROOT
    from convbench.results.writer import run_metadata
    spec = toolchain.make_spec(registry.get("winogradF2"), MANY, "float32", "cpu")
    monkeypatch.setenv(ENV, "l2=1M")
    one = cache.cache_key(spec)
    meta = run_metadata(PROJECT_ROOT, "cpu", 1)["caches"]
    monkeypatch.setenv(ENV, "l2=2M")
    assert one["caches"]["l2"] == 1 << 20 and cache.cache_key(spec) != one
    assert meta["l2_kib"] == 1024 and meta["source"] == f"${ENV}" and meta["cpus"] >= 1
