"""OpenAI Chat Completions backend with tools, through the official `openai` SDK.

Two specs share it:
- `openai:<model>`: api.openai.com (or OPENAI_BASE_URL); needs OPENAI_API_KEY; priced from the table.
- `openai-compatible:<base_url>#<model>`: vLLM / SGLang / Ollama and other servers speaking the same
  wire. Local servers ignore the key, so a placeholder is sent unless one is given explicitly; the
  OpenAI key is never sent to a foreign server. Cost is always unknown (None).

Wire mapping: system prompt -> a "system" message; tools -> function tools; an assistant turn ->
content + tool_calls whose arguments are JSON strings; tool results -> one "tool" message per
result, in call order (the wire has no error flag, so failed results are prefixed "ERROR: ").
OpenAI caches prompt prefixes by itself; usage reports the hits as prompt_tokens_details.cached_tokens,
which `Usage` keeps apart from `input_tokens` (the uncached rest), as for Anthropic.
"""

import json
from typing import Any

from harness import settings
from harness.agents.common import (DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, describe_status_error, parse_arguments,
                                   redact)
from harness.agents.pricing import cost_usd
from harness.protocol import AgentError, AgentTurn, Message, StopReason, ToolCall, ToolSpec, Usage

__all__ = ["OpenAIChatAgent", "OPENAI_API_URL", "PLACEHOLDER_KEY", "FINISH_REASONS"]

OPENAI_API_URL = "https://api.openai.com/v1"
# Sent to openai-compatible servers when no key is given: the SDK insists on one, local servers ignore it.
PLACEHOLDER_KEY = "not-needed"

FINISH_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class OpenAIChatAgent:
    """A model behind a Chat Completions endpoint. Stateless: each `step` sends the whole conversation."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        compatible: bool = False,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        import openai

        self.model = model
        self.compatible = compatible
        self.max_retries = max_retries
        if compatible:
            if not base_url:
                raise AgentError(f"openai-compatible agent for {model!r} needs a base_url")
            self.base_url = base_url
            self.name = f"openai-compatible:{base_url}#{model}"
            key = api_key or PLACEHOLDER_KEY
        else:
            self.base_url = base_url or settings.base_url("openai") or OPENAI_API_URL
            self.name = f"openai:{model}"
            key = api_key if api_key is not None else settings.api_key("openai")
            if not key:
                raise AgentError(f"{self.name}: no API key; set OPENAI_API_KEY in the environment")
        self._secret = "" if key == PLACEHOLDER_KEY else key
        self._sdk = openai
        self._client = openai.OpenAI(api_key=key, base_url=self.base_url, max_retries=max_retries, timeout=timeout_s)

    def __repr__(self) -> str:
        return f"OpenAIChatAgent(model={self.model!r}, base_url={self.base_url!r}, compatible={self.compatible})"

    def step(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> AgentTurn:
        request = build_request(self.model, system, messages, tools, max_tokens, compatible=self.compatible)
        try:
            completion = self._client.chat.completions.create(**request)
        except self._sdk.APIStatusError as err:
            raise AgentError(self._describe_status(err)) from None
        except self._sdk.APIConnectionError as err:
            what = "timed out" if isinstance(err, self._sdk.APITimeoutError) else "could not connect"
            raise AgentError(
                redact(
                    f"{self.name}: request to {self.base_url} {what} after {self.max_retries} retries: {err}",
                    self._secret,
                )
            ) from None
        return parse_completion(completion, self.model, priced=not self.compatible, name=self.name)

    def _describe_status(self, err: Any) -> str:
        return describe_status_error(self.name, err, key_hint="" if self.compatible else "check OPENAI_API_KEY",
                                     retry_note=f"still failing after {self.max_retries} retries, or retry-after "
                                                "beyond the SDK's limit", secret=self._secret)

def build_request(
    model: str,
    system: str,
    messages: list[Message],
    tools: list[ToolSpec],
    max_tokens: int,
    *,
    compatible: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` for this conversation."""
    wire: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        wire.extend(_wire(message))
    request: dict[str, Any] = {"model": model, "messages": wire}
    # OpenAI's reasoning models reject max_tokens; vLLM / SGLang / Ollama all read max_tokens.
    request["max_tokens" if compatible else "max_completion_tokens"] = max_tokens
    if tools:
        request["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools
        ]
    return request


