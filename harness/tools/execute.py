"""The tool set offered to API agents: specs (what the model reads) and `execute` (what runs).

`execute` never raises for a model's mistake: invalid JSON arguments, an unknown tool, a missing or
mistyped argument, a bad path, a patch that does not apply all come back as
`ToolResult(is_error=True)` with a message that says how to fix the call. Exceptions other than
`ToolError` are harness bugs and propagate.
"""

from collections.abc import Callable
from typing import Any

from harness.protocol import ToolCall, ToolResult, ToolSpec
from harness.tools.context import ToolContext, ToolError
from harness.tools.files import apply_patch, list_dir, read_file, search, write_file
from harness.tools.shell import run_shell
from harness.tools.text import truncate_middle

__all__ = ["tool_specs", "execute", "TOOL_NAMES"]

_PATCH_HELP = """Edit files with a patch; all of it applies or none of it does.

Two formats:
1. A unified diff, as `git diff` writes it. Several files per patch; a new file uses
   `--- /dev/null`, a deleted file `+++ /dev/null`. Line numbers in `@@` headers are only hints and
   hunk counts are ignored, but every context (' ') and removed ('-') line must match the file.
2. Search/replace blocks: the file path alone on a line, then

<<<<<<< SEARCH
exact lines currently in the file
=======
the lines to put there instead
>>>>>>> REPLACE

   SEARCH must match exactly one place (add surrounding lines if it is not unique). Several blocks
   may follow each other; a block without a path line uses the previous path. An empty SEARCH
   creates the file (or appends to an existing one).

Copy old lines from read_file output without the line numbers. Small whitespace differences are
tolerated. On failure you get the closest lines of the file; fix the patch and resend all of it.
Protected and non-editable paths are refused."""

