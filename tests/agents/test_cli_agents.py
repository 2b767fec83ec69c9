"""Coding-assistant CLIs as subprocess agents.

The real `claude` and `codex` binaries run against loopback servers speaking their wires (Anthropic
Messages with SSE; OpenAI Responses with SSE): they edit a real worktree, and the permission flags
are checked by asking them to write outside it. Those tests skip, saying why, when the binary is
not on PATH. Process-group handling is tested with a small real CLI stand-in (a Python script that
forks a grandchild), since the real CLIs cannot be made to hang on cue.
"""

import json
import shutil
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.agents import make_agent
from harness.agents.cli_agents import (
    ClaudeCodeAgent,
    CodexAgent,
    parse_claude_stream,
    parse_codex_stream,
    run_streaming,
)
from harness.protocol import AgentError
from tests.loopback import anthropic_wire as aw
from tests.loopback import responses_wire as rw

__all__: list[str] = []

needs_claude = pytest.mark.skipif(
    shutil.which("claude") is None, reason="Claude Code CLI not on PATH (npm install -g @anthropic-ai/claude-code)"
)
needs_codex = pytest.mark.skipif(
    shutil.which("codex") is None, reason="Codex CLI not on PATH (npm install -g @openai/codex)"
)


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (dead, not yet reaped by init) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def stand_in(tmp_path: Path, body: str) -> Path:
    """An executable Python script standing in for a CLI (it ignores its arguments)."""
    script = tmp_path / "fake-cli"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


# -- command lines and missing binaries -------------------------------------------------------


def test_missing_executable_names_binary_and_install(tmp_path):
    for agent, hint in (
        (ClaudeCodeAgent(executable="claude-not-installed-here"), "npm install -g @anthropic-ai/claude-code"),
        (CodexAgent(executable="codex-not-installed-here"), "npm install -g @openai/codex"),
    ):
        with pytest.raises(AgentError) as caught:
            agent.attempt(tmp_path, "hi", log_path=tmp_path / "log.jsonl", timeout_s=5)
        assert agent.executable in str(caught.value) and hint in str(caught.value)


def test_command_lines(tmp_path):
    exe = stand_in(tmp_path, "pass\n")
    claude = make_agent(
        "cli:claude-code", executable=str(exe), model="claude-opus-5", max_turns=30, allowed_tools=("Bash(pytest *)",)
    )
    assert claude.command(tmp_path) == [
        str(exe), "-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits",
        "--no-session-persistence", "--bare", "--model", "claude-opus-5", "--max-turns", "30",
        "--allowedTools", "Bash(pytest *)",
    ]  # fmt: skip
    codex = make_agent("cli:codex", executable=str(exe), model="gpt-5")
    assert codex.command(tmp_path) == [
        str(exe), "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check", "--color", "never",
        "-C", str(tmp_path), "--ephemeral", "--model", "gpt-5",
        "-c", "sandbox_workspace_write.exclude_slash_tmp=true",
        "-c", "sandbox_workspace_write.exclude_tmpdir_env_var=true",
        "-",
    ]  # fmt: skip


# -- process groups, with a stand-in CLI ------------------------------------------------------


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    exe = stand_in(
        tmp_path,
        f"""
        import json, subprocess, sys, time
        prompt = sys.stdin.read()
        print(json.dumps({{"type": "system", "prompt": prompt}}), flush=True)
        child = subprocess.Popen(["sleep", "300"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(300)
        """,
    )
    log = tmp_path / "logs" / "cli.jsonl"
    attempt = ClaudeCodeAgent(executable=str(exe)).attempt(tmp_path, "the prompt", log_path=log, timeout_s=3.0)
    assert attempt.timed_out and attempt.exit_code == -signal.SIGTERM
    assert attempt.usage is None and attempt.transcript_path == log
    assert json.loads(log.read_text().splitlines()[0]) == {"type": "system", "prompt": "the prompt"}
    assert wait_gone(int(pid_file.read_text()))


