"""The progress view: one line per event on stderr, with the elapsed time, so a person can follow a run.

    [  12.4s] turn    3  claude-sonnet-4-5  2,310 in / 412 out  $0.0131  -> run, run_gates
    [  12.6s] tool       run git apply <<'EOF': (no output) (exit code 0)
    [  40.1s] gate       guards FAIL: 2 findings in engine (120 files checked)

Long silences get live lines (`live`): each test file of a pytest gate, each training step of a job. On a
terminal they redraw one line in place with a bar (the next event line replaces it); otherwise each is a plain
line like the others, so logs and CI output keep them all.

Colour only on a terminal and never when NO_COLOR is set (https://no-color.org, read through
harness.settings). Progress is for people; records are the source of truth.
"""

import sys
import threading
import time
from typing import TextIO

__all__ = ["Progress"]

_COLORS = {"FAIL": "31", "REJECTED": "31", "error": "31", "pass": "32", "ACCEPTED": "32", "accepted": "32"}
_KIND_COLOR = {"turn": "36", "attempt": "35", "verdict": "1", "gate": "33", "job": "34", "run": "1"}


class Progress:
    """Writes `[elapsed] kind text` lines. `quiet` drops everything (records are still written)."""

    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None, quiet: bool = False,
                 tty: bool | None = None):
        from harness.settings import no_color

        self.stream = stream if stream is not None else sys.stderr
        tty = (hasattr(self.stream, "isatty") and self.stream.isatty()) if tty is None else tty
        self.color = (tty and not no_color()) if color is None else color
        self.quiet = quiet
        self.tty = tty
        self.t0 = time.monotonic()
        self._lock = threading.Lock()  # live lines come from the judge's pump threads
        self._live_open = False

    def __call__(self, kind: str, text: str) -> None:
        self.line(kind, text)

    def line(self, kind: str, text: str) -> None:
        if self.quiet:
            return
        first, *rest = (text.splitlines() or [""])
        with self._lock:
            self._close_live()
            self.stream.write(f"{self._head(kind, first)}\n")
            for line in rest:
                self.stream.write(f"{'':19}{line}\n")
            self.stream.flush()

    def live(self, kind: str, text: str, done: int | None = None, total: int | None = None) -> None:
        """A progress line: redrawn in place with a bar on a terminal, a plain line otherwise."""
        if self.quiet:
            return
        with self._lock:
            if not self.tty:
                self.stream.write(f"{self._head(kind, text)}\n")
            else:
                bar = f" {_bar(done, total)}" if done is not None and total else ""
                self.stream.write(f"\r\033[K{self._head(kind, text)}{bar}")
                self._live_open = True
            self.stream.flush()

    def _close_live(self) -> None:
        if self._live_open:
            self.stream.write("\r\033[K")
            self._live_open = False

    def _head(self, kind: str, first: str) -> str:
        elapsed = time.monotonic() - self.t0
        label = f"{kind:<8}"
        if self.color:
            label = f"\033[{_KIND_COLOR.get(kind, '0')}m{label}\033[0m"
            for word, code in _COLORS.items():
                first = first.replace(f" {word}", f" \033[{code}m{word}\033[0m", 1) if f" {word}" in first else first
        return f"[{elapsed:7.1f}s] {label} {first}"


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = min(width, max(0, round(width * done / total)))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
