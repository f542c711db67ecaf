"""The toolchain's chatter, kept off the terminal: DaCe's warnings and its parser's
progress bars.

A build of a register-blocked kernel raises dozens of ``UserWarning`` lines about memlet
propagation and bounds that say nothing about the result (a CosmoFlow end-to-end run
printed 578 of them among 670 lines).  By default :func:`captured` records the warnings
raised while a build is made and writes them to the build folder's ``toolchain.log`` and
to the run's log file (:func:`set_run_log`, e.g. ``<outdir>/toolchain.log``), and DaCe's
progress bars are off (:func:`progress_setting`).  ``-v`` (:func:`set_verbose`,
``$CONVBENCH_VERBOSE=1``) shows them on standard error as before.  Both settings live in
the environment, so build workers in other processes follow them.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Iterator, Optional

VERBOSE_ENV = "CONVBENCH_VERBOSE"
#: The run's log file that captured chatter is appended to (besides the build's own).
LOG_ENV = "CONVBENCH_TOOLCHAIN_LOG"
#: The file name of the chatter in a build folder and in a run's output folder.
LOG_NAME = "toolchain.log"


def add_verbose_flag(p) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the toolchain's messages (DaCe's warnings and progress bars) on "
                   f"the terminal; by default they go to {LOG_NAME} in each build's folder "
                   "(and in the output folder of cosmoflow_end2end.py)")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


#: The setting the process started with ($CONVBENCH_VERBOSE), which a run without -v keeps.
_STARTED_WITH = os.environ.get(VERBOSE_ENV)


def set_verbose(on: bool) -> None:
    """Show the chatter (``-v``), in this process and the workers it starts; without it,
    the setting the process started with (a run in the same process after one with -v is
    quiet again)."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
    elif _STARTED_WITH is None:
        os.environ.pop(VERBOSE_ENV, None)
    else:
        os.environ[VERBOSE_ENV] = _STARTED_WITH


def set_run_log(path: Optional[Path], fresh: bool = False) -> None:
    """Append captured chatter to ``path`` too (None: to the build folders only); ``fresh``:
    remove what an earlier run left there."""
    if path is None:
        os.environ.pop(LOG_ENV, None)
        return
    path = Path(path).resolve()
    if fresh:
        path.unlink(missing_ok=True)
    os.environ[LOG_ENV] = str(path)


def progress_setting() -> bool:
    """DaCe's ``progress`` setting: its parser's progress bars only with ``-v``."""
    return verbose()


@contextlib.contextmanager
def captured(build_log: Path, title: str = "") -> Iterator[None]:
    """Record the Python warnings raised in the block and write them to ``build_log`` and
    the run's log (``title`` heads them there); with ``-v`` they are shown instead."""
    if verbose():
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            text = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                           for w in caught)
            if text:
                _append(Path(build_log), text)
                if os.environ.get(LOG_ENV):
                    _append(Path(os.environ[LOG_ENV]),
                            f"--- {title or Path(build_log).parent.name}\n{text}")


def _append(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(text)
    except OSError:  # a log that cannot be written loses the chatter, not the build
        pass
