"""Shared test setup: markers for GPU / SLURM tests, paths to the repo and to ../shared."""

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_addoption(parser):
    parser.addoption("--stress-seconds", type=float, default=5.0,
                     help="how long each GPU kernel stress test (tests/ops/test_ops_stress.py) runs, in seconds")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
        for item in items:
            if "gpu" in item.keywords:
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
