"""Coding-assistant CLIs as subprocess agents: `cli:claude-code` and `cli:codex`.

One `attempt` runs the CLI headless in the worktree with the milestone prompt on stdin (no argv
length limit), in a new process group (the harness's one runner, harness.jobs.process). Its JSONL events stream to `log_path` and its stderr to
`<log_path>.stderr` as they arrive (not atomically: a crash must leave what was seen). On timeout
the whole group gets SIGTERM, then SIGKILL after a grace period; after a normal exit, stragglers
the CLI left running in its group are killed too. The CLI edits files itself; the harness gates
whatever it leaves behind, so the permission flags below keep it inside the worktree, they do not
make it right.

Claude Code: `claude -p --output-format stream-json --verbose --permission-mode acceptEdits --bare`.
acceptEdits accepts file edits inside the working directory and refuses everything else that needs
permission (reads and writes outside it, unapproved commands), since -p cannot ask. Its final
`result` event carries usage and total_cost_usd.

Codex: `codex exec --json --sandbox workspace-write --skip-git-repo-check -C <workdir> -`, with
/tmp and $TMPDIR excluded from the writable roots: commands write inside the workdir only and have
no network; exec never asks for approval. Its `turn.completed` events carry tokens but no cost, so
the cost comes from the price table when the model is given and listed, else None.

The child inherits the harness's environment unless `env` gives a complete one (a merged
environment needs `settings.child_env`, which does not exist yet: only settings.py reads os.environ).
"""

import json
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.agents.base import CliAttempt
from harness.agents.pricing import cost_usd
from harness.jobs.process import Lines, Process
from harness.protocol import AgentError, Usage

__all__ = ["ClaudeCodeAgent", "CodexAgent", "run_streaming", "parse_claude_stream", "parse_codex_stream", "StreamResult"]


@dataclass(frozen=True)
class StreamResult:
    """How a streamed subprocess ended, and the stdout lines it produced (decoded)."""

    exit_code: int
    timed_out: bool
    lines: list[str]


def run_streaming(command: Sequence[str], *, cwd: Path, stdin_text: str, log_path: Path, timeout_s: float,
                  env: Mapping[str, str] | None = None, kill_grace_s: float = 5.0) -> StreamResult:
    """Run `command` in its own process group (harness.jobs.process): the prompt on stdin, stdout streamed to
    log_path and stderr beside it; the group is killed at the deadline, and stragglers after the exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out = Lines(log_path)
    res = Process(list(command), cwd=cwd, env=env, stdin=stdin_text.encode("utf-8"), stdout=out,
                  stderr=Lines(log_path.with_name(log_path.name + ".stderr")), timeout_s=timeout_s, grace_s=kill_grace_s).wait()
    assert res is not None
    code = res.returncode if res.returncode is not None else -signal.SIGKILL
    # A copy: a reader still blocked on a pipe held open by an escaped grandchild may append later.
    return StreamResult(code, res.timed_out, list(out.lines))


def _events(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON objects of a transcript; the odd warning on stdout and a line cut off by a kill are skipped."""
    events = []
    for line in lines:
        try:
            event = json.loads(line) if line.strip().startswith("{") else None
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _claude_usage(usage: Any, cost: Any = None) -> Usage:
    usage = usage if isinstance(usage, dict) else {}
    return Usage(input_tokens=_int(usage.get("input_tokens")), output_tokens=_int(usage.get("output_tokens")),
                 cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
                 cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
                 cost_usd=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None)


def parse_claude_stream(lines: list[str]) -> tuple[Usage | None, str]:
    """Usage and final text from Claude Code's stream-json: the last `result` event has the totals, cost included.
    Without one (killed, crashed), the assistant messages' usage is summed once per message id, cost unknown."""
    events = _events(lines)
    results = [e for e in events if e.get("type") == "result"]
    if results:
        final = results[-1]
        return _claude_usage(final.get("usage"), final.get("total_cost_usd")), final.get("result") if isinstance(final.get("result"), str) else ""
    seen: dict[str, Usage] = {}
    last_text = ""
    for event in events:
        message = event.get("message")
        if event.get("type") != "assistant" or not isinstance(message, dict):
            continue
        if isinstance(message.get("usage"), dict):
            seen[str(message.get("id", len(seen)))] = _claude_usage(message["usage"])
        for block in message.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "text" and block.get("text"):
                last_text = block["text"]
    return (sum(seen.values(), Usage()) if seen else None), last_text


def parse_codex_stream(lines: list[str], *, model: str = "") -> tuple[Usage | None, str]:
    """Usage and final text from `codex exec --json`: tokens summed over `turn.completed` events (Codex counts
    cached input, read or written, inside input_tokens; `Usage.input_tokens` is the uncached rest). Final text:
    the last completed agent message, else the last error Codex reported."""
    total: Usage | None = None
    final_text = error_text = ""
    for event in _events(lines):
        kind = event.get("type")
        if kind == "turn.completed" and isinstance(event.get("usage"), dict):
            usage = event["usage"]
            cached, written = _int(usage.get("cached_input_tokens")), _int(usage.get("cache_write_input_tokens"))
            tokens = {"input_tokens": max(_int(usage.get("input_tokens")) - cached - written, 0),
                      "output_tokens": _int(usage.get("output_tokens")), "cache_read_tokens": cached, "cache_write_tokens": written}
            turn = Usage(**tokens, cost_usd=cost_usd(model, **tokens) if model else None)
            total = turn if total is None else total + turn
        elif kind == "item.completed" and isinstance(event.get("item"), dict):
            if event["item"].get("type") == "agent_message" and isinstance(event["item"].get("text"), str):
                final_text = event["item"]["text"]
        elif kind == "turn.failed" and isinstance(event.get("error"), dict):
            error_text = str(event["error"].get("message", ""))
        elif kind == "error":
            error_text = str(event.get("message", ""))
    return total, final_text or error_text


