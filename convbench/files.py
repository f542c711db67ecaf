"""Writing files so that no reader ever sees half of one."""

import contextlib
import os
import threading
from pathlib import Path
from typing import Union


def write_atomic(path: Union[str, os.PathLike], data: Union[str, bytes], sync: bool = False) -> Path:
    """Write ``data`` (text or bytes) to ``path`` through a temporary file in the same
    folder and a rename, so that readers see the old file or the new one, never a part.
    ``sync`` also flushes the data to disk before the rename (for a cache that other
    processes trust).  Returns the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def writable_folder_problem(path: Union[str, os.PathLike]) -> Union[str, None]:
    """Why ``path`` cannot be (or become) a folder this process writes into, or None.

    A folder that exists must be writable; one that does not is created later, so its
    nearest existing ancestor must be a writable folder.  Nothing is created here."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return "exists and is not a folder"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable"
        return None
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                return f"cannot be created: {parent} is not a folder"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"cannot be created: {parent} is not writable"
            return None
    return "has no existing ancestor"


def output_file_problem(path: Union[str, os.PathLike]) -> Union[str, None]:
    """Why ``path`` cannot be written as a file, or None (its folder is created later)."""
    path = Path(path)
    if path.is_dir():
        return "is a folder"
    if path.exists() and not os.access(path, os.W_OK):
        return "is not writable"
    return writable_folder_problem(path.parent) if not path.exists() else None
