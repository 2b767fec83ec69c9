"""The op tests never import the engine: each module calls it through one child process (harness.judge.candidate,
tests/ops/op_calls.py) and asserts on the data it hands back."""

from pathlib import Path

import pytest

from harness.judge.candidate import Candidate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def engine():
    """One child for every op test module a worker runs (tests/conftest.py says why session-scoped): an interpreter and
    a torch import (~3 s), then every call; the calls leave nothing behind (what one sets, it restores)."""
    with Candidate(REPO) as child:
        yield child
