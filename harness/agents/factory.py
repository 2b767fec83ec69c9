"""`make_agent(spec)`: one string names a backend, so milestones, the CLI and records can carry it.

Accepted forms:
    anthropic:<model>                          Anthropic Messages API
    openai:<model>                             OpenAI Chat Completions
    openai-compatible:<base_url>#<model>       vLLM / SGLang / Ollama (http(s) base_url, e.g. .../v1)
    cli:claude-code | cli:codex                coding-assistant CLI run in the worktree
    replay:<path>                              recorded turns (trajectory JSONL or runs/<id>/events.jsonl)

Options are keyword arguments of the backend's constructor; an option a backend does not take is a
ValueError naming the ones it does, rather than a silent no-op.
"""

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from harness.agents.base import Agent

__all__ = ["make_agent", "SPEC_FORMS"]

SPEC_FORMS = (
    "anthropic:<model>",
    "openai:<model>",
    "openai-compatible:<base_url>#<model>",
    "cli:claude-code",
    "cli:codex",
    "replay:<path>",
)


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"bad agent spec {spec!r}: {why}; accepted forms: {', '.join(SPEC_FORMS)}")


def _build(spec: str, factory: Callable[..., Any], *args: Any, **options: Any) -> Any:
    accepted = [
        name for name, p in inspect.signature(factory).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"agent spec {spec!r} takes no option(s) {', '.join(unknown)}; it accepts: {', '.join(accepted) or 'none'}"
        )
    return factory(*args, **options)


def _require_sdk(spec: str, module: str) -> None:
    """The API backends' SDKs come with the `[llm]` extra; without it, one line saying so (exit 2), not a traceback."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise ValueError(f"agent {spec!r} needs the {module!r} package, which is not installed: "
                         f"install the [llm] extra with `pip install -e '.[llm]'`") from None


def _model(spec: str, model: str) -> str:
    if not model or model != model.strip() or any(c.isspace() for c in model):
        raise _bad(spec, "the model name is empty or contains whitespace")
    return model


def make_agent(spec: str, **options: Any) -> Agent:
    """The agent a spec names. SDKs and CLIs are only touched by the backend that needs them."""
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise _bad(spec, "missing '<kind>:'")
    if kind in ("anthropic", "openai", "openai-compatible"):
        from harness.agents.api import anthropic_agent, openai_agent

        _require_sdk(spec, "anthropic" if kind == "anthropic" else "openai")
        if "compatible" in options or kind == "openai-compatible" and "base_url" in options:
            raise _bad(spec, "a server's base_url comes from the spec itself (openai-compatible:<base_url>#<model>), "
                            "not from a 'compatible' or 'base_url' option")
        if kind != "openai-compatible":
            return _build(spec, anthropic_agent if kind == "anthropic" else openai_agent, _model(spec, rest), **options)
        base_url, hash_sep, model = rest.rpartition("#")
        if not hash_sep:
            raise _bad(spec, "missing '#<model>' after the base_url")
        if not base_url.startswith(("http://", "https://")) or len(base_url) <= len("https://"):
            raise _bad(spec, f"base_url {base_url!r} is not an http(s) URL")
        return _build(spec, openai_agent, _model(spec, model), base_url=base_url, compatible=True, **options)
    if kind == "cli":
        from harness.agents.cli_agents import ClaudeCodeAgent, CodexAgent

        backend = {"claude-code": ClaudeCodeAgent, "codex": CodexAgent}.get(rest)
        if backend is None:
            raise _bad(spec, f"unknown CLI {rest!r}")
        return _build(spec, backend, **options)
    if kind == "replay":
        from harness.agents.replay import ReplayAgent

        if not rest:
            raise _bad(spec, "missing the trajectory path")
        if options:
            raise ValueError(f"agent spec {spec!r} takes no options; got {', '.join(sorted(options))}")
        return ReplayAgent.from_path(rest)
    raise _bad(spec, f"unknown kind {kind!r}")
