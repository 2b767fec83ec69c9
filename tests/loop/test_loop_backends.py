"""`temper run` with real backends: the official anthropic and openai SDK clients against loopback
servers (scripted tool conversations that patch the engine and submit), and a coding-assistant CLI
stand-in (a real executable speaking Claude Code's stream-json). The verdicts come from the real gates.

Secrets: fake API keys are set in the harness's environment; afterwards no file under runs/ (records,
tool output, gate logs, the worktree) contains either key, though the agent's shell printed its
environment and the key did reach the server (in its auth header).
"""

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loop.loop_helpers import ENV_EDIT, FIX_ENV_EDIT, GOOD_EDIT, events, run_dirs, temper
from tests.loopback import anthropic_wire as aw
from tests.loopback import openai_wire as ow

__all__: list[str] = []

ANTHROPIC_KEY = "sk-ant-api03-LOOPBACKfakeKEY0123456789abcdefXYZ"
OPENAI_KEY = "sk-proj-LOOPBACKfakeOPENAI0123456789abcdef"


def assert_no_key_under(folder: Path) -> None:
    for key in (ANTHROPIC_KEY, OPENAI_KEY):
        found = subprocess.run(["grep", "-rIl", "--", key, str(folder)], capture_output=True, text=True)
        assert found.returncode == 1 and found.stdout == "", f"{key[:12]}... found in {found.stdout}"


