"""Workers die with their launcher: a thread that ends this process when its parent (torchrun) is gone.

torchrun starts its workers in sessions of their own, so killing torchrun's process group (or torchrun itself, with
SIGKILL, or its node agent crashing) leaves them training: orphans holding GPUs and writing checkpoints nobody
waits for. Linux's PR_SET_PDEATHSIG would need ctypes, which the engine does not import (guards.toml
[isolation]); instead a daemon thread polls os.getppid(), which changes once the parent is gone (the orphan is
re-parented to init or a subreaper), and then SIGKILLs this process, as the launcher would have. Checkpoints are
crash-safe (engine/checkpoint/store.py), so nothing is lost that a kill of the launcher did not already lose.
"""

import os
import signal
import sys
import threading

__all__ = ["exit_with_parent"]


def exit_with_parent(poll_s: float = 1.0) -> threading.Thread | None:
    """Start the watchdog for the current parent; None when there is no parent to watch (already orphaned)."""
    parent = os.getppid()
    if parent <= 1:
        return None

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent:
                sys.stderr.write(f"[RUN] the launcher (pid {parent}) is gone: this worker (pid {os.getpid()}) stops\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="temper-parent-watchdog", daemon=True)
    thread.start()
    return thread
