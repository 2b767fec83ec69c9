"""Small parts of the loop with hand-written expectations: budgets, submissions, active time across
resumes, the progress view's colour rules, the report's SVG plots, the suppression scan."""

import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.loop import check_limits, count_submissions
from harness.progress import Progress
from harness.protocol import AgentTurn, LimitsExceeded, Message, ToolCall, ToolResult, Usage
from harness.records import RunRecord
from harness.session import active_seconds
from harness.spec import Milestone
from harness.svgplot import line_chart

__all__: list[str] = []


def milestone(**budget: float | None) -> Milestone:
    return Milestone.model_validate({
        "id": "m", "title": "t", "goal": "g", "editable": ["engine/**"], "gates": [{"kind": "protected", "name": "protected"}],
        "budget": {"max_turns": 3, "max_tokens": 1000, "max_cost_usd": 1.0, "max_wall_s": 60, "max_attempts": 2, **budget},
    })


def record_with(tmp_path: Path, *usages: Usage) -> RunRecord:
    record = RunRecord.create(milestone_id="m", spec_hash="0", agent={"spec": "x"}, base_commit="0", branch="", worktree="",
                              runs_root=tmp_path)
    record.user_message("go")
    for u in usages:
        record.llm_call(AgentTurn(text="", usage=u))
        record.user_message("more")
    return record


@pytest.mark.parametrize(("usages", "wall_s", "budget", "message"), [
    ([Usage(cost_usd=0.1)] * 3, 0, {}, "turn budget spent: 3 of 3 turns"),
    ([Usage(input_tokens=900, output_tokens=100, cost_usd=0.1)], 0, {}, "token budget spent: 1,000 of 1,000 tokens"),
    ([Usage(cost_usd=0.6), Usage(cost_usd=0.4)], 0, {}, "cost budget spent: $1.0000 of $1.00"),
    ([], 60.0, {}, "wall-time budget spent: 60 s of 60 s"),
])
def test_each_budget_names_itself_when_spent(tmp_path: Path, usages: list[Usage], wall_s: float, budget: dict, message: str) -> None:
    with pytest.raises(LimitsExceeded, match="^" + message.replace("$", r"\$").replace(".", r"\.") + "$"):
        check_limits(milestone(**budget), record_with(tmp_path, *usages), wall_s)


def test_unknown_cost_never_counts_as_spent(tmp_path: Path) -> None:
    # $5 known, then one call of unknown price: the total is unknown, and unknown is not "over $1".
    record = record_with(tmp_path, Usage(cost_usd=5.0), Usage(cost_usd=None))
    assert record.totals.usage.cost_usd is None
    check_limits(milestone(), record, 0.0)
    check_limits(milestone(max_cost_usd=None), record_with(tmp_path / "b", Usage(cost_usd=99.0)), 0.0)  # no cost limit


def test_count_submissions() -> None:
    submit = ToolCall("s", "submit", {"message": "m"})
    conversation = [
        Message("user", text="go"),
        Message("assistant", turn=AgentTurn(text="", tool_calls=(submit,), stop_reason="tool_use")),
        Message("tool", results=(ToolResult("s", "Submitted.", submitted=True),)),
        Message("user", text="rejected"),
        Message("assistant", turn=AgentTurn(text="cut", stop_reason="max_tokens")),  # not a submission
        Message("assistant", turn=AgentTurn(text="paused", stop_reason="pause_turn")),  # not one either
        Message("assistant", turn=AgentTurn(text="I am done.", stop_reason="end_turn")),  # a submission
    ]
    assert count_submissions(conversation) == 2
    assert count_submissions(conversation[:3]) == 1


def test_active_seconds_leave_out_the_pause_before_a_resume() -> None:
    events = [{"type": "run_started", "ts": "2026-01-01T10:00:00.000Z"}, {"type": "llm_call", "ts": "2026-01-01T10:00:30.000Z"},
              {"type": "resumed", "ts": "2026-01-02T09:00:00.000Z"},  # a day later
              {"type": "llm_call", "ts": "2026-01-02T09:00:12.500Z"}]
    assert active_seconds(events) == 42.5  # 30 s before the crash + 12.5 s after the resume


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_colours_only_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty, pipe = _Terminal(), io.StringIO()
    Progress(tty)("gate", "guards FAIL: 1 finding")
    Progress(pipe)("gate", "guards FAIL: 1 finding")
    assert "\033[31mFAIL" in tty.getvalue() and "\033[" not in pipe.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    tty = _Terminal()
    Progress(tty)("gate", "guards FAIL: 1 finding\nsecond line")
    lines = tty.getvalue().splitlines()
    assert "\033[" not in tty.getvalue() and lines[0].endswith("gate     guards FAIL: 1 finding")
    assert lines[0].startswith("[") and "s] " in lines[0] and lines[1] == " " * 19 + "second line"


def test_svg_chart_is_wellformed_and_scales_the_points() -> None:
    svg = line_chart([("loss", [(1, 5.0), (2, 4.0), (3, 3.0)]), ("empty", [])], title="t <&>", xlabel="step", ylabel="loss")
    root = ET.fromstring(svg)  # well-formed XML, the title escaped
    ns = "{http://www.w3.org/2000/svg}"
    [line] = root.iter(f"{ns}polyline")
    xs, ys = zip(*(tuple(map(float, p.split(","))) for p in line.get("points").split()))
    assert xs[0] < xs[1] < xs[2] and ys[0] < ys[1] < ys[2]  # loss falls: y (downwards in SVG) grows
    assert xs[1] - xs[0] == pytest.approx(xs[2] - xs[1], abs=0.11)  # evenly spaced steps, 0.1 px rounding
    assert "no data" in line_chart([], title="t", xlabel="x", ylabel="y")