def test_anthropic_backend_end_to_end_and_no_key_on_disk(home: Path) -> None:
    with aw.anthropic_server() as server:
        server.enqueue(
            aw.reply(aw.message(aw.text("Checking the environment, then patching."),
                                aw.tool_use("toolu_1", "run", {"command": "env; echo key=[$ANTHROPIC_API_KEY]"}),
                                aw.tool_use("toolu_2", "run", GOOD_EDIT),
                                stop_reason="tool_use", model="claude-sonnet-4-5",
                                tokens=aw.usage(input_tokens=1200, output_tokens=150))),
            aw.reply(aw.message(aw.tool_use("toolu_3", "submit", {"message": "Add inverse_sqrt to LR_SCHEDULES"}),
                                stop_reason="tool_use", model="claude-sonnet-4-5",
                                tokens=aw.usage(input_tokens=1500, output_tokens=40, cache_read=1000))),
        )
        proc = temper(home, "run", "loop-tiny", "--agent", "anthropic:claude-sonnet-4-5",
                      ANTHROPIC_API_KEY=ANTHROPIC_KEY, ANTHROPIC_BASE_URL=server.url, OPENAI_API_KEY=OPENAI_KEY)
        posts = server.posts()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "accepted" and run["totals"]["turns"] == 2 and run["totals"]["attempts"] == 1
    assert run["totals"]["input_tokens"] == 2700 and run["totals"]["output_tokens"] == 190
    assert run["totals"]["cost_usd"] is not None and run["totals"]["cost_usd"] > 0  # a listed model: priced

    assert len(posts) == 2
    assert all(ANTHROPIC_KEY in (p.headers.get("x-api-key", ""), p.headers.get("authorization", "").removeprefix("Bearer "))
               for p in posts)
    second = posts[1].body
    results = [b for m in second["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2"]
    shell_output = json.dumps(results[0]["content"])
    assert "key=[]" in shell_output and "TEMPER_HOME" in shell_output  # the shell ran, without the key
    assert "loop-tiny" in second["system"][0]["text"] and [t["name"] for t in second["tools"]] == ["run", "run_gates", "read_log", "submit"]
    assert_no_key_under(home / "runs")


@pytest.mark.slow  # ~25 s; the OpenAI wire on loopback: tests/agents/test_openai_api.py; unknown cost: tests/loop/test_loop_units.py
def test_openai_compatible_backend_end_to_end_with_unknown_cost(home: Path) -> None:
    """A self-hosted model has no price: cost stays unknown, and unknown never counts against max_cost_usd."""
    with ow.openai_server() as server:
        server.enqueue(
            ow.completion("Patching.", tool_calls=[ow.tool_call("call_1", "run", ENV_EDIT)],
                          finish_reason="tool_calls", model="qwen3-coder"),
            ow.completion(None, tool_calls=[ow.tool_call("call_2", "submit", {"message": "first try"})],
                          finish_reason="tool_calls", model="qwen3-coder"),
            ow.completion("Reading the guard report.", tool_calls=[ow.tool_call("call_3", "run", FIX_ENV_EDIT)],
                          finish_reason="tool_calls", model="qwen3-coder"),
            ow.completion("Done: inverse_sqrt is a plain name now.", model="qwen3-coder"),  # no tool call: a submission
        )
        proc = temper(home, "run", "loop-tiny", "--agent", f"openai-compatible:{server.url}/v1#qwen3-coder",
                      "--max-cost-usd", "0.0001", ANTHROPIC_API_KEY=ANTHROPIC_KEY, OPENAI_API_KEY=OPENAI_KEY)
        posts = server.posts()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "accepted" and run["totals"]["attempts"] == 2 and run["totals"]["cost_usd"] is None
    # The gate feedback went to the model as the message after attempt 1's tool result.
    third = posts[2].body["messages"]
    assert third[-1]["role"] == "user" and "Attempt 1 was rejected: gate `guards`" in third[-1]["content"]
    assert third[-2]["role"] == "tool" and third[-2]["tool_call_id"] == "call_2"
    verdicts = [json.loads((run_dir / f"attempts/{n}/verdict.json").read_text()) for n in (1, 2)]
    assert [v["failed_gate"] for v in verdicts] == ["guards", None]
    assert_no_key_under(home / "runs")


STANDIN = """\
#!{python}
# A coding-assistant CLI stand-in: reads the prompt on stdin, edits the worktree (its cwd), and prints
# Claude Code's stream-json. First attempt: a change that reads the environment; after feedback: fixed.
import json, pathlib, sys
prompt = sys.stdin.read()
config = pathlib.Path("engine/config.py")
text = config.read_text()
old = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")'
if "previous attempt was rejected" in prompt and "TEMPER_EXTRA" in prompt:
    text = text.replace('os.getenv("TEMPER_EXTRA") or "inverse_sqrt"', '"inverse_sqrt"').replace("import os\\n", "", 1)
    answer = "Removed the environment read."
else:
    text = text.replace(old, old[:-1] + ', os.getenv("TEMPER_EXTRA") or "inverse_sqrt")')
    text = text.replace("import tomllib\\n", "import os\\nimport tomllib\\n", 1)
    answer = "Added inverse_sqrt with an override."
config.write_text(text)
pathlib.Path("{log}").open("a").write(prompt + "\\n=====\\n")
print(json.dumps({{"type": "system", "subtype": "init"}}))
print(json.dumps({{"type": "result", "result": answer, "total_cost_usd": 0.02,
                  "usage": {{"input_tokens": 900, "output_tokens": 80}}}}))
"""


def test_cli_agent_gets_the_prompt_then_the_feedback_and_is_gated(home: Path, tmp_path: Path) -> None:
    """Run with --unsandboxed (the stand-in is this test's own code): every verdict says so, the accepted one too. The
    judge's refusal to run candidate code without a sandbox unless asked is tests/loop/test_loop_gates.py's
    test_no_sandbox_no_judging_unless_asked; the other end-to-end runs of this folder judge sandboxed."""
    prompts = tmp_path / "prompts.log"
    standin = tmp_path / "claude"
    standin.write_text(STANDIN.format(python=sys.executable, log=prompts))
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)
    proc = temper(home, "run", "loop-tiny", "--agent", "cli:claude-code", "--agent-option", f"executable={standin}",
                  "--unsandboxed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = run_dirs(home)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "accepted" and run["totals"]["attempts"] == 2
    for attempt, accepted in ((1, False), (2, True)):
        verdict = json.loads((run_dir / f"attempts/{attempt}/verdict.json").read_text())
        assert verdict["accepted"] is accepted and any(f.startswith("unsandboxed") for f in verdict["flags"]), verdict
    assert run["totals"]["cost_usd"] == 0.04 and run["agent"]["options"] == {"executable": str(standin)}
    first, second = prompts.read_text().split("\n=====\n")[:2]
    assert "Milestone `loop-tiny`" in first and "previous attempt was rejected" not in first
    assert "Use your own file and shell tools" in first  # the system prompt for tool-less CLI agents
    assert "Attempt 1 was rejected: gate `guards`" in second and "Milestone `loop-tiny`" in second
    assert [e["type"] for e in events(run_dir)].count("llm_call") == 2
    assert (run_dir / "agent/attempt-1.jsonl").is_file()
    listing = json.loads(temper(home, "runs", "--json").stdout)
    assert [(r["id"], r["status"], r["attempts"]) for r in listing] == [(run_dir.name, "accepted", 2)]


def test_usage_errors_exit_2_with_one_line(home: Path) -> None:
    cases = {
        ("run", "loop-tiny", "--agent", "nonsense"): "bad agent spec 'nonsense'",
        ("run", "loop-tiny", "--agent", "anthropic:claude-x"): "no API key; set ANTHROPIC_API_KEY",
        ("run", "nope", "--agent", "replay:x.jsonl"): "no milestone 'nope'",
        ("run", "loop-tiny", "--agent", "replay:missing.jsonl"): "replay file not found",
        ("run", "loop-tiny", "--agent", "replay:x", "--max-turns", "0"): "budget.max_turns",
        ("resume", "no-such-run"): "no run at",
        ("report", "no-such-run"): "no run 'no-such-run'",
    }
    for argv, message in cases.items():
        proc = temper(home, *argv)
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)
    assert not (home / "runs").exists() or run_dirs(home) == []
    bare = home.parent / "bare"
    bare.mkdir()
    (bare / "milestones").mkdir()
    (bare / "milestones/loop-tiny.toml").write_text((home / "milestones/loop-tiny.toml").read_text())
    proc = temper(bare, "run", "loop-tiny", "--agent", "replay:x.jsonl")
    assert proc.returncode == 2 and "not a git checkout" in proc.stderr
    subprocess.run(["git", "init", "-q"], cwd=bare, check=True)
    proc = temper(bare, "run", "loop-tiny", "--agent", "replay:x.jsonl")
    assert proc.returncode == 2 and "has no commits yet" in proc.stderr
    proc = temper(bare, "demo")
    assert proc.returncode == 2 and "no milestones/demo-tiny.toml" in proc.stderr


def test_an_api_agent_without_the_llm_extra_is_one_line_naming_it(home: Path, tmp_path: Path) -> None:
    """Without the SDK (a stand-in package that fails to import as a missing one would), `temper run` says to
    install the [llm] extra, exits 2 and creates nothing: no traceback, no run, no branch."""
    import os

    shadow = tmp_path / "no-sdk"
    for module in ("anthropic", "openai"):
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {module}", name="{module}")\n')
    path = os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH", "")) if p)
    for spec in ("anthropic:claude-x", "openai:gpt-x", "openai-compatible:http://127.0.0.1:9/v1#m"):
        proc = temper(home, "run", "loop-tiny", "--agent", spec, PYTHONPATH=path, ANTHROPIC_API_KEY="k", OPENAI_API_KEY="k")
        assert proc.returncode == 2, (spec, proc.stderr)
        assert "pip install -e '.[llm]'" in proc.stderr and "Traceback" not in proc.stderr, (spec, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (home / "runs").exists() or run_dirs(home) == []
    assert subprocess.run(["git", "branch", "--list", "temper/*"], cwd=home, capture_output=True, text=True).stdout == ""
