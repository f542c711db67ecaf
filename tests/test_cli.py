"""profile_conv3d.py: bad input gets one line and exit status 2; --verify runs and reports."""

import dataclasses
import subprocess

import pytest

from cases import FIRST_SMALL, Case, fast_layers
from conftest import ENV, PYTHON, ROOT
from convbench import registry
from convbench.commands import profile_conv3d as cli
from convbench.timing import devices
from convbench.layersets.layer import Layer, format_csv

HEADER = "layer,batch,in_channels,out_channels,in_d,in_h,in_w,k_d,k_h,k_w,stride,pad\n"
TINY = HEADER + "t1,1,2,3,4,5,6,3,3,3,1,0\nt2,2,3,4,5,5,5,3,3,3,2,1\n"


def run_cli(*args):
    return subprocess.run([PYTHON, str(ROOT / "profile_conv3d.py"), *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=600)


def assert_usage_error(capsys, args, words):
    assert cli.main(list(args)) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("profile_conv3d.py: error: ")
    assert words in lines[0], lines[0]
    assert "Traceback" not in out + err
    return lines[0]


@pytest.mark.parametrize("body, words", [
    (HEADER.replace(",pad", ""), "missing column 'pad'"),
    (HEADER.strip() + ",extra\n", "unknown column 'extra'"),
    (HEADER + "a,1,1,1,4,four,4,3,3,3,1,0\n", ":2: field 'in_h': not an integer"),
    (HEADER + "a,1,1,1,0,4,4,3,3,3,1,0\n", ":2: field 'in_d': must be a positive integer"),
    (HEADER + "a,1,1,-1,4,4,4,3,3,3,1,0\n", ":2: field 'out_channels'"),
    (HEADER + "a,1,1,1,4,4,4,5,3,3,1,0\n", ":2: field 'k_d': kernel size 5 is larger"),
    (HEADER + "a,1,1,1,4,4,4,3,3,3,0,0\n", ":2: field 'stride'"),
    (HEADER + "a,1,1,1,4,4,4,3,3,3,1,-1\n", ":2: field 'pad'"),
    ("", "empty file"),
    (HEADER + "a,1,1,1,4,4,4,3,3,3,1,0\na,1,1,1,4,4,4,3,3,3,1,0\n", ":3: field 'layer': duplicated"),
    ("InChannel,InputDepth,InputHeight,InputWidth,KernelDepth,KernelHeight,KernelWidth,"
     "OutputChannel,OutputDepth,OutputHeight,OutputWidth\n1,10,10,10,3,3,3,4,8,8,9\n",
     ":2: field 'OutputWidth': output size 9 is inconsistent"),
])
def test_bad_csv(capsys, write_csv, body, words):
    path = write_csv(body)
    line = assert_usage_error(capsys, ["--verify", "--device", "cpu", "--paramscsv", str(path)],
                              words)
    assert str(path) in line  # names the file


@pytest.mark.parametrize("args, words", [
    (["--paramscsv", "nosuchset"], "no layer set or file named 'nosuchset'"),
    (["--implementation", "nosuch"], "unknown implementation 'nosuch' (known: "),
    (["--currlayer", "7"], "--currlayer: 7 is out of range"),
    (["--currlayer", "3", "--lastlayer", "2"], "--lastlayer: 2 must be in 4..7"),
    (["--lastlayer", "9"], "--lastlayer: 9"),
    (["--currlayer", "x"], "argument --currlayer: invalid int value"),
    (["--batch", "0"], "--batch: must be a positive integer"),
    (["--batch", "-3"], "--batch: must be a positive integer"),
    (["--batch", "two"], "argument --batch: invalid int value"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
    (["--param", "tile"], "--param: expected NAME=VALUE"),
    (["--param", "tileM=8"], "implicitGemmNCDHW has no parameter 'tileM'"),
    (["--param", "CTAtileM=48"], "CTAtileM=48: must be a power of two"),
    (["--param", "CTAtileK=8"], "CTAtileK=8 must be a multiple of CTAtileM/threadTileM=16"),
    (["--param", "threadTileM=0"], "threadTileM must be >= 1"),
    (["--param", "CTAtileM=1024", "--param", "CTAtileN=1024"], "threads > 1024"),
    (["--nosuchflag"], "unrecognized arguments: --nosuchflag"),
    ([], "nothing to do"),
])
def test_bad_flags(capsys, args, words):
    # Every case but the last adds --verify; the last checks that an action is required.
    action = ["--verify"] if args else []
    assert_usage_error(capsys, [*action, "--device", "cpu", *args], words)


def test_unknown_implementation_lists_known(capsys):
    assert cli.main(["--implementation", "nosuch", "--verify"]) == 2
    err = capsys.readouterr().err
    for name in registry.all_implementations():
        assert name in err


@pytest.mark.skipif(devices.gpu_usable(), reason="a GPU is usable here")
def test_gpu_requested_without_one(capsys):
    assert_usage_error(capsys, ["--verify", "--device", "gpu"], "--device gpu: ")


def test_subprocess_one_line_no_traceback(write_csv):
    """The real program, in its own process: exit status 2, one line, no traceback."""
    path = write_csv(HEADER + "a,1,1,1,4,4,4,3,3,3,1,-2\n")
    for args in (["--verify", "--paramscsv", str(path)], ["--implementation", "bogus"]):
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_list(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in registry.all_implementations():
        assert f"\n{name}\n" in f"\n{out}"
    assert "layout: NDHWC" in out and "targets: cpu, gpu" in out


#: Two layers of the fast tier's for directConvNCDHW (tests/cases.py): the small first
#: layer (batch 1) and the odd one (batch 2), whose builds the session makes anyway.
END2END = [FIRST_SMALL, fast_layers("directConvNCDHW")[-1][1]]
DEFAULT_IMPL = registry.default("cli", "fwd")


@pytest.mark.prebuild(*[Case("directConvNCDHW", layer, "e2e") for layer in END2END],
                      Case(DEFAULT_IMPL, FIRST_SMALL, "small"))
def test_verify_end_to_end(write_csv, builds, cachedir, capsys):
    assert END2END[1].batch != 1
    path = write_csv(format_csv(END2END))
    cache = ["--cachedir", str(cachedir), "--loadprecompiled"]  # the session's builds
    assert cli.main(["--verify", "--device", "cpu", "--paramscsv", str(path), "--implementation",
                     "directConvNCDHW", *cache]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert sum("PASS" in line for line in lines) == 2
    assert "max abs" in out and "max rel" in out
    assert lines[-1] == "directConvNCDHW: 2 passed, 0 failed, 0 unsupported (of 2 layers)"
    # --currlayer/--lastlayer and --batch: the second layer alone, at batch 1 (the small
    # layer, given at batch 2), with the default implementation
    path = write_csv(format_csv([END2END[1], FIRST_SMALL.with_batch(2)]), "second.csv")
    assert cli.main(["--verify", "--device", "cpu", "--paramscsv", str(path), "--currlayer", "1",
                     "--lastlayer", "2", "--batch", "1", *cache]) == 0
    out = capsys.readouterr().out
    assert f"{FIRST_SMALL.name} " in out and f"{END2END[1].name} " not in out
    assert " b1" in out and " b2" not in out and DEFAULT_IMPL in out


def _with_toy(monkeypatch, **changes):
    impls = dict(registry.all_implementations())
    toy = dataclasses.replace(impls["directConvNCDHW"], name="toy", **changes)
    impls["toy"] = toy
    monkeypatch.setattr(registry, "_REGISTRY", impls)
    return toy


def test_unsupported_and_strict(monkeypatch, capsys, write_csv, tmp_path):
    _with_toy(monkeypatch, supports=lambda layer, params: "needs stride 1"
              if layer.stride != 1 else None, constraints="stride 1")
    path = str(write_csv(TINY))
    args = ["--verify", "--device", "cpu", "--implementation", "toy", "--paramscsv", path,
            "--cachedir", str(tmp_path), "--loadprecompiled"]  # the second run loads t1
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "t2" in out and "unsupported: needs stride 1" in out
    assert "1 passed, 0 failed, 1 unsupported" in out
    assert cli.main(args + ["--strict"]) == 1
    assert "FAIL (--strict)" in capsys.readouterr().out


def test_failing_layer_exits_1(monkeypatch, capsys, write_csv, tmp_path):
    from test_verify import _direct, off_by_one_tap
    _with_toy(monkeypatch, algorithm=_direct(off_by_one_tap).algorithm)
    path = str(write_csv(HEADER + "t1,1,2,3,4,5,6,3,3,3,1,0\n"))
    assert cli.main(["--verify", "--device", "cpu", "--implementation", "toy", "--paramscsv",
                     path, "--cachedir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "0 passed, 1 failed" in out


def test_layer_describe():
    assert Layer("a", 2, 3, 4, 5, 5, 5, 3, 3, 3, 2, 1).describe() == "3->4 @5^3 k3^3 s2 p1 b2"
