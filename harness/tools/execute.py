"""The four tools offered to API agents: specs (what the model reads) and `execute` (what runs).

`execute` never raises for a model's mistake: invalid JSON arguments, an unknown tool, a missing or
mistyped argument, an unknown job id all come back as `ToolResult(is_error=True)` saying how to fix
the call. Exceptions other than `ToolError` are harness bugs and propagate.

Why only these (docs/HARNESS.md, "The agent's tools"): the file tools (list, read, search, write, three
patch formats) did nothing the shell does not; replaying the recorded runs with shell commands in their
place gives the same turns, attempts and verdicts.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.protocol import ToolCall, ToolResult, ToolSpec
from harness.tools.shell import run_shell

__all__ = ["ToolContext", "ToolError", "tool_specs", "execute", "TOOL_NAMES"]


class ToolError(Exception):
    """A mistake the model can fix; `execute` returns it as an error result. The callbacks raise it too."""


@dataclass(kw_only=True, frozen=True)
class ToolContext:
    """The tools' settings for one run. `env` is the shell's environment (the loop passes one without API
    keys: the agent could print it, and tool output is recorded); None inherits the harness's."""

    root: Path
    shell_timeout_s: float = 120.0
    max_shell_timeout_s: float = 1800.0
    output_limit: int = 20_000  # characters of one tool result, head and tail kept
    run_gates: Callable[[], str] | None = None
    read_job_log: Callable[[str, int, str], str] | None = None
    env: Mapping[str, str] | None = None


def _spec(name: str, description: str, required: tuple[str, ...] = (), **properties: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name, description, {"type": "object", "properties": properties, "required": list(required),
                                        "additionalProperties": False})


_SPECS = [
    _spec("run", "Run a shell command with `bash -c` in the worktree root (stdin is empty): read, search and edit "
                 "files with it (cat, sed -n, grep -rn, git apply or a python script for edits), run tests and short "
                 "jobs. Returns stdout and stderr merged, and the exit code; long output keeps its beginning and end. "
                 "At the timeout the command and every process it started are killed; background processes are "
                 "killed when the command ends. Changing protected files this way fails the attempt.",
          ("command",), command={"type": "string", "description": "The bash command line."},
          timeout_s={"type": "number", "description": "Seconds before the command is killed (default: the harness's).",
                     "exclusiveMinimum": 0}),
    _spec("run_gates", "Dry-run the milestone's public gates on the worktree as it is now and get a summary of what "
                       "fails and why. Nothing is recorded as an attempt; use it before submit. It runs the same "
                       "gates as the judge except the held-out tests (they run only when you submit), on one fixed "
                       "public draw of the jobs' configurations (a submission is judged on a secret draw that differs)."),
    _spec("read_log", "Read the log of a job the gates launched (job ids appear in run_gates output).", ("job_id",),
          job_id={"type": "string", "description": "The job id."},
          tail={"type": "integer", "description": "How many last lines to return.", "default": 200, "minimum": 1},
          grep={"type": "string", "description": "Only lines matching this regular expression.", "default": ""}),
    _spec("submit", "Submit your work for judging when you believe the milestone is met. The harness commits the "
                    "worktree and runs every gate; you get the verdict back.",
          message={"type": "string", "description": "What you changed and why, in a few lines."}),
]
TOOL_NAMES = [spec.name for spec in _SPECS]


def tool_specs() -> list[ToolSpec]:
    """The tools offered to API agents, in a stable order."""
    return list(_SPECS)


