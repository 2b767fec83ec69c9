"""Prompt templates render every shipped milestone, and any missing variable raises naming it."""

from pathlib import Path

import jinja2
import jinja2.meta
import pytest

from harness.prompts import (
    PromptError,
    context_excerpts,
    gate_failure_prompt,
    milestone_prompt,
    prompts_dir,
    render,
    render_in,
    system_prompt,
)
from harness.protocol import ToolSpec
from harness.spec import METRICS, MetricsGate, load_milestone, load_milestones
from harness.verdict import GateResult, Verdict

REPO = Path(__file__).resolve().parents[2]
TOOLS = [
    ToolSpec("read", "Read a file of the worktree, optionally a line range.", {"type": "object"}),
    ToolSpec("apply_patch", "Apply a unified diff or search/replace blocks.", {"type": "object"}),
    ToolSpec("submit", "Submit the current tree for judging.", {"type": "object"}),
]


def failing_verdict(n_tests: int = 13, attempt: int = 2) -> Verdict:
    return Verdict(
        attempt=attempt,
        accepted=False,
        gates=(
            GateResult("protected", "protected", True, "64 protected files unchanged; 118 tests (base 118)"),
            GateResult("guards", "guards", True, "no findings"),
            GateResult(
                "pytest", "pytest", False, f"{n_tests} failed (17 collected)",
                violations=tuple(f"violation {i}" for i in range(12)),
                failing_tests=tuple(f"tests/milestones/test_demo_tiny.py::test_case_{i}" for i in range(n_tests)),
                log_tail="\n".join(f"log line {i}" for i in range(200)),
                metrics={"collected": 17.0},
            ),
            GateResult("train", "job", False, "not run", skipped=True),
        ),
    )


def template_variables(name: str) -> set[str]:
    env = jinja2.Environment()
    source = (REPO / "prompts" / f"{name}.j2").read_text()
    return jinja2.meta.find_undeclared_variables(env.parse(source))


def test_prompts_dir_is_the_checkouts():
    assert prompts_dir() == REPO / "prompts"


@pytest.mark.parametrize("milestone", load_milestones(REPO / "milestones", root=REPO), ids=lambda m: m.id)
def test_system_prompt_names_worktree_tools_rules_and_budget(milestone):
    text = system_prompt(milestone, "/runs/r1/worktree", TOOLS)
    assert "`/runs/r1/worktree`" in text and milestone.title in text
    for tool in TOOLS:
        assert f"- `{tool.name}`: {tool.description}" in text
    assert "call `submit`" in text and "read-only" in text and "The harness, not you, runs the milestone's gates" in text
    assert '"tests/**"' in text and '"harness/**"' in text
    assert f"{milestone.budget.max_turns} turns" in text
    cli = system_prompt(milestone, "/runs/r1/worktree", ())
    assert "Use your own file and shell tools" in cli and "call `submit`" not in cli


@pytest.mark.parametrize("milestone", load_milestones(REPO / "milestones", root=REPO), ids=lambda m: m.id)
def test_milestone_prompt_lists_goal_gates_in_order_thresholds_and_budget(milestone):
    text = milestone_prompt(milestone, REPO)
    assert milestone.goal.strip() in text
    positions = [text.index(f"`{g.name}` ({g.kind})") for g in milestone.gates]
    assert positions == sorted(positions)
    for gate in milestone.gates:
        if isinstance(gate, MetricsGate):
            for rule in gate.rules:
                assert f"   - {rule.describe()}\n" in text
                assert METRICS[rule.metric].description in text
    assert f"{milestone.budget.max_attempts} attempt" in text
    assert f"{milestone.budget.max_tokens:,} tokens" in text
    for glob in milestone.editable:
        assert f'"{glob}"' in text


def test_milestone_prompt_inlines_exact_line_ranges(tmp_path):
    demo = load_milestone(REPO / "milestones" / "demo-tiny.toml", root=REPO)
    text = milestone_prompt(demo, REPO)
    source = (REPO / "engine" / "config.py").read_text().splitlines()
    for item in (c for c in demo.context if c.include):
        first, last = item.lines
        excerpt = "\n".join(source[first - 1 : last])
        assert f"```\n{excerpt}\n```" in text
    assert "- `engine/cli.py`: how fields become flags" in text  # pointed to, not inlined
    assert "acceptance tests are held out" in text
    # A worktree without the files: pointers say so instead of failing.
    excerpts = context_excerpts(demo, tmp_path)
    assert all(e.text is None and e.missing for e in excerpts)
    assert "(does not exist yet)" in milestone_prompt(demo, tmp_path)