_SPECS: list[ToolSpec] = [
    ToolSpec(
        name="list_dir",
        description=(
            "List a directory of the worktree as an indented tree (directories end with '/', files "
            "show their size, protected files are marked [read-only]). Use it to find your way "
            "before reading files."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory relative to the worktree root.", "default": "."},
                "depth": {
                    "type": "integer",
                    "description": "How many levels to show (1 = only the directory's own entries).",
                    "default": 2,
                    "minimum": 1,
                    "maximum": 10,
                },
            },
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="read_file",
        description=(
            "Read a text file with line numbers ('<number><TAB><line>'; the number and tab are not "
            "part of the file). Long files are cut with a note saying which start_line continues; "
            "read big files in ranges."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the worktree root."},
                "start_line": {
                    "type": "integer",
                    "description": "First line to show (1-based).",
                    "default": 1,
                    "minimum": 1,
                },
                "end_line": {
                    "type": "integer",
                    "description": "Last line to show, inclusive. Omit to read to the end of the file.",
                    "minimum": 1,
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="search",
        description=(
            "Search file contents with a Python regular expression, like ripgrep: one "
            "'path:line:text' per matching line. Skips .git, git-ignored and binary files."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Python regular expression, matched per line."},
                "path": {
                    "type": "string",
                    "description": "File or directory to search, or a glob of paths such as 'engine/**/*.py'.",
                    "default": ".",
                },
                "glob": {
                    "type": "string",
                    "description": "Only files whose path or name matches this glob, e.g. '*.py'.",
                    "default": "",
                },
                "max_results": {
                    "type": "integer",
                    "description": "Stop after this many matching lines.",
                    "default": 100,
                    "minimum": 1,
                    "maximum": 1000,
                },
                "ignore_case": {"type": "boolean", "description": "Case-insensitive matching.", "default": False},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="apply_patch",
        description=_PATCH_HELP,
        parameters={
            "type": "object",
            "properties": {"patch": {"type": "string", "description": "A unified diff or search/replace blocks."}},
            "required": ["patch"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="write_file",
        description=(
            "Create a file or replace its whole content (parent directories are created). Prefer "
            "apply_patch for changes to existing files. Protected and non-editable paths are refused."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path relative to the worktree root."},
                "content": {"type": "string", "description": "The complete new content of the file."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="run",
        description=(
            "Run a shell command with `bash -c` in the worktree root (stdin is empty). Returns "
            "stdout and stderr merged, and the exit code; long output keeps its beginning and end. "
            "At the timeout the command and every process it started are killed; background "
            "processes are killed when the command ends. Changing protected files this way fails the "
            "attempt (the gates check their hashes)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command line."},
                "timeout_s": {
                    "type": "number",
                    "description": "Seconds before the command is killed (default: the harness's setting).",
                    "exclusiveMinimum": 0,
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="run_gates",
        description=(
            "Dry-run the milestone's gates on the worktree as it is now and get a summary of what "
            "fails and why. Nothing is recorded as an attempt; use it before submit."
        ),
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    ),
    ToolSpec(
        name="read_log",
        description="Read the log of a job the gates launched (job ids appear in run_gates output).",
        parameters={
            "type": "object",
            "properties": {
                "job_id": {"type": "string", "description": "The job id."},
                "tail": {
                    "type": "integer",
                    "description": "How many last lines to return.",
                    "default": 200,
                    "minimum": 1,
                },
                "grep": {
                    "type": "string",
                    "description": "Only lines matching this regular expression.",
                    "default": "",
                },
            },
            "required": ["job_id"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="submit",
        description=(
            "Submit your work for judging when you believe the milestone is met. The harness "
            "commits the worktree and runs every gate; you get the verdict back."
        ),
        parameters={
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What you changed and why, in a few lines."}},
            "additionalProperties": False,
        },
    ),
]

TOOL_NAMES = [spec.name for spec in _SPECS]


def tool_specs() -> list[ToolSpec]:
    """The tools offered to API agents, in a stable order."""
    return list(_SPECS)


# ------------------------------------------------------------------------------------ arguments


def _coerce(name: str, value: Any, schema: dict[str, Any]) -> Any:
    """The value as the schema's type; unambiguous near-misses ("10" for 10) are accepted."""
    kind = schema.get("type")
    if kind == "string":
        if not isinstance(value, str):
            raise ToolError(f"argument {name!r} must be a string, got {type(value).__name__}")
        return value
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ToolError(f"argument {name!r} must be true or false, got {value!r}")
    if kind in ("integer", "number"):
        number: Any = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise ToolError(f"argument {name!r} must be a number, got {value!r}") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ToolError(f"argument {name!r} must be a number, got {type(value).__name__}")
        if kind == "integer":
            if number != int(number):
                raise ToolError(f"argument {name!r} must be a whole number, got {value!r}")
            number = int(number)
        if "minimum" in schema and number < schema["minimum"]:
            raise ToolError(f"argument {name!r} must be at least {schema['minimum']}, got {value!r}")
        if "exclusiveMinimum" in schema and number <= schema["exclusiveMinimum"]:
            raise ToolError(f"argument {name!r} must be greater than {schema['exclusiveMinimum']}, got {value!r}")
        if "maximum" in schema and number > schema["maximum"]:
            raise ToolError(f"argument {name!r} must be at most {schema['maximum']}, got {value!r}")
        return number
    return value


def _arguments(spec: ToolSpec, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ToolError(f"arguments of {spec.name} must be a JSON object")
    props: dict[str, Any] = spec.parameters.get("properties", {})
    unknown = sorted(set(raw) - set(props))
    if unknown:
        allowed = ", ".join(props) or "none"
        raise ToolError(f"{spec.name} has no argument(s) {', '.join(map(repr, unknown))}; its arguments are: {allowed}")
    missing = [name for name in spec.parameters.get("required", []) if raw.get(name) is None]
    if missing:
        raise ToolError(f"{spec.name} needs the argument(s) {', '.join(map(repr, missing))}")
    return {name: _coerce(name, value, props[name]) for name, value in raw.items() if value is not None}


# ---------------------------------------------------------------------------------------- tools


def _run(ctx: ToolContext, command: str, timeout_s: float | None = None) -> str:
    note = ""
    timeout = ctx.shell_timeout_s if timeout_s is None else float(timeout_s)
    if timeout > ctx.max_shell_timeout_s:
        note = f"[timeout_s lowered from {timeout:g} to the maximum of {ctx.max_shell_timeout_s:g} s]\n"
        timeout = ctx.max_shell_timeout_s
    if not command.strip():
        raise ToolError("command is empty")
    try:
        # Leave room for the status lines so the result as a whole stays within the limit.
        budget = max(ctx.output_limit - 400, 200)
        res = run_shell(command, cwd=ctx.root, timeout_s=timeout, output_limit=budget, env=ctx.env)
    except OSError as e:
        raise ToolError(f"could not start bash: {e.strerror}") from e
    status = []
    if res.timed_out:
        status.append(
            f"[timed out after {timeout:g} s: the command and all processes it started were killed "
            "(SIGTERM, then SIGKILL)]"
        )
    else:
        status.append(f"[exit code {res.exit_code}; {res.elapsed_s:.1f} s]")
    if res.killed_leftovers:
        status.append("[background processes still running when the command ended were killed]")
    if res.pipe_held:
        status.append("[a process that left the process group kept the output open; its later output is lost]")
    body = res.output if res.output else "(no output)"
    if not body.endswith("\n"):
        body += "\n"
    text = note + body + "\n".join(status)
    if res.timed_out:
        raise ToolError(text)
    return text


def _run_gates(ctx: ToolContext) -> str:
    if ctx.run_gates is None:
        raise ToolError("run_gates is not available in this run")
    return ctx.run_gates()


def _read_log(ctx: ToolContext, job_id: str, tail: int = 200, grep: str = "") -> str:
    if ctx.read_job_log is None:
        raise ToolError("read_log is not available in this run")
    try:
        return ctx.read_job_log(job_id, tail, grep)
    except ValueError as err:  # an unknown job id or a bad pattern: the model can fix it
        raise ToolError(str(err)) from None


_HANDLERS: dict[str, Callable[..., str]] = {
    "list_dir": list_dir,
    "read_file": read_file,
    "search": search,
    "apply_patch": apply_patch,
    "write_file": write_file,
    "run": _run,
    "run_gates": _run_gates,
    "read_log": _read_log,
}


def execute(call: ToolCall, ctx: ToolContext) -> ToolResult:
    """Run one tool call against the worktree; model mistakes become error results."""
    specs = {spec.name: spec for spec in _SPECS}
    if call.parse_error:
        return ToolResult(
            call.id,
            f"The arguments of your {call.name or 'tool'} call are not valid JSON ({call.parse_error}). "
            "Send the call again with a JSON object as arguments.",
            is_error=True,
        )
    spec = specs.get(call.name)
    if spec is None:
        return ToolResult(
            call.id, f"There is no tool named {call.name!r}. Available tools: {', '.join(TOOL_NAMES)}.", is_error=True
        )
    try:
        args = _arguments(spec, call.arguments)
        if call.name == "submit":
            return ToolResult(
                call.id, "Submitted. The harness will commit the worktree and run every gate.", submitted=True
            )
        content = _HANDLERS[call.name](ctx, **args)
    except ToolError as e:
        return ToolResult(call.id, truncate_middle(str(e), ctx.output_limit), is_error=True)
    return ToolResult(call.id, truncate_middle(content, ctx.output_limit))
