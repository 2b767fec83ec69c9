"""The gates, one module per kind: each holds `run(gate, judging) -> GateResult` and what only that kind needs.

Each module names its declaration model (`MODEL`), which lives in the spec layer (harness/spec/gates.py): the
spec is read agent-side and never imports the judge. The runner looks a gate's module up by its kind in `RUNS`.
"""

from collections.abc import Callable
from typing import Any

from harness.judge.gates import guards, job, metrics, protected, pytest
from harness.judge.judging import Judging
from harness.verdict import GateResult

__all__ = ["RUNS"]

RUNS: dict[str, Callable[[Any, Judging], GateResult]] = {
    "protected": protected.run, "guards": guards.run, "pytest": pytest.run, "job": job.run, "metrics": metrics.run,
}
