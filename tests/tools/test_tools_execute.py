"""execute(): specs, argument checking, callbacks, submit; model mistakes never raise."""

from pathlib import Path

import pytest

from harness.protocol import ToolCall
from harness.tools import TOOL_NAMES, ToolContext, execute, tool_specs
from tests.tools.tools_helpers import call


def test_specs_are_complete_json_schemas() -> None:
    specs = tool_specs()
    assert [s.name for s in specs] == ["run", "run_gates", "read_log", "submit"]
    assert TOOL_NAMES == [s.name for s in specs]
    for spec in specs:
        params = spec.parameters
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params.get("required", [])) <= set(params["properties"]), spec.name
        for name, prop in params["properties"].items():
            assert prop["type"] in ("string", "integer", "number", "boolean"), (spec.name, name)
            assert prop.get("description"), (spec.name, name)
        assert len(spec.description) > 40, spec.name


def test_parse_error_comes_back_as_an_error_result(ctx: ToolContext) -> None:
    bad = ToolCall(id="x9", name="run", arguments={}, raw_arguments='{"command": "ec', parse_error="Unterminated string")
    res = execute(bad, ctx)
    assert res.is_error and res.call_id == "x9" and "not valid JSON" in res.content and "Unterminated" in res.content


@pytest.mark.parametrize(
    "name,args,fragment",
    [
        ("read_file", {"path": "README.md"}, "no tool named 'read_file'. Available tools: run, run_gates, read_log, submit"),
        ("run", {}, "needs the argument(s) 'command'"),
        ("run", {"command": 3}, "must be a string"),
        ("run", {"command": "ls", "cwd": "/"}, "has no argument(s) 'cwd'"),
        ("run", {"command": "ls", "timeout_s": "two"}, "must be a number"),
        ("read_log", {"job_id": "j", "tail": 1.5}, "whole number"),
        ("read_log", {"job_id": "j", "tail": 0}, "at least 1"),
        ("submit", {"message": ["a"]}, "must be a string"),
        ("run", {"command": "true", "timeout_s": 0}, "greater than 0"),
        ("run", {"command": "   "}, "empty"),
    ],
)
def test_bad_arguments_are_error_results(ctx: ToolContext, name: str, args: dict, fragment: str) -> None:
    res = call(ctx, name, **args)
    assert res.is_error and fragment in res.content, res.content


def test_unambiguous_near_misses_are_coerced(ctx: ToolContext) -> None:
    res = call(ctx, "run", command="head -1 README.md", timeout_s="30")
    assert not res.is_error and res.content.startswith("hello")
    # null for an optional argument means "not given"
    assert not call(ctx, "run", command="true", timeout_s=None).is_error


def test_submit_marks_the_result(ctx: ToolContext) -> None:
    res = call(ctx, "submit", message="fused the norm")
    assert res.submitted and not res.is_error
    assert call(ctx, "submit").submitted
    assert not call(ctx, "run", command="true").submitted


def test_callbacks_and_their_absence(tree: Path) -> None:
    seen = []

    def read_job_log(job_id: str, tail: int, grep: str) -> str:
        seen.append((job_id, tail, grep))
        if job_id != "job-1":
            raise ValueError(f"no job {job_id!r}; known jobs: job-1")  # as GateRunner.read_log does
        return "step 10 loss 3.2"

    ctx = ToolContext(root=tree, run_gates=lambda: "gate pytest: 2 failed", read_job_log=read_job_log)
    assert call(ctx, "run_gates").content == "gate pytest: 2 failed"
    assert call(ctx, "read_log", job_id="job-1", grep="loss").content == "step 10 loss 3.2"
    missing = call(ctx, "read_log", job_id="job-7")
    assert missing.is_error and "known jobs: job-1" in missing.content
    assert seen == [("job-1", 200, "loss"), ("job-7", 200, "")]
    bare = ToolContext(root=tree)
    assert call(bare, "run_gates").is_error and call(bare, "read_log", job_id="job-1").is_error


def test_harness_bugs_in_callbacks_propagate(tree: Path) -> None:
    def broken() -> str:
        raise RuntimeError("bug in the gate runner")

    with pytest.raises(RuntimeError, match="bug in the gate runner"):
        call(ToolContext(root=tree, run_gates=broken), "run_gates")


def test_every_result_respects_the_output_limit(tree: Path) -> None:
    ctx = ToolContext(root=tree, output_limit=500)
    (tree / "wide.txt").write_text("needle " * 5000 + "\n")
    res = call(ctx, "run", command="cat wide.txt")
    assert len(res.content) <= 500 and res.content.startswith("needle") and "[exit code 0;" in res.content
    wide = ToolContext(root=tree, output_limit=500, read_job_log=lambda *_: "x" * 5000)
    assert len(call(wide, "read_log", job_id="j").content) <= 500
