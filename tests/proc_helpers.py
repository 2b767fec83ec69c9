"""Process checks for tests, read straight from /proc (independent of the harness's own process runner)."""

import signal
from pathlib import Path

import pytest

__all__ = ["alive", "needs_ctrl_c"]

# A test that presses Ctrl-C sends SIGINT to its own process and expects KeyboardInterrupt. Where the suite runs
# with SIGINT ignored (a background job of a non-interactive shell, `nohup ... &`, some CI runners), Python installs
# no handler, the signal does nothing and the test would wait for the job it meant to interrupt (300 s).
needs_ctrl_c = pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    reason="SIGINT is ignored in this test process (started in the background or under nohup), so Ctrl-C cannot be "
           "simulated; run the suite in the foreground to test it")


def alive(pid: int) -> bool:
    """True when `pid` runs and is not a zombie (orphans here may never be reaped by pid 1)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"
