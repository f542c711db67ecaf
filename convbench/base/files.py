"""Writing files so that no reader ever sees half of one, and saying in one line why a
file cannot be written.

Results are checked before a run starts (:func:`writable_folder_problem`: a parent that
cannot be made, no permission, a read-only, full or virtual file system) and again where
they are written: every write here turns an ``OSError`` into :class:`WriteError`, which the
command-line tools print as one line with exit status 2 (:func:`convbench.base.errors.run_main`).
"""

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import Optional, Union

#: File systems that hold no files of ours: kernel interfaces mounted as folders.
VIRTUAL_FILE_SYSTEMS = frozenset((
    "proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
    "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc", "nsfs"))


class WriteError(Exception):
    """A file or folder could not be written: the path and the system's reason, in one line."""

    exit_status = 2

    def __init__(self, path, err: OSError, doing: str = "write"):
        self.path, self.errno = str(path), err.errno
        reason = err.strerror or str(err)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            reason += " (the disk or quota is full)"
        super().__init__(f"cannot {doing} {self.path}: {reason}")


def make_folder(path: Union[str, os.PathLike]) -> Path:
    """``mkdir -p path``; :class:`WriteError` where it cannot be made."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(path, err, "create") from None
    return path


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes], sync: bool = False) -> Path:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file in the same
    folder and a rename, so that readers see the old file or the new one, never a part.
    ``sync`` also flushes the data to disk before the rename (for a cache that other
    processes trust).  Returns the path; :class:`WriteError` where it cannot be written
    (the old file, if any, is left as it was)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise WriteError(path, err) from None
        raise
    return path


def _mount_of(path: Path):
    """``(mount point, file system type)`` of the mount that holds ``path`` (an existing
    path), from /proc/self/mountinfo; ``(None, None)`` where it cannot be read."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, None
    target, best = str(path.resolve()), (None, None)
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split()[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best[0] is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best


def file_system_problem(path: Union[str, os.PathLike]) -> Optional[str]:
    """Why the file system that holds ``path`` (an existing folder) takes no files: a
    virtual one, mounted read-only, or full; None where none of these is known."""
    path = Path(path)
    point, fstype = _mount_of(path)
    if fstype in VIRTUAL_FILE_SYSTEMS:
        return f"is on a virtual file system ({fstype} at {point}), which holds no files"
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "is on a read-only file system"
    if st.f_bavail == 0 and st.f_blocks > 0:
        return "is on a full file system (no free blocks)"
    if st.f_favail == 0 and st.f_files > 0:
        return "is on a file system with no free inodes"
    return None


def writable_folder_problem(path: Union[str, os.PathLike]) -> Union[str, None]:
    """Why ``path`` cannot be (or become) a folder this process writes into, or None.

    A folder that exists must be writable; one that does not is created later, so its
    nearest existing ancestor must be a writable folder.  Either must sit on a file system
    that takes files (:func:`file_system_problem`).  Nothing is created here."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return "exists and is not a folder"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable"
        return file_system_problem(path)
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                return f"cannot be created: {parent} is not a folder"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"cannot be created: {parent} is not writable"
            problem = file_system_problem(parent)
            return f"cannot be created: {parent} {problem}" if problem else None
    return "has no existing ancestor"


def output_file_problem(path: Union[str, os.PathLike]) -> Union[str, None]:
    """Why ``path`` cannot be written as a file, or None (its folder is created later)."""
    path = Path(path)
    if path.is_dir():
        return "is a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable"
    return writable_folder_problem(path.parent) if not path.exists() else None
