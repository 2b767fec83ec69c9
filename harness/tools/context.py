"""What the tools need to know about one attempt: where the worktree is, what the agent may write,
and the two callbacks only the agent loop can answer (dry-run gates, job logs)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ToolContext", "ToolError"]


class ToolError(Exception):
    """A mistake the model can fix (bad path, patch that does not apply, unknown job id).

    `execute` turns it into `ToolResult(is_error=True)` with this message; the `run_gates` and
    `read_job_log` callbacks raise it for the same purpose. Any other exception is a harness bug and
    propagates.
    """


@dataclass(kw_only=True, frozen=True)
class ToolContext:
    """Settings of the tools for one run.

    Globs are relative to `root` and anchored there: `*` and `?` stay inside one path segment, `**`
    spans any number of segments, and a glob that names a directory covers everything below it
    (`tests/**`, `tests/` and `tests` all protect `tests/a/b.py`). `protected` wins over
    `editable`; an empty `editable` means every path that is not protected. `.git` is always
    protected and never shown.

    `env` is the environment of `run` commands; None inherits the harness's own. The loop should
    pass one without API keys (the agent could print it, and tool output is recorded).
    """

    root: Path
    editable: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)
    shell_timeout_s: float = 120.0
    max_shell_timeout_s: float = 1800.0
    output_limit: int = 20_000  # characters of one tool result, head and tail kept
    run_gates: Callable[[], str] | None = None
    read_job_log: Callable[[str, int, str], str] | None = None
    env: Mapping[str, str] | None = None
