"""Prompts: jinja2 templates in `<TEMPER_HOME>/prompts/*.j2`, plain text, rendered with StrictUndefined: a
prompt that silently dropped a variable (an empty goal, a missing threshold) would send the agent off with the
wrong task, so a missing one raises `PromptError` naming it. The helpers take a Milestone or a Verdict.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.protocol import ToolSpec
from harness.spec import METRICS, MetricsGate, Milestone
from harness.verdict import Verdict

__all__ = ["PromptError", "ContextExcerpt", "prompts_dir", "render", "render_in", "context_excerpts", "system_prompt",
           "milestone_prompt", "gate_failure_prompt"]

MAX_EXCERPT_CHARS = 12_000
MAX_ITEMS = 10
LOG_TAIL_LINES = 60


class PromptError(ValueError):
    """A template is missing, does not compile, or uses a variable the caller did not pass."""


def prompts_dir() -> Path:
    from harness.settings import temper_home

    return temper_home() / "prompts"


@lru_cache(maxsize=8)
def _environment(directory: str) -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(name: str, /, **variables: Any) -> str:
    """Render `<TEMPER_HOME>/prompts/<name>.j2` (".j2" optional). Raises PromptError naming template and variable."""
    return render_in(prompts_dir(), name, **variables)


def render_in(directory: str | Path | None, name: str, /, **variables: Any) -> str:
    """`render` from another template folder (None: the default one)."""
    import jinja2

    template_name = name if name.endswith(".j2") else f"{name}.j2"
    env = _environment(str(Path(directory if directory is not None else prompts_dir()).resolve()))
    try:
        return env.get_template(template_name).render(**variables)
    except jinja2.TemplateNotFound:
        raise PromptError(f"prompt template {template_name!r} not found in {env.loader.searchpath}") from None  # type: ignore[union-attr]
    except jinja2.UndefinedError as err:
        raise PromptError(f"prompts/{template_name}: {err.message} (pass it to render())") from None
    except jinja2.TemplateSyntaxError as err:
        raise PromptError(f"prompts/{template_name}:{err.lineno}: {err.message}") from None


@dataclass(frozen=True)
class ContextExcerpt:
    """One context file as the milestone prompt shows it: inlined text, or a pointer."""

    path: str
    why: str
    lines: tuple[int, int] | None
    text: str | None  # None: pointed to, not inlined
    missing: bool = False
    truncated: bool = False
    shown_chars: int = 0


def context_excerpts(milestone: Milestone, worktree: str | Path, max_chars: int = MAX_EXCERPT_CHARS) -> list[ContextExcerpt]:
    """Read the milestone's `include = true` files from the worktree (line range, capped at max_chars)."""
    out = []
    for item in milestone.context:
        file = Path(worktree) / item.path
        if not file.is_file():
            out.append(ContextExcerpt(item.path, item.why, item.lines, None, missing=not file.exists()))
            continue
        if not item.include:
            out.append(ContextExcerpt(item.path, item.why, item.lines, None))
            continue
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        if item.lines:
            lines = lines[item.lines[0] - 1 : item.lines[1]]
        text = "\n".join(lines)
        truncated = len(text) > max_chars
        text = text[:max_chars]
        out.append(ContextExcerpt(item.path, item.why, item.lines, text, truncated=truncated, shown_chars=len(text)))
    return out


def system_prompt(milestone: Milestone, worktree: str | Path, tools: Sequence[ToolSpec] = (), directory: str | Path | None = None) -> str:
    """Role, tools, rules. `tools` empty: a coding-assistant CLI that brings its own tools."""
    return render_in(directory, "system", milestone=milestone, worktree=str(worktree), tools=list(tools),
                  protected_globs=list(milestone.protected_globs))


def milestone_prompt(milestone: Milestone, worktree: str | Path, directory: str | Path | None = None,
                     max_chars: int = MAX_EXCERPT_CHARS) -> str:
    """The first user message: goal, context, editable / protected globs, gates with thresholds, budget."""
    used = sorted({r.metric for g in milestone.gates if isinstance(g, MetricsGate) for r in g.rules})
    return render_in(directory, "milestone", milestone=milestone, context=context_excerpts(milestone, worktree, max_chars),
                  protected_globs=list(milestone.protected_globs), metrics=METRICS, metric_names=used)


def gate_failure_prompt(verdict: Verdict, attempts_left: int, directory: str | Path | None = None,
                        max_items: int = MAX_ITEMS, log_lines: int = LOG_TAIL_LINES) -> str:
    """Feedback after a rejected attempt: the failed gate, its first violations / failing tests, log tail."""
    gate = verdict.failed_gate
    if gate is None:
        raise ValueError(f"attempt {verdict.attempt} has no failed gate; nothing to report")
    passed = [g for g in verdict.gates if g.passed]
    tail = "\n".join(gate.log_tail.splitlines()[-log_lines:])
    return render_in(
        directory, "gate_failure",
        verdict=verdict, gate=gate, passed=passed, attempts_left=attempts_left,
        violations=list(gate.violations[:max_items]), more_violations=max(0, len(gate.violations) - max_items),
        failing_tests=list(gate.failing_tests[:max_items]), more_failing_tests=max(0, len(gate.failing_tests) - max_items),
        log_tail=tail, log_lines=len(tail.splitlines()),
    )
