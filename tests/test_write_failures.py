"""Results that cannot be written: one line and exit status 2, never a traceback, whether the
problem is found when the paths are checked or strikes later in the run.

Each file-system failure is injected: a parent that cannot be made, no permission, a
read-only, virtual or full file system, at check time (``os.access``, ``os.statvfs`` and
the mount table answer as such a file system would) and during the run (the writes of
:mod:`convbench.base.files` fail with the system's error)."""

import errno
import os
import types
from pathlib import Path

import pytest

from cases import FIRST_SMALL, Case
from conftest import assert_usage_error, in_process
from convbench.timing import ceilings
from convbench.commands import profile_conv3d as cli
from convbench.base import files
from convbench.sweep import parts as sweep
from convbench.sweep import command as sweep_cmd
from convbench.layersets.layer import format_csv

IMPL = "directConvNCDHW"
CASE = Case(IMPL, FIRST_SMALL, "small")
OTHER = Case("implicitGemm", FIRST_SMALL, "small")


@pytest.fixture(autouse=True)
def stand_in_ceilings(monkeypatch):
    """The runs' ceilings (a large SGEMM, a copy and an FMA probe: about 7 s a run) as a
    stand-in: what is checked here is where the results go, measured or not."""
    monkeypatch.setattr(ceilings, "measure", lambda device: {
        "peak_gflops": 100.0, "peak_method": "stand-in", "bandwidth_gbs": 10.0,
        "bandwidth_method": "stand-in"})


@pytest.fixture
def small_csv(tmp_path):
    path = tmp_path / "small.csv"
    path.write_text(format_csv([FIRST_SMALL]))
    return path


def _profile(capsys, small_csv, cachedir, outdir):
    return in_process(cli, capsys)(
        "--implementation", IMPL, "--compareprof", "--verify", "--paramscsv", small_csv,
        "--device", "cpu", "--warmupiter", "0", "--totaliter", "2", "--threads", "1",
        "--loadprecompiled", "--cachedir", cachedir, "--outdir", outdir)


def _statvfs(**fields):
    real = os.statvfs

    def fake(path):
        st = real(path)
        values = {k: getattr(st, k) for k in dir(st) if k.startswith("f_")}
        values.update(fields)
        return types.SimpleNamespace(**values)
    return fake


# -- when the paths are checked -------------------------------------------------------------

def test_a_parent_that_cannot_be_made(tmp_path, capsys, small_csv):
    (tmp_path / "file").write_text("not a folder")
    assert_usage_error(_profile(capsys, small_csv, tmp_path, tmp_path / "file" / "run"),
                       "--outdir", "cannot create", "is not a folder")


def test_no_permission(tmp_path, capsys, small_csv, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == locked
                        else real(p, mode, **k))
    assert_usage_error(_profile(capsys, small_csv, tmp_path, locked / "run"),
                       "--outdir", f"{locked} is not writable")
    assert_usage_error(_profile(capsys, small_csv, tmp_path, locked), "is not writable")


def test_a_read_only_file_system(tmp_path, capsys, small_csv, monkeypatch):
    monkeypatch.setattr(os, "statvfs", _statvfs(f_flag=os.ST_RDONLY))
    assert_usage_error(_profile(capsys, small_csv, tmp_path, tmp_path / "run"),
                       "--outdir", "read-only file system")


def test_a_full_file_system(tmp_path, capsys, small_csv, monkeypatch):
    monkeypatch.setattr(os, "statvfs", _statvfs(f_bavail=0, f_blocks=1000))
    assert_usage_error(_profile(capsys, small_csv, tmp_path, tmp_path / "run"),
                       "--outdir", "full file system")


def test_a_virtual_file_system(tmp_path, capsys, small_csv, monkeypatch):
    # The real one where the machine has it; and any folder the mount table calls sysfs.
    if Path("/proc/self").is_dir():
        assert_usage_error(_profile(capsys, small_csv, tmp_path, "/proc/convbench-run"),
                           "--outdir", "virtual file system (proc")
    monkeypatch.setattr(files, "_mount_of", lambda path: ("/sys", "sysfs"))
    assert_usage_error(_profile(capsys, small_csv, tmp_path, tmp_path / "run"),
                       "virtual file system (sysfs")


# -- later, while results are written -------------------------------------------------------

def _fail_writes(monkeypatch, under, code, after=0):
    """Writes under ``under`` fail with ``code`` after the first ``after`` of them."""
    real = open
    count = [0]

    def failing(path, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax") and str(path).startswith(str(under)):
            count[0] += 1
            if count[0] > after:
                raise OSError(code, os.strerror(code), str(path))
        return real(path, mode, *args, **kwargs)
    monkeypatch.setattr(files, "open", failing, raising=False)
    return count


@pytest.mark.prebuild(CASE)
@pytest.mark.parametrize("code,words", [
    (errno.ENOSPC, "the disk or quota is full"),
    (errno.EROFS, "Read-only file system"),
    (errno.EACCES, "Permission denied"),
    (errno.ENOENT, "No such file or directory"),  # the folder went away, or a virtual one
])
def test_a_write_that_fails_during_the_run(code, words, builds, cachedir, tmp_path, capsys,
                                           small_csv, monkeypatch):
    out = tmp_path / "run"
    count = _fail_writes(monkeypatch, out, code, after=3)  # the first metadata goes through
    result = _profile(capsys, small_csv, cachedir, out)
    line = assert_usage_error(result, "cannot write", str(out), words)
    assert count[0] > 3, line


@pytest.mark.prebuild(CASE)
def test_a_folder_that_cannot_be_made_during_the_run(builds, cachedir, tmp_path, capsys,
                                                     small_csv, monkeypatch):
    out = tmp_path / "run"
    real = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == out:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert_usage_error(_profile(capsys, small_csv, cachedir, out), f"cannot create {out}",
                       "Permission denied")


@pytest.mark.prebuild(CASE, OTHER)
def test_sweep_part_that_cannot_write_fails_alone_and_merge_failure_is_one_line(
        builds, cachedir, tmp_path, capsys, small_csv, monkeypatch):
    """In a sweep, a part whose results cannot be written fails (recorded, the others go
    on); a merge that cannot write is one line and exit status 2."""
    run = tmp_path / "run"
    args = ["profile", "--implementation", f"{IMPL},implicitGemm", "--paramscsv", small_csv,
            "--device", "cpu", "--warmupiter", "0", "--totaliter", "2", "--threads", "1",
            "--cachedir", cachedir, "--outdir", run, "--executor", "debug"]
    _fail_writes(monkeypatch, run / "parts" / f"small-fwd-float32-{IMPL}" / "result",
                 errno.ENOSPC)
    result = in_process(sweep_cmd, capsys)(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    status = sweep.Sweep(run).status(sweep.Sweep(run).parts()[0])
    assert status["state"] == "failed" and "No space left" in status["error"]
    assert "1 of 2 part(s) complete" in result.stdout and "Traceback" not in result.stderr
    _fail_writes(monkeypatch, run / "small-fwd-float32", errno.EROFS)
    assert_usage_error(in_process(sweep_cmd, capsys)("--merge", run), "cannot write",
                       "Read-only file system", prefix="convbench sweep: error: ")
