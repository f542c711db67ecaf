"""The build cache: precompiled loads compile nothing; stale, truncated and missing
entries are caught; concurrent builders do not corrupt an entry; GPU host code is
portable."""

import json
import os
import shutil
import subprocess
import textwrap

import dace
import pytest

from conftest import ENV, PYTHON, ROOT
from convbench import registry
from convbench.build import cache, toolchain
from convbench.commands import profile_conv3d as cli
from convbench.build.cache import BuildCache, CacheMiss
from convbench.layersets.layer import Layer

IMPL = "implicitGemm"
LAYER = Layer("tiny", 1, 3, 4, 6, 5, 7, 3, 3, 3, 1, 1)
CSV = ("layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
       "tiny,1,3,4,6,5,7,3,3,3,1,1\ntiny2,2,2,3,5,5,5,3,3,3,2,0\n")


def spec(target="cpu"):
    return toolchain.make_spec(registry.get(IMPL), LAYER, "float32", target)


@pytest.fixture(scope="module")
def _pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine") / "cache"
    b = BuildCache(root).get(spec(), policy="rebuild", load=False)
    assert b.origin == "built"
    return root


@pytest.fixture
def built(_pristine, tmp_path):
    """A cache folder of the test's own holding one valid CPU build of LAYER (a copy of
    one compiled once for the module: the cache is relocatable)."""
    shutil.copytree(_pristine, tmp_path / "cache")
    return BuildCache(tmp_path / "cache")


class NoCompile(Exception):
    pass


def forbid_compiling(monkeypatch):
    """Make every way to produce a build fail loudly."""
    def boom(*args, **kwargs):
        raise NoCompile("tried to parse, transform or compile")
    monkeypatch.setattr(toolchain, "compile_spec", boom)
    monkeypatch.setattr(toolchain, "make_sdfg", boom)
    monkeypatch.setattr(dace.SDFG, "compile", boom)
    monkeypatch.setattr(dace.frontend.python.parser.DaceProgram, "to_sdfg", boom)


def test_manifest_records_the_key_and_checksums(built):
    manifest = json.loads((built.entry(spec()) / cache.MANIFEST).read_text())
    key = manifest["key"]
    assert key["impl"] == IMPL and key["layer"] == LAYER.key() and key["target"] == "cpu"
    assert key["dtype"] == "float32" and key["params"] == {}
    assert len(key["source_sha256"]) == 64
    assert key["toolchain"]["dace"] == dace.__version__
    assert "compiler.cpu.args" in key["toolchain"]["config"]
    assert key["toolchain"]["native_march"]  # CPU builds keep -march=native: recorded
    assert manifest["library"].endswith(".so")
    assert set(manifest["files"]) >= {manifest["library"], "program.sdfg"}
    assert not os.path.isabs(manifest["library"])  # relocatable


def test_load_compiles_nothing(built, monkeypatch):
    forbid_compiling(monkeypatch)
    b = built.get(spec(), policy="require")
    assert b.origin == "loaded" and b.program is not None
    with pytest.raises(NoCompile):  # the guard works: a rebuild would have been caught
        built.get(spec(), policy="rebuild")


def test_later_loads_read_the_pickle_and_fall_back_to_the_json(built, monkeypatch):
    """The first load writes a pickle of the SDFG named after program.sdfg's checksum; a
    later load makes its program from the pickle, not the JSON, and computes the same; an
    unreadable pickle leaves the JSON to be read (and is written again)."""
    import gc
    import pickle

    import numpy as np
    b = built.get(spec(), policy="require")
    entry = built.entry(spec())
    manifest = json.loads((entry / cache.MANIFEST).read_text())
    pickled = entry / f"program.{manifest['files']['program.sdfg']['sha256'][:16]}.pickle"
    assert [p.name for p in entry.glob("program.*.pickle")] == [pickled.name]
    rng = np.random.default_rng(0)
    args = {n: rng.random(d.shape, dtype=np.float32) for n, d in b.sdfg.arrays.items()
            if not d.transient}
    want = {n: a.copy() for n, a in args.items()}
    b(**want)
    del b
    gc.collect()  # no one holds the program: the next load makes a new one
    real, read = dace.SDFG.from_file, []
    monkeypatch.setattr(dace.SDFG, "from_file", lambda *a, **k: read.append(a) or real(*a, **k))
    built.get(spec(), policy="require")(**args)
    assert read == [] and all(np.array_equal(args[n], want[n]) for n in args)
    pickled.write_bytes(b"not a pickle")
    assert built.get(spec(), policy="require").sdfg.arglist().keys() == args.keys()
    assert len(read) == 1 and pickle.loads(pickled.read_bytes()).name == manifest["key"]["name"]


def test_cli_loadprecompiled_builds_nothing(tmp_path, monkeypatch, capsys):
    path = tmp_path / "layers.csv"
    path.write_text(CSV)
    common = ["--implementation", IMPL, "--device", "cpu", "--paramscsv", str(path),
              "--cachedir", str(tmp_path / "cache"), "--verify"]
    assert cli.main(common) == 0
    assert capsys.readouterr().out.count(" built ") == 2
    forbid_compiling(monkeypatch)
    assert cli.main(common + ["--loadprecompiled"]) == 0
    out = capsys.readouterr().out
    assert out.count(" loaded ") == 2 and " built " not in out and out.count("PASS") == 2


def test_require_precompiled_miss_fails_the_layer(tmp_path, monkeypatch, capsys):
    path = tmp_path / "layers.csv"
    path.write_text(CSV)
    forbid_compiling(monkeypatch)
    rc = cli.main(["--implementation", IMPL, "--device", "cpu", "--paramscsv", str(path),
                   "--cachedir", str(tmp_path / "empty"), "--verify", "--require-precompiled"])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.count("ERROR CacheMiss: no usable precompiled build") == 2
    assert "no stored build" in out


