"""The judge: milestone + base commit + patch -> Verdict. Nothing else decides whether a change lands.

    verdict = GateRunner(milestone=m, repo=repo, base=judge_base, record=record).judge(diff, attempt=1)

`temper gate`, the agent loop and the agent's `run_gates` tool all come here (run_gates as a public judging:
`judge(diff, attempt=0, public=True)`, without held-out material, on the public draw). The judge lives outside
every path a milestone lets an agent edit and never imports the engine or the tests: it reads what
candidate processes print through pipes it owns, and re-derives what they claim with its own code.

The pipeline, top down (guards.toml [dag.harness] holds each layer to importing only the ones below it):
- runner.py: draw, admit, the gates in order, the verdict;
- gates/: one module per gate kind (protected, guards, pytest, job, metrics), each `run(gate, judging)`;
- claims/: a train job's claims re-derived from the files the judge reads back (one contract, its __init__;
  claims/fp8_reference.py: the judge's own FP8 linears, the floor of an --fp8 run's exact steps);
- admit.py, judging.py: the admitted tree the gates judge; one judging's state and its sandboxed processes;
- the pieces: policy.py (what a patch may touch), manifests.py (checkout and base hashes), bytecode.py (the
  checkout compiled by the judge), draws.py (the secret draw, and the dry runs' public one), baseconfig.py (the base engine's config),
  barrier.py, pytest_report.py, canary.py, candidate.py (acceptance tests that never import candidate code),
  logparse.py, live.py (the engine's log lines, progress), opcases.py, opjudge.py, tensorfile.py (op milestones),
  hardware.py (what machine the judge itself sees).
"""

import importlib

__all__ = ["GateRunner", "GateError", "NeedsHardware", "check_requires", "check_data", "verdict_text", "JobOutcome", "judge_metrics",
           "model_mismatches"]

# Each name is imported from its module when first asked for (PEP 562), not when the package is: the pipeline imports
# pytest (and torch, when a job gate or judge_metrics first runs: gates/__init__.py), time that `temper doctor`,
# `temper milestones` and a refused `temper run`, which need only hardware.py, would otherwise pay.
_HOMES = {"GateRunner": "runner", "GateError": "runner", "verdict_text": "runner", "NeedsHardware": "hardware",
          "check_requires": "hardware", "check_data": "hardware", "JobOutcome": "judging", "judge_metrics": "gates.metrics",
          "model_mismatches": "gates.metrics"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'harness.judge' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.judge.{_HOMES[name]}"), name)
