"""The gates, one module per kind: each holds `run(gate, judging) -> GateResult` and what only that kind needs.

Each module names its declaration model (`MODEL`), which lives in the spec layer (harness/spec/gates.py): the
spec is read agent-side and never imports the judge. The runner looks a gate's module up by its kind in `RUNS`.
The job and metrics gates' modules are imported when such a gate first runs: they hold the train-claim checks and
the op judge, which import torch (2 s a process), and a judging that ends before its jobs (a refused patch, a failed
test) never needs them.
"""

from collections.abc import Callable
from typing import Any

from harness.judge.gates import guards, protected, pytest
from harness.judge.judging import Judging
from harness.verdict import GateResult

__all__ = ["RUNS"]


def _job(gate: Any, judging: Judging) -> GateResult:
    from harness.judge.gates import job  # here, not at load (above)

    return job.run(gate, judging)


def _metrics(gate: Any, judging: Judging) -> GateResult:
    from harness.judge.gates import metrics  # here, not at load (above)

    return metrics.run(gate, judging)


RUNS: dict[str, Callable[[Any, Judging], GateResult]] = {
    "protected": protected.run, "guards": guards.run, "pytest": pytest.run, "job": _job, "metrics": _metrics,
}
