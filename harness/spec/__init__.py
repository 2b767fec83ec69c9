"""Milestone specs: one TOML file per milestone, validated by pydantic, loaded into a frozen `Milestone`.

A milestone says what the agent must achieve (goal, context), what it may touch (editable globs),
what it may never touch (the judge, tests, the spec itself), what runs before it starts (a setup
patch), how an attempt is judged (ordered gates) and what it may spend (budget). The gate runner
walks `Milestone.gates` in order and stops at the first failure.

Errors name the file and the field path in one line, e.g.
`milestones/x.toml: gates[2].rules[0].op: Input should be '<', '<=', '>', '>=' or '==' (got '=>')`.

Paths in a spec are relative to the repository root (the worktree), use `/`, and never leave it.
Globs: `**` matches any number of path segments (also none), `*` and `?` stay inside one segment.
Protection wins over editability: a file matching both is protected. The one exception is tests:
`tests/**` is protected unless an `editable` glob that starts with `tests/` names the file.

The package: vocab.py (globs, gate kinds, metrics, placeholders), gates.py (one model per gate kind), milestone.py
(the milestone and its parts), load.py (reading, validating and hashing a file).
"""

from harness.spec.gates import Gate, GuardsGate, JobGate, MetricRule, MetricsGate, OpBench, ProtectedGate, PytestGate
from harness.spec.load import find_milestone, load_milestone, load_milestones
from harness.spec.milestone import DRAW_KINDS, Budget, ContextFile, DrawVar, Milestone, NeedsHardware, Requires
from harness.spec.vocab import (GATE_KINDS, GUARD_RULES, JUDGE_GLOBS, JUDGED_PAIR_METRICS, METRICS, NEW_TEST_GLOB, OP_TASKS, OPS, PRINTED_DIFFS,
                                SHAPE_KEYS, STATE_METRICS, TEST_GLOB, MetricInfo, SpecError, compare, glob_match,
                                referenced_jobs, render_argv)

__all__ = [
    "SpecError",
    "Milestone",
    "NeedsHardware",
    "ContextFile",
    "Budget",
    "ProtectedGate",
    "GuardsGate",
    "PytestGate",
    "JobGate",
    "DrawVar",
    "DRAW_KINDS",
    "OpBench",
    "OP_TASKS",
    "SHAPE_KEYS",
    "MetricsGate",
    "MetricRule",
    "Gate",
    "MetricInfo",
    "METRICS",
    "STATE_METRICS",
    "JUDGED_PAIR_METRICS",
    "PRINTED_DIFFS",
    "OPS",
    "GATE_KINDS",
    "GUARD_RULES",
    "JUDGE_GLOBS",
    "TEST_GLOB",
    "NEW_TEST_GLOB",
    "Requires",
    "compare",
    "glob_match",
    "render_argv",
    "referenced_jobs",
    "load_milestone",
    "load_milestones",
    "find_milestone",
]