def test_source_change_makes_entry_stale(built, monkeypatch, tmp_path):
    impl = registry.get(IMPL)
    assert built.inspect(spec()).valid
    # A copy of the implementation's sources, one of them edited, stands in for an edit.
    copies = []
    for n, f in enumerate(impl.source_files()):  # one folder each: names repeat in packages
        copy = tmp_path / "src" / f"{n:04d}" / os.path.basename(f)
        copy.parent.mkdir(parents=True)
        shutil.copy(f, copy)
        copies.append(str(copy))
    monkeypatch.setattr(type(impl), "source_files", lambda self: copies)
    assert built.inspect(spec()).valid  # same text, same hash
    with open(copies[-1], "a") as f:
        f.write("\n# an edit\n")
    found = built.inspect(spec())
    assert found.status == "stale" and "source_sha256" in found.reason
    with pytest.raises(CacheMiss, match="stale"):
        built.get(spec(), policy="require")
    assert built.get(spec(), policy="reuse", load=False).origin == "built"
    assert built.inspect(spec()).valid


def test_flag_change_makes_entry_stale(built):
    args = dace.config.Config.get("compiler", "cpu", "args")
    with dace.config.set_temporary("compiler", "cpu", "args", value=args + " -funroll-loops"):
        found = built.inspect(spec())
        assert found.status == "stale"
        assert "toolchain.config.compiler.cpu.args" in found.reason
    assert built.inspect(spec()).valid


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip"])
def test_damaged_library_is_detected_and_rebuilt(built, damage):
    manifest = json.loads((built.entry(spec()) / cache.MANIFEST).read_text())
    lib = built.entry(spec()) / manifest["library"]
    if damage == "truncate":
        lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
        words = "truncated"
    elif damage == "delete":
        lib.unlink()
        words = "missing"
    else:
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 0xFF
        lib.write_bytes(bytes(data))
        words = "checksum"
    found = built.inspect(spec())
    assert found.status == "corrupt" and words in found.reason
    with pytest.raises(CacheMiss, match=words):
        built.get(spec(), policy="require")
    assert built.get(spec(), policy="reuse", load=False).origin == "built"
    assert built.inspect(spec()).valid


def test_cache_folder_is_relocatable(built, tmp_path, monkeypatch):
    moved = tmp_path / "elsewhere"
    shutil.move(str(built.root), str(moved))
    forbid_compiling(monkeypatch)
    assert BuildCache(moved).get(spec(), policy="require").origin == "loaded"


def test_planted_build_has_its_own_entry(built):
    """A build with a planted bug is keyed apart: neither is ever served for the other."""
    real = spec()
    planted = toolchain.make_spec(registry.get(IMPL), LAYER, "float32", "cpu", planted="bug")
    assert planted.name != real.name and "planted_bug" in planted.name
    assert cache.cache_key(planted) != cache.cache_key(real)
    with pytest.raises(CacheMiss, match="no stored build"):
        built.get(planted, policy="require")
    assert built.get(planted, policy="reuse", load=False).origin == "built"
    assert built.get(real, policy="require").folder == built.entry(real)
    assert sorted(built.entries()) == sorted([built.entry(real), built.entry(planted)])


def test_key_uses_placeholders_for_local_folders():
    flags = json.dumps(toolchain.toolchain_flags("gpu"))
    assert str(toolchain.PROJECT_ROOT) not in flags and "<project>" in flags


def test_gpu_host_code_is_portable():
    config = toolchain.toolchain_flags("gpu")["config"]
    assert "-march=native" not in config["compiler.cpu.args"]
    assert "-march=native" not in config["compiler.cuda.args"]
    assert toolchain.PORTABLE_MARCH in config["compiler.cpu.args"]
    assert "native_march" not in toolchain.toolchain_flags("gpu")


_BUILDER = textwrap.dedent("""
    import json, sys, time, warnings
    warnings.simplefilter("ignore")
    from convbench import registry
    from convbench.build import toolchain
    from convbench.build.cache import BuildCache
    from convbench.layersets.layer import Layer
    layer = Layer("tiny", 1, 3, 4, 6, 5, 7, 3, 3, 3, 1, 1)
    spec = toolchain.make_spec(registry.get("implicitGemm"), layer, "float32", "cpu")
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: the parent releases both processes together
    start = time.time()
    build = BuildCache(sys.argv[1]).get(spec, policy="reuse", load=True)
    print(json.dumps({"origin": build.origin, "start": start, "end": time.time()}))
""")


def test_concurrent_builders_share_one_build(tmp_path):
    """Four processes, released together, ask for the same missing build: one compiles it
    (in the entry's own build folder, never one that another process uses), the others
    wait for the lock and load the finished result; none loads a half-written entry, and
    the cache holds one valid entry."""
    procs = [subprocess.Popen([PYTHON, "-c", _BUILDER, str(tmp_path / "cache")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
             for _ in range(4)]
    try:
        for p in procs:  # both have imported everything and made the spec
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    runs = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outs),
                  key=lambda r: r["origin"])
    assert [r["origin"] for r in runs] == ["built"] + ["loaded"] * 3  # the others waited
    builder, loaders = runs[0], runs[1:]
    # They overlapped: each loader asked before the builder was done, and got its build after.
    for loader in loaders:
        assert loader["start"] < builder["end"] <= loader["end"], runs
    c = BuildCache(tmp_path / "cache")
    assert c.inspect(spec()).valid
    assert list(c.entries()) == [c.entry(spec())]
