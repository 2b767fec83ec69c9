"""The agent's tools, mini-swe-agent's shape: a shell in its worktree, a dry run of the milestone's public gates
(no held-out tests, the public draw), a gate job's log, and submit. The shell edits files; the worktree's diff is the patch the judge gets.

    ctx = ToolContext(root=worktree, run_gates=loop.dry_run, read_job_log=gates.read_log)
    result = execute(call, ctx)          # a ToolResult; never raises for the model's mistakes

Nothing here confines the agent: a shell can write anywhere the harness user can. The judge is the
boundary (it judges the diff in its own checkout and hashes every protected file); docs/HARNESS.md.
"""

from harness.tools.execute import TOOL_NAMES, ToolContext, ToolError, execute, tool_specs

__all__ = ["ToolContext", "ToolError", "tool_specs", "execute", "TOOL_NAMES"]
