"""Gates: how the harness judges a candidate change, in the milestone's order, first failure stops.

    runner = GateRunner(milestone=m, repo=repo, base=judge_base, record=record)
    verdict = runner.judge(diff, attempt=1, live_tree=worktree)

protected (harness/gates/protected.py): protected files hash as at the base, on disk, not only in git;
the collected test count does not drop. guards: `guards.runner` in-process on the checkout, plus no new
`# guard: allow` lines. pytest: a subprocess with a junit report and a minimum collected count. job:
the engine through harness.jobs. metrics (harness/gates/metrics.py): recomputed from the job's files.
"""

from harness.gates.metrics import JobOutcome, judge_metrics, model_mismatches
from harness.gates.runner import GateError, GateRunner, verdict_text

__all__ = ["GateRunner", "GateError", "verdict_text", "JobOutcome", "judge_metrics", "model_mismatches"]