def test_sigterm_ignoring_child_is_killed(tmp_path):
    exe = stand_in(
        tmp_path,
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(300)
        """,
    )
    result = run_streaming(
        [str(exe)], cwd=tmp_path, stdin_text="", log_path=tmp_path / "out.log", timeout_s=2.5, kill_grace_s=0.5
    )
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    assert result.lines == ["ready\n"]


def test_stragglers_are_killed_after_a_normal_exit(tmp_path):
    pid_file = tmp_path / "daemon.pid"
    exe = stand_in(
        tmp_path,
        f"""
        import json, subprocess
        child = subprocess.Popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print(json.dumps({{"type": "result", "subtype": "success", "result": "bye", "total_cost_usd": 0.25,
                          "usage": {{"input_tokens": 3, "output_tokens": 4}}}}), flush=True)
        """,
    )
    attempt = ClaudeCodeAgent(executable=str(exe)).attempt(tmp_path, "", log_path=tmp_path / "t.jsonl", timeout_s=30)
    assert (attempt.exit_code, attempt.timed_out, attempt.final_text) == (0, False, "bye")
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens, attempt.usage.cost_usd) == (3, 4, 0.25)
    assert wait_gone(int(pid_file.read_text()))


# -- stream parsing without a final result ----------------------------------------------------


def test_claude_stream_without_result_sums_messages_once():
    # Claude Code repeats a message's usage on every content-block event of that message.
    def assistant(message_id, block, **usage):
        return json.dumps({"type": "assistant", "message": {"id": message_id, "content": [block], "usage": usage}})

    lines = [
        json.dumps({"type": "system", "subtype": "init"}),
        assistant("m1", {"type": "text", "text": "a"}, input_tokens=10, output_tokens=2),
        assistant("m1", {"type": "tool_use"}, input_tokens=10, output_tokens=2),
        assistant("m2", {"type": "text", "text": "b"}, input_tokens=1, output_tokens=1, cache_read_input_tokens=7),
        '{"type": "assistant", "message": {"id": "m3", "cont',  # cut off by the kill
    ]
    usage, text = parse_claude_stream([line + "\n" for line in lines])
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cost_usd) == (11, 3, 7, None)
    assert text == "b"
    assert parse_claude_stream(["not json\n"]) == (None, "")


def test_codex_stream_failure_reports_the_error():
    lines = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        {"type": "error", "message": "Reconnecting... 1/5"},
        {"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized"}},
    ]
    usage, text = parse_codex_stream([json.dumps(e) + "\n" for e in lines], model="gpt-5")
    assert usage is None and text == "unexpected status 401 Unauthorized"


# -- the real Claude Code CLI against a loopback Anthropic server -----------------------------


def claude_env(monkeypatch, tmp_path: Path, server_url: str) -> None:
    """The child inherits the test's environment; point it at the loopback and a throwaway home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-loopback")
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    monkeypatch.setenv("DISABLE_AUTOUPDATER", "1")


@needs_claude
def test_claude_code_edits_the_worktree_and_nothing_else(tmp_path, monkeypatch):
    worktree = tmp_path / "worktree"
    outside = tmp_path / "outside"
    worktree.mkdir()
    outside.mkdir()
    (worktree / "greeting.txt").write_text("hello world\n")
    (outside / "secret.txt").write_text("untouched\n")
    script = [
        ("Read", {"file_path": str(worktree / "greeting.txt")}),
        ("Edit", {"file_path": str(worktree / "greeting.txt"), "old_string": "world", "new_string": "loopback"}),
        ("Read", {"file_path": str(outside / "secret.txt")}),
        ("Bash", {"command": f"echo pwned > {outside / 'secret.txt'}", "description": "write outside"}),
        ("Bash", {"command": f'python3 -c \'open("{outside}/new.txt", "w").write("x")\'', "description": "escape"}),
    ]

    def model(request):
        body = request.body
        if not body.get("tools"):
            return aw.reply(aw.message(aw.text("side answer")), request)
        done = sum(
            1
            for m in body["messages"]
            for b in (m["content"] if isinstance(m["content"], list) else [])
            if b.get("type") == "tool_result"
        )
        if done < len(script):
            name, arguments = script[done]
            return aw.reply(aw.message(aw.tool_use(f"toolu_{done}", name, arguments), stop_reason="tool_use"), request)
        return aw.reply(aw.message(aw.text("All done.")), request)

    with aw.anthropic_server(fallback=model) as server:
        claude_env(monkeypatch, tmp_path, server.url)
        agent = make_agent("cli:claude-code", model="claude-opus-5")
        attempt = agent.attempt(
            worktree, "Greet the loopback.", log_path=tmp_path / "logs" / "claude.jsonl", timeout_s=120
        )
        posts = server.posts()

    assert (attempt.exit_code, attempt.timed_out, attempt.final_text) == (0, False, "All done.")
    assert (worktree / "greeting.txt").read_text() == "hello loopback\n"
    assert (outside / "secret.txt").read_text() == "untouched\n" and not (outside / "new.txt").exists()
    # One model call per scripted step plus the final answer, each 10 in / 5 out tokens.
    assert len(posts) == len(script) + 1
    assert all(p.body["stream"] is True for p in posts)
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (10 * len(posts), 5 * len(posts))
    # Claude Code prices the calls itself; Opus 5 lists 5 USD in / 25 USD out per MTok.
    assert attempt.usage.cost_usd == pytest.approx(len(posts) * (10 * 5 + 5 * 25) / 1e6, rel=1e-9)
    events = [json.loads(line) for line in attempt.transcript_path.read_text().splitlines()]
    assert events[0]["type"] == "system" and events[-1]["type"] == "result"
    denied = [d["tool_name"] for d in events[-1]["permission_denials"]]
    assert denied == ["Read", "Bash", "Bash"]


@needs_claude
def test_claude_code_timeout(tmp_path, monkeypatch):
    release = threading.Event()

    def stuck(request):
        release.wait(60)  # the model never answers within the attempt's time
        return aw.reply(aw.message(aw.text("too late")), request)

    with aw.anthropic_server(fallback=stuck) as server:
        claude_env(monkeypatch, tmp_path, server.url)
        try:
            attempt = make_agent("cli:claude-code").attempt(tmp_path, "hi", log_path=tmp_path / "c.jsonl", timeout_s=4)
        finally:
            release.set()
    # Claude Code handles SIGTERM itself and exits 143; killed outright it would be negative.
    assert attempt.timed_out and attempt.exit_code != 0
    assert attempt.usage is None and attempt.final_text == ""


# -- the real Codex CLI against a loopback Responses server -----------------------------------


@needs_codex
def test_codex_edits_the_worktree_and_nothing_else(tmp_path, monkeypatch):
    worktree = tmp_path / "worktree"
    outside = tmp_path / "outside"
    worktree.mkdir()
    outside.mkdir()
    script = [
        ("exec_command", {"cmd": "echo hello > hello.txt", "login": False}),
        ("exec_command", {"cmd": f"echo pwned > {outside / 'escape.txt'}", "login": False}),
    ]
    tokens = rw.usage(input_tokens=1000, cached=400, output_tokens=20)

    def model(request):
        done = len(rw.function_outputs(request.body))
        if done < len(script):
            return rw.stream(rw.function_call_item(*script[done]), tokens=tokens)
        return rw.stream(rw.message_item("All done from loopback."), tokens=tokens)

    with rw.responses_server(fallback=model) as server:
        home = tmp_path / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("CODEX_HOME", str(home))
        monkeypatch.setenv("LOOPBACK_KEY", "sk-loopback")
        provider = f'{{name="loopback", base_url="{server.url}/v1", env_key="LOOPBACK_KEY", wire_api="responses"}}'
        agent = make_agent(
            "cli:codex", model="gpt-5", config={"model_provider": '"loopback"', "model_providers.loopback": provider}
        )
        attempt = agent.attempt(worktree, "Say hello.", log_path=tmp_path / "logs" / "codex.jsonl", timeout_s=120)
        posts = server.posts()
        outputs = rw.function_outputs(posts[-1].body)

    assert (attempt.exit_code, attempt.timed_out, attempt.final_text) == (0, False, "All done from loopback.")
    assert (worktree / "hello.txt").read_text() == "hello\n"
    assert not (outside / "escape.txt").exists()
    assert "Read-only file system" in outputs[1]["output"] or "denied" in outputs[1]["output"].lower()
    n = len(posts)
    assert n == len(script) + 1
    assert (attempt.usage.input_tokens, attempt.usage.cache_read_tokens, attempt.usage.output_tokens) == (
        600 * n,
        400 * n,
        20 * n,
    )
    # Codex reports no cost: priced from the table, gpt-5 at 1.25 in / 0.125 cached / 10 out per MTok.
    assert attempt.usage.cost_usd == pytest.approx(n * (600 * 1.25 + 400 * 0.125 + 20 * 10) / 1e6, rel=1e-9)
    kinds = [json.loads(line)["type"] for line in attempt.transcript_path.read_text().splitlines()]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed"
