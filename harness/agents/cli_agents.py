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

__all__ = [
    "ClaudeCodeAgent",
    "CodexAgent",
    "run_streaming",
    "parse_claude_stream",
    "parse_codex_stream",
    "StreamResult",
]

_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class StreamResult:
    """How a streamed subprocess ended, and the stdout lines it produced (decoded)."""

    exit_code: int
    timed_out: bool
    lines: list[str]


def run_streaming(
    command: Sequence[str],
    *,
    cwd: Path,
    stdin_text: str,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    kill_grace_s: float = _KILL_GRACE_S,
) -> StreamResult:
    """Run `command` in its own process group (harness.jobs.process); stdout streams to log_path,
    stderr beside it.

    The prompt is written from a thread so a child that never reads stdin cannot block the
    timeout; the pipes are read by threads so neither can fill up and stall the child. Stragglers
    the CLI leaves in its group (a server it started, a hung test) are stopped when it exits.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stderr_path = log_path.with_name(log_path.name + ".stderr")
    out = Lines(log_path)
    proc = Process(list(command), cwd=cwd, env=env, stdin=stdin_text.encode("utf-8"), stdout=out,
                   stderr=Lines(stderr_path), timeout_s=timeout_s, grace_s=kill_grace_s)
    res = proc.wait()
    assert res is not None
    code = res.returncode if res.returncode is not None else -signal.SIGKILL
    # A copy: a reader still blocked on a pipe held open by an escaped grandchild may append later.
    return StreamResult(code, res.timed_out, list(out.lines))


def _events(lines: list[str]) -> list[dict[str, Any]]:
    events = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue  # CLIs print the odd warning on stdout; the transcript keeps it
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut off by a kill: the rest of the transcript still counts
        if isinstance(event, dict):
            events.append(event)
    return events


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_claude_stream(lines: list[str]) -> tuple[Usage | None, str]:
    """Usage and final text from Claude Code's stream-json output.

    The last `result` event has the totals, cost included. Without one (killed, crashed), the
    assistant messages' usage is summed, once per message id, and the cost is unknown.
    """
    events = _events(lines)
    results = [e for e in events if e.get("type") == "result"]
    if results:
        final = results[-1]
        usage = final.get("usage") if isinstance(final.get("usage"), dict) else {}
        cost = final.get("total_cost_usd")
        return (
            Usage(
                input_tokens=_int(usage.get("input_tokens")),
                output_tokens=_int(usage.get("output_tokens")),
                cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
                cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
                cost_usd=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
            ),
            final.get("result") if isinstance(final.get("result"), str) else "",
        )
    seen: dict[str, dict[str, Any]] = {}
    last_text = ""
    for event in events:
        message = event.get("message")
        if event.get("type") != "assistant" or not isinstance(message, dict):
            continue
        if isinstance(message.get("usage"), dict):
            seen[str(message.get("id", len(seen)))] = message["usage"]
        for block in message.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "text" and block.get("text"):
                last_text = block["text"]
    if not seen:
        return None, last_text
    total = Usage()
    for usage in seen.values():
        total = total + Usage(
            input_tokens=_int(usage.get("input_tokens")),
            output_tokens=_int(usage.get("output_tokens")),
            cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
            cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
            cost_usd=None,
        )
    return total, last_text


def parse_codex_stream(lines: list[str], *, model: str = "") -> tuple[Usage | None, str]:
    """Usage and final text from `codex exec --json` output.

    Tokens are summed over `turn.completed` events; Codex counts cached input (read or written)
    inside input_tokens, `Usage.input_tokens` is the uncached rest. Final text: the last completed agent message, else
    the last error Codex reported.
    """
    events = _events(lines)
    total: Usage | None = None
    final_text = ""
    error_text = ""
    for event in events:
        kind = event.get("type")
        if kind == "turn.completed" and isinstance(event.get("usage"), dict):
            usage = event["usage"]
            cached = _int(usage.get("cached_input_tokens"))
            written = _int(usage.get("cache_write_input_tokens"))
            tokens = {
                "input_tokens": max(_int(usage.get("input_tokens")) - cached - written, 0),
                "output_tokens": _int(usage.get("output_tokens")),
                "cache_read_tokens": cached,
                "cache_write_tokens": written,
            }
            turn = Usage(**tokens, cost_usd=cost_usd(model, **tokens) if model else None)
            total = turn if total is None else total + turn
        elif kind == "item.completed" and isinstance(event.get("item"), dict):
            item = event["item"]
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                final_text = item["text"]
        elif kind == "turn.failed" and isinstance(event.get("error"), dict):
            error_text = str(event["error"].get("message", ""))
        elif kind == "error":
            error_text = str(event.get("message", ""))
    return total, final_text or error_text


class _CliAgent:
    """Shared attempt logic; subclasses name the binary, build the command and parse the stream."""

    name = ""
    executable = ""
    install_hint = ""

    def __init__(self, *, executable: str | None, env: Mapping[str, str] | None, extra_args: Sequence[str]) -> None:
        self.executable = executable or self.executable
        self.env = dict(env) if env is not None else None
        self.extra_args = tuple(extra_args)

    def resolve(self) -> str:
        """The executable's full path; AgentError naming it and how to install it when missing."""
        path = self.executable if os.sep in self.executable else shutil.which(self.executable)
        if not path or not os.access(path, os.X_OK):
            raise AgentError(
                f"{self.name}: executable {self.executable!r} not found; install it with `{self.install_hint}`"
            )
        return path

    def command(self, workdir: Path) -> list[str]:
        raise NotImplementedError

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        raise NotImplementedError

    def attempt(self, workdir: Path, prompt: str, *, log_path: Path, timeout_s: float) -> CliAttempt:
        workdir = Path(workdir).resolve()
        if not workdir.is_dir():
            raise AgentError(f"{self.name}: workdir {workdir} is not a directory")
        result = run_streaming(
            self.command(workdir),
            cwd=workdir,
            stdin_text=prompt,
            log_path=Path(log_path),
            timeout_s=timeout_s,
            env=self.env,
        )
        usage, final_text = self.parse(result.lines)
        return CliAttempt(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            usage=usage,
            final_text=final_text,
            transcript_path=Path(log_path),
        )


