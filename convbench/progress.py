"""A small progress bar for long work (compiles, sweeps, timing loops).

On a terminal it redraws one line: ``label [#####.....] 5/10 12.3s ETA 12s  note``.
Elsewhere (CI logs, pipes) it prints nothing while running, except: with ``lines``
every update with a note becomes one line, and with ``heartbeat`` (seconds) the bar's
text is printed as a line at most that often, so a long step still shows signs of life.
"""

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(self, total: int, label: str = "", stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, lines: bool = False, width: int = 24,
                 heartbeat: Optional[float] = None):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.live = isatty if enabled is None else enabled
        self.lines = lines and not self.live
        self.heartbeat = heartbeat if not self.live else None
        self._last_beat = time.perf_counter()
        self.width = width
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False

    def __enter__(self):
        self._draw("", force=True)
        return self

    def __exit__(self, *exc):
        self.close()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def text(self, note: str = "") -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = self.elapsed()
        eta = ""
        if 0 < self.done < self.total:
            eta = f" ETA {elapsed / self.done * (self.total - self.done):.0f}s"
        label = f"{self.label} " if self.label else ""
        return f"{label}[{bar}] {self.done}/{self.total} {elapsed:.1f}s{eta}" + (
            f"  {note}" if note else "")

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        if self.lines and note:
            print(f"[{self.done}/{self.total}] {note}", file=self.stream, flush=True)
        self._draw(note)

    def _draw(self, note: str, force: bool = False) -> None:
        if not self.live:
            now = time.perf_counter()
            if (not force and self.heartbeat is not None
                    and now - self._last_beat >= self.heartbeat):
                self._last_beat = now
                print(self.text(note), file=self.stream, flush=True)
            return
        now = time.perf_counter()
        if not force and now - self._last_draw < 0.1 and self.done < self.total:
            return
        self._last_draw = now
        self.stream.write("\r\033[K" + self.text(note)[:200])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar (the caller prints the outcome)."""
        if self.live and self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
