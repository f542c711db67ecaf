"""A progress bar for long work (compiles, sweeps, timing loops), drawn by tqdm.

On a terminal tqdm redraws one line: ``label [#####.....] 5/10 12.3s ETA 12s  note``.
Elsewhere (CI logs, pipes) the bar is never drawn, so no carriage returns reach the log;
instead, with ``lines`` every update with a note becomes one line, and with
``heartbeat`` (seconds) the bar's text is printed as a line at most that often, so a
long step still shows signs of life.
"""

import sys
import time
from typing import Optional, TextIO

from tqdm import tqdm


class _Bar(tqdm):
    """tqdm with this project's line: the note of the latest update and an ETA only while
    work is under way (from the average rate, not tqdm's smoothed one)."""

    monitor_interval = 0  # no monitor thread: nothing redraws behind the caller's back
    note = ""

    @property
    def format_dict(self):
        fmt = super().format_dict
        n, total, elapsed = fmt["n"], fmt["total"], fmt["elapsed"]
        fmt["eta_text"] = (f" ETA {elapsed / n * (total - n):.0f}s"
                           if total and 0 < n < total else "")
        fmt["note"] = f"  {self.note}" if self.note else ""
        return fmt


def _desc(label: str) -> str:
    return f"{label} " if label else ""


class Progress:
    """``with Progress(total, label=...) as bar: ... bar.update(note=...)``.

    ``enabled`` forces drawing on (or off); by default the bar is drawn when ``stream``
    (standard error unless given) is a terminal.  ``lines`` and ``heartbeat`` apply only
    when it is not drawn.  ``done`` and ``label`` may be set while it runs.
    """

    def __init__(self, total: int, label: str = "", stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, lines: bool = False, width: int = 24,
                 heartbeat: Optional[float] = None):
        self.total = max(int(total), 0)
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.live = isatty if enabled is None else enabled
        self.lines = lines and not self.live
        self.heartbeat = heartbeat if not self.live else None
        self._last_beat = time.perf_counter()
        self._label = label
        # When not drawn, an infinite delay keeps tqdm from ever writing to the stream (not
        # even when closing), while it still counts and formats the text of the log lines.
        self._bar = _Bar(total=self.total, desc=_desc(label), file=self.stream,
                         delay=0 if self.live else float("inf"), leave=False, position=0,
                         mininterval=0.1, smoothing=0, ascii=".#",
                         bar_format=f"{{desc}}[{{bar:{width}}}] {{n_fmt}}/{{total_fmt}} "
                                    "{elapsed_s:.1f}s{eta_text}{note}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def label(self) -> str:
        return self._label

    @label.setter
    def label(self, value: str) -> None:  # shown from the next redraw on
        self._label = value
        self._bar.set_description_str(_desc(value), refresh=False)

    @property
    def done(self) -> int:
        return self._bar.n

    @done.setter
    def done(self, value: int) -> None:
        self._bar.n = value

    def text(self, note: str = "") -> str:
        """The bar's line, with ``note`` after it."""
        self._bar.note = note
        return str(self._bar)

    def update(self, n: int = 1, note: str = "") -> None:
        if self.total:
            n = min(n, self.total - self.done)
        self._bar.note = note
        self._bar.update(n)
        if self.lines and note:
            print(f"[{self.done}/{self.total}] {note}", file=self.stream, flush=True)
        now = time.perf_counter()
        if self.heartbeat is not None and now - self._last_beat >= self.heartbeat:
            self._last_beat = now
            print(self.text(note), file=self.stream, flush=True)

    def close(self) -> None:
        """Erase the bar (the caller prints the outcome)."""
        self._bar.close()