class ClaudeCodeAgent(_CliAgent):
    """Claude Code headless (`claude -p`), editing the worktree with acceptEdits permissions."""

    name = "cli:claude-code"
    executable = "claude"
    install_hint = "npm install -g @anthropic-ai/claude-code"

    def __init__(
        self,
        *,
        executable: str | None = None,
        model: str | None = None,
        permission_mode: str = "acceptEdits",
        allowed_tools: Sequence[str] = (),
        max_turns: int | None = None,
        max_budget_usd: float | None = None,
        bare: bool = True,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(executable=executable, env=env, extra_args=extra_args)
        self.model = model
        self.permission_mode = permission_mode
        self.allowed_tools = tuple(allowed_tools)
        self.max_turns = max_turns
        self.max_budget_usd = max_budget_usd
        # --bare: no hooks, plugins, auto-memory or CLAUDE.md discovery from the user's home, and
        # auth strictly from ANTHROPIC_API_KEY: the attempt depends on the prompt and worktree only.
        self.bare = bare

    def command(self, workdir: Path) -> list[str]:
        cmd = [
            self.resolve(),
            "-p",
            "--output-format", "stream-json",
            "--verbose",
            "--permission-mode", self.permission_mode,
            "--no-session-persistence",
        ]  # fmt: skip
        if self.bare:
            cmd.append("--bare")
        if self.model:
            cmd += ["--model", self.model]
        if self.max_turns is not None:
            cmd += ["--max-turns", str(self.max_turns)]
        if self.max_budget_usd is not None:
            cmd += ["--max-budget-usd", f"{self.max_budget_usd:g}"]
        if self.allowed_tools:
            cmd += ["--allowedTools", ",".join(self.allowed_tools)]
        return cmd + list(self.extra_args)

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        return parse_claude_stream(lines)


class CodexAgent(_CliAgent):
    """Codex CLI headless (`codex exec`), sandboxed to write inside the worktree only."""

    name = "cli:codex"
    executable = "codex"
    install_hint = "npm install -g @openai/codex"

    def __init__(
        self,
        *,
        executable: str | None = None,
        model: str | None = None,
        sandbox: str = "workspace-write",
        ephemeral: bool = True,
        config: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(executable=executable, env=env, extra_args=extra_args)
        self.model = model
        self.sandbox = sandbox
        self.ephemeral = ephemeral
        # `-c key=value` overrides (value parsed as TOML by codex), e.g. a model_provider for a local
        # server. workspace-write also lets commands write /tmp and $TMPDIR unless told otherwise;
        # the attempt may write its worktree only.
        self.config = {
            "sandbox_workspace_write.exclude_slash_tmp": "true",
            "sandbox_workspace_write.exclude_tmpdir_env_var": "true",
            **(config or {}),
        }

    def command(self, workdir: Path) -> list[str]:
        cmd = [
            self.resolve(),
            "exec",
            "--json",
            "--sandbox", self.sandbox,
            "--skip-git-repo-check",
            "--color", "never",
            "-C", str(workdir),
        ]  # fmt: skip
        if self.ephemeral:
            cmd.append("--ephemeral")
        if self.model:
            cmd += ["--model", self.model]
        for key, value in self.config.items():
            cmd += ["-c", f"{key}={value}"]
        # "-": the prompt comes from stdin, whatever its length.
        return cmd + list(self.extra_args) + ["-"]

    def parse(self, lines: list[str]) -> tuple[Usage | None, str]:
        return parse_codex_stream(lines, model=self.model or "")
