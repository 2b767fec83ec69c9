"""Workers die with their launcher (engine/distributed/watchdog.py): a real parent process is SIGKILLed and its
child, which runs the engine's watchdog, must be gone (exited or a zombie nobody reaped) within seconds; a child
whose parent lives on keeps running."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.proc_helpers import alive

REPO = Path(__file__).resolve().parents[2]

CHILD = ("import time; from engine.distributed.watchdog import exit_with_parent; exit_with_parent(0.05); "
         "print('ready', flush=True); time.sleep(120)")
PARENT = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
          "stdout=subprocess.PIPE, text=True); c.stdout.readline(); print(c.pid, flush=True); time.sleep(120)")


def test_a_worker_dies_with_its_launcher():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    try:
        time.sleep(0.5)
        assert alive(child), "the watchdog ended a worker whose launcher is alive"
        parent.kill()  # SIGKILL: the launcher has no chance to stop its children itself
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20  # polls every 0.05 s; 20 s is for a loaded machine
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the worker outlived its launcher"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