def truncate_middle(text: str, limit: int) -> str:
    """`text`, or its head and tail around a marker when longer than `limit` (the tail says how it ended)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = text[: keep // 2], text[len(text) - (keep - keep // 2):]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters omitted ...]\n{tail}"


def _coerce(name: str, value: Any, schema: dict[str, Any]) -> Any:
    """The value as the schema's type; unambiguous near-misses ("10" for 10) are accepted."""
    if schema["type"] == "string":
        if not isinstance(value, str):
            raise ToolError(f"argument {name!r} must be a string, got {type(value).__name__}")
        return value
    number = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ToolError(f"argument {name!r} must be a number, got {value!r}") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise ToolError(f"argument {name!r} must be a number, got {type(value).__name__}")
    if schema["type"] == "integer":
        if number != int(number):
            raise ToolError(f"argument {name!r} must be a whole number, got {value!r}")
        number = int(number)
    if number < schema.get("minimum", number):
        raise ToolError(f"argument {name!r} must be at least {schema['minimum']}, got {value!r}")
    if "exclusiveMinimum" in schema and number <= schema["exclusiveMinimum"]:
        raise ToolError(f"argument {name!r} must be greater than {schema['exclusiveMinimum']}, got {value!r}")
    return number


def _arguments(spec: ToolSpec, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ToolError(f"arguments of {spec.name} must be a JSON object")
    props: dict[str, Any] = spec.parameters["properties"]
    unknown = sorted(set(raw) - set(props))
    if unknown:
        raise ToolError(f"{spec.name} has no argument(s) {', '.join(map(repr, unknown))}; "
                        f"its arguments are: {', '.join(props) or 'none'}")
    missing = [name for name in spec.parameters["required"] if raw.get(name) is None]
    if missing:
        raise ToolError(f"{spec.name} needs the argument(s) {', '.join(map(repr, missing))}")
    return {name: _coerce(name, value, props[name]) for name, value in raw.items() if value is not None}


def _run(ctx: ToolContext, command: str, timeout_s: float | None = None) -> str:
    if not command.strip():
        raise ToolError("command is empty")
    timeout, note = ctx.shell_timeout_s if timeout_s is None else timeout_s, ""
    if timeout > ctx.max_shell_timeout_s:
        note = f"[timeout_s lowered from {timeout:g} to the maximum of {ctx.max_shell_timeout_s:g} s]\n"
        timeout = ctx.max_shell_timeout_s
    try:  # room for the status lines, so the result as a whole stays within the limit
        res = run_shell(command, cwd=ctx.root, timeout_s=timeout, output_limit=max(ctx.output_limit - 400, 200), env=ctx.env)
    except OSError as err:
        raise ToolError(f"could not start bash: {err.strerror}") from err
    status = [f"[timed out after {timeout:g} s: the command and all processes it started were killed (SIGTERM, then "
              "SIGKILL)]" if res.timed_out else f"[exit code {res.exit_code}; {res.elapsed_s:.1f} s]"]
    if res.killed_leftovers:
        status.append("[background processes still running when the command ended were killed]")
    if res.pipe_held:
        status.append("[a process that left the process group kept the output open; its later output is lost]")
    body = res.output or "(no output)"
    text = note + body + ("" if body.endswith("\n") else "\n") + "\n".join(status)
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


_HANDLERS: dict[str, Callable[..., str]] = {"run": _run, "run_gates": _run_gates, "read_log": _read_log}


def execute(call: ToolCall, ctx: ToolContext) -> ToolResult:
    """Run one tool call in the worktree; model mistakes become error results."""
    if call.parse_error:
        return ToolResult(call.id, f"The arguments of your {call.name or 'tool'} call are not valid JSON "
                                   f"({call.parse_error}). Send the call again with a JSON object as arguments.", is_error=True)
    spec = next((s for s in _SPECS if s.name == call.name), None)
    if spec is None:
        return ToolResult(call.id, f"There is no tool named {call.name!r}. Available tools: {', '.join(TOOL_NAMES)}.",
                          is_error=True)
    try:
        args = _arguments(spec, call.arguments)
        if call.name == "submit":
            return ToolResult(call.id, "Submitted. The harness will commit the worktree and run every gate.", submitted=True)
        content = _HANDLERS[call.name](ctx, **args)
    except ToolError as err:
        return ToolResult(call.id, truncate_middle(str(err), ctx.output_limit), is_error=True)
    return ToolResult(call.id, truncate_middle(content, ctx.output_limit))
