"""Fixtures shared by the engine's test files."""

import pytest

from tests.engine.helpers import TINY_FAST, run_engine


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One 3-step tiny run on the CPU (checkpoint at step 3), for the tests that export or read a trained checkpoint:
    (run dir, its step-3 checkpoint, what it printed)."""
    run_dir = tmp_path_factory.mktemp("trained")
    proc = run_engine("pretrain", *TINY_FAST, "--num-steps", "3", "--run-dir", str(run_dir))
    return run_dir, run_dir / "checkpoints" / "step_00000003", proc.stdout