def test_long_excerpts_are_cut_and_say_so():
    demo = load_milestone(REPO / "milestones" / "demo-tiny.toml", root=REPO)
    excerpts = context_excerpts(demo, REPO, max_chars=20)
    assert excerpts[1].truncated and len(excerpts[1].text) == 20
    assert "(cut at 20 characters" in milestone_prompt(demo, REPO, max_chars=20)


def test_gate_failure_shows_first_items_log_tail_and_attempts_left():
    text = gate_failure_prompt(failing_verdict(), attempts_left=1)
    assert text.startswith("Attempt 2 was rejected: gate `pytest` (pytest) failed: 13 failed (17 collected).")
    assert "Passed before it: protected, guards." in text
    assert "## Failing tests (first 10 of 13)" in text and "## Violations (first 10 of 12)" in text
    assert "test_case_9\n" in text and "test_case_10" not in text
    assert "log line 199\n```" in text and "log line 140\n" in text and "log line 139\n" not in text
    assert "(last 60 lines)" in text
    assert "- collected = 17" in text
    assert "You have 1 attempt left." in text
    assert "No attempts are left" in gate_failure_prompt(failing_verdict(), attempts_left=0)
    few = gate_failure_prompt(failing_verdict(n_tests=3), attempts_left=2, max_items=10)
    assert "## Failing tests\n" in few and "You have 2 attempts left." in few


def test_gate_failure_needs_a_failed_gate():
    accepted = Verdict(attempt=1, accepted=True, gates=(GateResult("protected", "protected", True),))
    with pytest.raises(ValueError, match="no failed gate"):
        gate_failure_prompt(accepted, attempts_left=1)


# ---------------------------------------------------------------- StrictUndefined


def full_variables() -> dict[str, dict]:
    """Variables that take every branch of every template, as the helpers build them."""
    demo = load_milestone(REPO / "milestones" / "production.toml", root=REPO)
    verdict = failing_verdict()
    gate = verdict.failed_gate
    return {
        "system": dict(milestone=demo, worktree="/w", tools=TOOLS, protected_globs=list(demo.protected_globs)),
        "milestone": dict(milestone=demo, context=context_excerpts(demo, REPO), protected_globs=list(demo.protected_globs),
                          metrics=METRICS, metric_names=sorted(METRICS)),
        "gate_failure": dict(verdict=verdict, gate=gate, passed=list(verdict.gates[:2]), attempts_left=2,
                             violations=list(gate.violations[:10]), more_violations=2, failing_tests=list(gate.failing_tests[:10]),
                             more_failing_tests=3, log_tail=gate.log_tail, log_lines=200),
    }


@pytest.mark.parametrize("name", ["system", "milestone", "gate_failure"])
def test_every_template_variable_is_required_and_named_when_missing(name):
    variables = full_variables()[name]
    assert render(name, **variables)  # the complete set renders
    used = template_variables(name)
    assert used == set(variables), f"{name}.j2 uses {sorted(used)}, the helper passes {sorted(variables)}"
    for missing in sorted(used):
        partial = {k: v for k, v in variables.items() if k != missing}
        with pytest.raises(PromptError, match=rf"prompts/{name}\.j2: '{missing}' is undefined"):
            render(name, **partial)


def test_missing_attribute_and_unknown_template_raise(tmp_path):
    (tmp_path / "t.j2").write_text("goal: {{ milestone.goall }}\n")
    demo = load_milestone(REPO / "milestones" / "demo-tiny.toml", root=REPO)
    with pytest.raises(PromptError, match="has no attribute 'goall'"):
        render_in(tmp_path, "t", milestone=demo)
    with pytest.raises(PromptError, match="'nope.j2' not found"):
        render("nope")
    (tmp_path / "bad.j2").write_text("{% if %}\n")
    with pytest.raises(PromptError, match=r"prompts/bad\.j2:1: "):
        render_in(tmp_path, "bad.j2")
