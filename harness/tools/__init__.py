"""Tools for API agents (list, read, search, apply_patch, write, run, run_gates, read_log, submit),
confined to one worktree.

    ctx = ToolContext(root=worktree, editable=["engine/**"], protected=["tests/**", "guards/**"],
                      run_gates=loop.dry_run_gates, read_job_log=loop.read_job_log)
    backend.chat(system, messages, tools=tool_specs())
    result = execute(call, ctx)          # a ToolResult; never raises for the model's mistakes

File tools cannot leave the worktree or write protected paths (harness.tools.paths); the `run`
tool can, so the harness's protected-file hash gate is what fails such an attempt.
"""

from harness.tools.context import ToolContext, ToolError
from harness.tools.execute import TOOL_NAMES, execute, tool_specs
from harness.tools.paths import is_writable, matches_glob

__all__ = ["ToolContext", "ToolError", "tool_specs", "execute", "TOOL_NAMES", "matches_glob", "is_writable"]
