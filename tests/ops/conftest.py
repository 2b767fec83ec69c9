"""The op tests never import the engine: each module calls it through one child process (harness.judge.candidate,
tests/ops/op_calls.py) and asserts on the data it hands back."""

from pathlib import Path

import pytest

from harness.judge.candidate import Candidate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine():
    """One child per test module: an interpreter and a torch import, then every call of the module's tests."""
    with Candidate(REPO) as child:
        yield child
