"""`python -m tests.engine.engine_batch`: several `python -m engine ARGV` in one process, one after the other.

Each JSON argv list on stdin goes to engine.cli.main (what `python -m engine` calls) with the process's own stdout and
stderr (file descriptors 1 and 2, so output from C and from child threads is caught too) pointed at files of its own;
one JSON line per run on the real stdout: {"rc", "stdout", "stderr"}. For refusals, which stop before any work, and
short runs whose checks cannot pass by what an earlier run left in the process: the interpreter and torch are
imported once instead of once per run (seconds each on 2 cores).
"""

import json
import os
import sys
import tempfile
import traceback

__all__: list[str] = []


def _run(argv: list[str], out_fd: int, err_fd: int) -> dict:
    from engine.cli import main

    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(out_fd, 1), os.dup2(err_fd, 2)
    try:
        try:
            rc = main(argv)
        except SystemExit as stop:  # argparse's own exits
            rc = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # the traceback is the run's stderr, as the process would print it
            traceback.print_exc()
            rc = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        os.close(saved[0]), os.close(saved[1])
    return {"rc": rc}


def main() -> None:
    real = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        argv = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            result = _run(argv, out.fileno(), err.fileno())
            out.seek(0), err.seek(0)
            result.update(stdout=out.read().decode(errors="replace"), stderr=err.read().decode(errors="replace"))
        real.write(json.dumps(result) + "\n")
        real.flush()


if __name__ == "__main__":
    main()
