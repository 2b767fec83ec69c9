"""Shared test setup: markers for GPU / SLURM tests, paths to the repo and to ../shared, a real local SLURM.

A fixture that trains, launches ranks or runs the engine (seconds to a minute) is session-scoped even when one file
uses it: the README's run hands tests out with `--dist worksteal`, and a worker that runs another file's test in
between tears a module fixture down and pays for it again when it gets back to that file.
"""

import os
import subprocess
from pathlib import Path

# One torch thread per process, set before torch is imported here or in any process a test starts (engine runs,
# torchrun ranks, the judge and its jobs inherit it): the README's run puts one xdist worker on each core, and a
# thread per core in every process spins OpenMP threads against each other (training tests take ~2x the CPU time).
# A value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_addoption(parser):
    parser.addoption("--stress-seconds", type=float, default=5.0,
                     help="how long each GPU kernel stress test (tests/ops/test_ops_stress.py) runs, in seconds")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
        for item in items:
            if item.get_closest_marker("gpu"):  # not `in item.keywords`: that holds path parts too (a checkout in gpu/)
                item.add_marker(skip)


@pytest.fixture(scope="session")
def stress_seconds(request) -> float:
    return float(request.config.getoption("--stress-seconds"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    data = SHARED / "data"
    if not data.is_dir():
        pytest.skip(f"{data} is absent (tests that read real data need ../shared beside the checkout)")
    return data


def _start_script() -> Path | None:
    """<repo>/../shared/slurm/start-local-slurm; helper worktrees sit one level deeper, so the
    nearest ancestor that has shared/slurm wins."""
    for parent in REPO.parents:
        script = parent / "shared" / "slurm" / "start-local-slurm"
        if script.is_file():
            return script
    return None


@pytest.fixture(scope="session")
def slurm() -> None:
    """A real single-node SLURM on this machine (started once; skipped where it cannot be)."""
    script = _start_script()
    if script is None:
        pytest.skip(f"no shared/slurm/start-local-slurm above {REPO}: cannot start a local SLURM")
    if os.geteuid() != 0:
        pytest.skip("start-local-slurm needs root (it installs and starts slurmctld, slurmd and munge)")
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.fail(f"{script} failed (exit {out.returncode}): {out.stdout}{out.stderr}")
