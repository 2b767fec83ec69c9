"""Fixtures shared by the engine's test files."""

import importlib.util

import pytest

from tests.engine.helpers import TINY_FAST, run_engine
from tests.once import once_per_run

# --tensorboard needs the optional package (the engine refuses the flag without it)
TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="session")
@once_per_run
def trained(tmp_path_factory):
    """One 3-step tiny run on the CPU (checkpoint at step 3), for the tests that export or read a trained checkpoint,
    compare its evaluations (one at every step, step 0 included) with another batch split, or read its TensorBoard
    scalars (written where the package is installed): (run dir, its step-3 checkpoint, what it printed)."""
    run_dir = tmp_path_factory.mktemp("trained")
    proc = run_engine("pretrain", *TINY_FAST, "--num-steps", "3", "--eval-every", "1",
                      *(["--tensorboard"] if TENSORBOARD else []), "--run-dir", str(run_dir))
    return run_dir, run_dir / "checkpoints" / "step_00000003", proc.stdout
