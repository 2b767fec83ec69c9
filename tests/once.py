"""Session fixtures built once per test run, not once per pytest-xdist worker.

The README's run hands tests out to two workers with `--dist worksteal`: a worker that takes some tests of a file whose
session fixture the other worker built already builds it again (a training run, a launch of ranks: seconds to a minute
on the same two cores). A session fixture under `@once_per_run` is built by the first worker that asks for it, saved
(pickle) in the run's temp folder that every worker shares, and the other worker waits for it and loads it. Without
xdist it is just built.

Values must pickle (tensors, paths, dataclasses, CompletedProcess). Files a value names stay where the builder wrote
them: tests read them and copy what they change, as they did with a per-worker fixture.
"""

import fcntl
import functools
import os
import pickle
from typing import Any, Callable

__all__ = ["once_per_run"]


def once_per_run(fixture: Callable[..., Any]) -> Callable[..., Any]:
    """Under @pytest.fixture(scope="session"), over a fixture that takes tmp_path_factory (its other arguments are
    fixtures too, so the value is the same whichever worker builds it)."""
    @functools.wraps(fixture)  # pytest reads the wrapped signature: the same fixtures are requested
    def shared(**fixtures: Any) -> Any:
        if not os.environ.get("PYTEST_XDIST_WORKER"):
            return fixture(**fixtures)
        run_folder = fixtures["tmp_path_factory"].getbasetemp().parent  # popen-gw0's and popen-gw1's parent
        # named by the run's id too: a --basetemp folder is the parent of every run's, and an earlier run's value
        # must never be loaded
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
        path = run_folder / f"once-{run}-{fixture.__module__}.{fixture.__name__}.pickle"
        with open(f"{path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the fixture raises
            if path.is_file():
                return pickle.loads(path.read_bytes())
            value = fixture(**fixtures)
            path.write_bytes(pickle.dumps(value))
            return value
    return shared