class _CliAgent:
    """Shared attempt logic; subclasses name the binary, build the command and parse the stream."""

    name = executable = install_hint = ""

    def __init__(self, *, executable: str | None, env: Mapping[str, str] | None, extra_args: Sequence[str]) -> None:
        self.executable = executable or self.executable
        self.env = dict(env) if env is not None else None
        self.extra_args = tuple(extra_args)

    def resolve(self) -> str:
        """The executable's full path; AgentError naming it and how to install it when missing."""
        path = self.executable if os.sep in self.executable else shutil.which(self.executable)
        if not path or not os.access(path, os.X_OK):
            raise AgentError(f"{self.name}: executable {self.executable!r} not found; install it with `{self.install_hint}`")
        return path

    def command(self, workdir: Path) -> list[str]:
        raise NotImplementedError

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        raise NotImplementedError

    def attempt(self, workdir: Path, prompt: str, *, log_path: Path, timeout_s: float) -> CliAttempt:
        workdir = Path(workdir).resolve()
        if not workdir.is_dir():
            raise AgentError(f"{self.name}: workdir {workdir} is not a directory")
        result = run_streaming(self.command(workdir), cwd=workdir, stdin_text=prompt, log_path=Path(log_path),
                               timeout_s=timeout_s, env=self.env)
        usage, final_text = self.parse(result.lines)
        return CliAttempt(result.exit_code, result.timed_out, usage, final_text, Path(log_path))


class ClaudeCodeAgent(_CliAgent):
    """Claude Code headless (`claude -p`), editing the worktree with acceptEdits permissions. --bare (the
    default): no hooks, plugins, auto-memory or CLAUDE.md from the user's home, auth from ANTHROPIC_API_KEY
    only, so the attempt depends on the prompt and the worktree alone."""

    name, executable, install_hint = "cli:claude-code", "claude", "npm install -g @anthropic-ai/claude-code"

    def __init__(self, *, executable: str | None = None, model: str | None = None, permission_mode: str = "acceptEdits",
                 allowed_tools: Sequence[str] = (), max_turns: int | None = None, max_budget_usd: float | None = None,
                 bare: bool = True, env: Mapping[str, str] | None = None, extra_args: Sequence[str] = ()) -> None:
        super().__init__(executable=executable, env=env, extra_args=extra_args)
        self.model, self.permission_mode, self.allowed_tools = model, permission_mode, tuple(allowed_tools)
        self.max_turns, self.max_budget_usd, self.bare = max_turns, max_budget_usd, bare

    def command(self, workdir: Path) -> list[str]:
        cmd = [self.resolve(), "-p", "--output-format", "stream-json", "--verbose", "--permission-mode",
               self.permission_mode, "--no-session-persistence"] + ["--bare"] * self.bare
        cmd += ["--model", self.model] if self.model else []
        cmd += ["--max-turns", str(self.max_turns)] if self.max_turns is not None else []
        cmd += ["--max-budget-usd", f"{self.max_budget_usd:g}"] if self.max_budget_usd is not None else []
        cmd += ["--allowedTools", ",".join(self.allowed_tools)] if self.allowed_tools else []
        return cmd + list(self.extra_args)

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        return parse_claude_stream(lines)


class CodexAgent(_CliAgent):
    """Codex CLI headless (`codex exec`), sandboxed to write inside the worktree only. `config` adds `-c key=value`
    overrides (TOML values), e.g. a model_provider for a local server; /tmp and $TMPDIR are not writable."""

    name, executable, install_hint = "cli:codex", "codex", "npm install -g @openai/codex"

    def __init__(self, *, executable: str | None = None, model: str | None = None, sandbox: str = "workspace-write",
                 ephemeral: bool = True, config: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        super().__init__(executable=executable, env=env, extra_args=extra_args)
        self.model, self.sandbox, self.ephemeral = model, sandbox, ephemeral
        self.config = {"sandbox_workspace_write.exclude_slash_tmp": "true",
                       "sandbox_workspace_write.exclude_tmpdir_env_var": "true", **(config or {})}

    def command(self, workdir: Path) -> list[str]:
        cmd = [self.resolve(), "exec", "--json", "--sandbox", self.sandbox, "--skip-git-repo-check", "--color", "never",
               "-C", str(workdir)] + ["--ephemeral"] * self.ephemeral + (["--model", self.model] if self.model else [])
        for key, value in self.config.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd + list(self.extra_args) + ["-"]  # "-": the prompt comes from stdin, whatever its length

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        return parse_codex_stream(lines, model=self.model or "")
