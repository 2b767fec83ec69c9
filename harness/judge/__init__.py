"""The judge: milestone + base commit + patch -> Verdict. Nothing else decides whether a change lands.

    verdict = GateRunner(milestone=m, repo=repo, base=judge_base, record=record).judge(diff, attempt=1)

`temper gate`, the agent loop and the agent's `run_gates` tool all come here. The judge lives outside
every path a milestone lets an agent edit and never imports the engine or the tests: it reads what
candidate processes print through pipes it owns, and re-derives what they claim with its own code.

- policy.py: what a patch may touch (editable globs, honest new tests, no binaries, symlinks or submodules);
- protected.py: manifests of the judged checkout, base-commit hashes, pytest collection;
- bytecode.py: the judged checkout's bytecode, compiled by the judge (candidate Python runs with its defaults);
- runner.py: the gates in order in a throw-away checkout, candidate code sandboxed;
- pytest_report.py, canary.py: test outcomes signed on the judge's pipe by its own pytest plugin, and canary
  tests that must come out as written (the tested process runs candidate code);
- metrics.py, mfu.py, logparse.py: metric rules from judge-owned logs and clocks;
- digits.py, bitwise.py: printed numbers held to the documented format's digits; two runs claimed to agree compared
  in their checkpoints, every tensor (bit for bit, or resharded across layouts);
- evidence.py, checkpoint.py, reference.py: a train job's claims against its own weights (final loss, lr);
- exactstep.py, batches.py, saveplan.py, keeper.py: each verified step's loss, grad norm and applied gradient
  against the judge's forward and backward pass on the exact batch the base engine states for it (fp8_reference.py:
  that pass with FP8 linears, the floor of an --fp8 run);
- opcases.py, opjudge.py, tensorfile.py: op milestones (the bench itself, harness/opbench.py, runs sandboxed);
- hardware.py: what machine the judge itself sees (a milestone's `requires`).
"""

from harness.judge.hardware import NeedsHardware, check_data, check_requires
from harness.judge.metrics import JobOutcome, judge_metrics, model_mismatches
from harness.judge.runner import GateError, GateRunner, verdict_text

__all__ = ["GateRunner", "GateError", "NeedsHardware", "check_requires", "check_data", "verdict_text", "JobOutcome", "judge_metrics",
           "model_mismatches"]
