"""Test-side helpers for calling the engine in its own process (the `engine` fixture of tests/ops/conftest.py)."""

import re

import pytest

from harness.judge.candidate import CandidateError

__all__ = ["CALL", "raises"]

CALL = "tests.ops.op_calls:call"  # target(*args, **kwargs) in the engine's process, outputs and gradients back


def raises(engine, kind: str, match: str, target: str, *args, **kwargs) -> CandidateError:
    """`target(*args, **kwargs)` in the engine's process raises a `kind` (an exception class name, e.g.
    "ValueError") whose message matches `match`; the error, for further checks."""
    with pytest.raises(CandidateError) as err:
        engine.call(CALL, target, list(args), kwargs)
    assert err.value.is_a(kind), f"expected {kind}, got {err.value}"
    assert re.search(match, err.value.message), f"{err.value.message!r} does not match {match!r}"
    return err.value