def _wire(message: Message) -> list[dict[str, Any]]:
    if message.role == "user":
        return [{"role": "user", "content": message.text}] if message.text else []
    if message.role == "tool":
        return [
            {"role": "tool", "tool_call_id": r.call_id, "content": ("ERROR: " + r.content) if r.is_error else r.content}
            for r in message.results
        ]
    turn = message.turn
    text = turn.text if turn is not None else message.text
    calls = turn.tool_calls if turn is not None else ()
    if not text and not calls:
        return []
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        entry["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c)}}
            for c in calls
        ]
    return [entry]


def _arguments_text(call: ToolCall) -> str:
    # Send back what the model wrote when it was valid (keeps the cached prefix byte-identical);
    # "{}" when it was not, since some servers parse history arguments and fail on invalid JSON.
    if call.raw_arguments and not call.parse_error:
        return call.raw_arguments
    return json.dumps(call.arguments)


def parse_completion(completion: Any, requested_model: str, *, priced: bool, name: str = "") -> AgentTurn:
    """An SDK `ChatCompletion` as an AgentTurn."""
    if not completion.choices:
        raise AgentError(f"{name or requested_model}: the server answered with no choices")
    choice = completion.choices[0]
    message = choice.message
    calls = tuple(_tool_call(i, c) for i, c in enumerate(message.tool_calls or ()))
    refusal = getattr(message, "refusal", None)
    text = message.content or refusal or ""
    reason = choice.finish_reason
    if refusal and not message.content:
        stop: StopReason = "refusal"
    elif calls and reason in (None, "stop"):
        # vLLM / Ollama often say "stop" although the message carries tool calls.
        stop = "tool_use"
    else:
        stop = FINISH_REASONS.get(reason or "", "tool_use" if calls else "end_turn")
    return AgentTurn(
        text=text,
        tool_calls=calls,
        stop_reason=stop,
        usage=_usage(completion.usage, requested_model, priced=priced),
        model=completion.model or requested_model,
    )


def _tool_call(index: int, call: Any) -> ToolCall:
    call_id = getattr(call, "id", None) or f"call_{index}"
    function = getattr(call, "function", None)
    if function is None:
        # A "custom" tool call (free-form input): never offered by the harness, so report it.
        custom = getattr(call, "custom", None)
        name = getattr(custom, "name", "") or ""
        raw = getattr(custom, "input", "") or ""
        return ToolCall(id=call_id, name=name, arguments={}, raw_arguments=raw, parse_error="not a function tool call")
    raw = function.arguments
    arguments, error = parse_arguments(raw)
    raw_text = raw if isinstance(raw, str) else json.dumps(raw)
    return ToolCall(
        id=call_id, name=function.name or "", arguments=arguments, raw_arguments=raw_text, parse_error=error
    )


def _usage(usage: Any, model: str, *, priced: bool) -> Usage:
    """prompt_tokens includes cached tokens; Usage.input_tokens is the uncached rest."""
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    cached = (getattr(details, "cached_tokens", None) or 0) if details is not None else 0
    written = (getattr(details, "cache_write_tokens", None) or 0) if details is not None else 0
    prompt = usage.prompt_tokens or 0
    tokens = {
        "input_tokens": max(prompt - cached - written, 0),
        "output_tokens": usage.completion_tokens or 0,
        "cache_read_tokens": cached,
        "cache_write_tokens": written,
    }
    return Usage(**tokens, cost_usd=cost_usd(model, **tokens) if priced else None)
