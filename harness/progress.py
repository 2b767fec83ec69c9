"""The progress view: one line per event on stderr, with the elapsed time, so a person can follow a run.

    [  12.4s] turn    3  claude-sonnet-4-5  2,310 in / 412 out  $0.0131  -> read_file, apply_patch
    [  12.6s] tool       apply_patch: Applied 1 hunk to engine/config.py
    [  40.1s] gate       guards FAIL: 2 findings in engine (120 files checked)

Colour only on a terminal and never when NO_COLOR is set (https://no-color.org, read through
harness.settings). Progress is for people; records are the source of truth.
"""

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_COLORS = {"FAIL": "31", "REJECTED": "31", "error": "31", "pass": "32", "ACCEPTED": "32", "accepted": "32"}
_KIND_COLOR = {"turn": "36", "attempt": "35", "verdict": "1", "gate": "33", "job": "34", "run": "1"}


class Progress:
    """Writes `[elapsed] kind text` lines. `quiet` drops everything (records are still written)."""

    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None, quiet: bool = False):
        from harness.settings import no_color

        self.stream = stream if stream is not None else sys.stderr
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.color = (tty and not no_color()) if color is None else color
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, kind: str, text: str) -> None:
        self.line(kind, text)

    def line(self, kind: str, text: str) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.t0
        first, *rest = (text.splitlines() or [""])
        label = f"{kind:<8}"
        if self.color:
            label = f"\033[{_KIND_COLOR.get(kind, '0')}m{label}\033[0m"
            for word, code in _COLORS.items():
                first = first.replace(f" {word}", f" \033[{code}m{word}\033[0m", 1) if f" {word}" in first else first
        self.stream.write(f"[{elapsed:7.1f}s] {label} {first}\n")
        for line in rest:
            self.stream.write(f"{'':19}{line}\n")
        self.stream.flush()
