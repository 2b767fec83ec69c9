"""The two shapes of an agent backend. A `ChatAgent` answers one model call at a time (the harness owns the
conversation and runs the tools; no hidden state, so a run resumes from its records). A `SubprocessAgent` is a
coding-assistant CLI that edits the worktree itself during one attempt; the harness gates what it leaves.
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
    """What one CLI session left besides its edits: exit code (negative: that signal), usage (None: nothing
    usable reported), final text, and the CLI's own JSONL transcript."""

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
