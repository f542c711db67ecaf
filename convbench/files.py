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
