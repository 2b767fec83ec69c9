"""The two shapes an agent backend takes, so the loop can drive any of them without knowing which.

A `ChatAgent` answers one model call at a time: the harness owns the conversation, runs the tools
and appends their results, and the backend converts the whole provider-neutral conversation to its
wire format on every call (no hidden state, so a run can resume from its records).

A `SubprocessAgent` is a coding-assistant CLI (Claude Code, Codex) that edits the worktree itself
during one attempt; the harness only sees what it leaves behind and gates that.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias, runtime_checkable

from harness.protocol import AgentTurn, Message, ToolSpec, Usage

__all__ = ["ChatAgent", "SubprocessAgent", "CliAttempt", "Agent"]


@runtime_checkable
class ChatAgent(Protocol):
    """A model behind an API: one `step` is one model call."""

    name: str

    def step(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> AgentTurn:
        """Send the conversation so far and return the model's next turn.

        Raises `harness.protocol.AgentError` when the call fails for good (after the SDK's retries).
        """
        ...


@dataclass(frozen=True)
class CliAttempt:
    """What one run of a coding-assistant CLI left behind, besides its edits to the worktree.

    `exit_code` is the process's return code (negative: killed by that signal). `usage` is None
    when the CLI reported nothing usable; its `cost_usd` is None when the CLI reports no cost.
    `transcript_path` is the CLI's own JSONL event stream, as written while it ran.
    """

    exit_code: int
    timed_out: bool
    usage: Usage | None
    final_text: str
    transcript_path: Path


@runtime_checkable
class SubprocessAgent(Protocol):
    """A coding-assistant CLI run headless in the worktree for one attempt."""

    name: str

    def resolve(self) -> str:
        """The executable's path; AgentError naming how to install it when it is missing (a run checks this
        before it creates anything)."""
        ...

    def attempt(self, workdir: Path, prompt: str, *, log_path: Path, timeout_s: float) -> CliAttempt: ...


Agent: TypeAlias = ChatAgent | SubprocessAgent
