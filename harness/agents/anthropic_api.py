"""Anthropic Messages API backend (`anthropic:<model>`), through the official `anthropic` SDK.

Wire mapping of the neutral conversation:
- system prompt -> one system text block; tools -> tool definitions (name, description, input_schema);
- assistant turn -> text + tool_use blocks (or its `provider_content` verbatim: thinking blocks must
  come back unchanged, or the API rejects the tool loop);
- tool results -> one user message of tool_result blocks, in call order, with is_error;
- consecutive same-role messages are merged (the API wants alternating roles).

Prompt caching: cache_control {"type": "ephemeral"} on the last tool definition, on the system block
and on the last block of the last message. Tools and system are the stable prefix; the moving
breakpoint on the newest message lets every call read the previous call's cache (the API looks back
up to 20 blocks for an earlier breakpoint), so a growing conversation pays for each token once.
Three of the four breakpoints a request may carry.

Non-streaming on purpose: the SDK's streaming accumulator raises on malformed tool-input JSON, and
a malformed tool call must reach the loop as `ToolCall.parse_error`, not as a crash.
"""

import json
from typing import Any

from harness import settings
from harness.agents.common import (DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, describe_status_error, parse_arguments,
                                   redact)
from harness.agents.pricing import cost_usd
from harness.protocol import AgentError, AgentTurn, Message, StopReason, ToolCall, ToolSpec, Usage

__all__ = ["AnthropicAgent", "ANTHROPIC_API_URL", "STOP_REASONS"]

ANTHROPIC_API_URL = "https://api.anthropic.com"

STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "stop_sequence": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    # The context window filled up mid-answer: the output is cut off exactly as with max_tokens.
    "model_context_window_exceeded": "max_tokens",
    "pause_turn": "pause_turn",
    "refusal": "refusal",
}

_EPHEMERAL = {"type": "ephemeral"}
# Block types the API accepts cache_control on (thinking blocks are cached with their turn, but
# cannot carry a breakpoint themselves).
_CACHEABLE = ("text", "tool_use", "tool_result", "image", "document")


class AnthropicAgent:
    """A Claude model behind the Messages API. Stateless: each `step` sends the whole conversation."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        prompt_caching: bool = True,
    ) -> None:
        import anthropic

        key = api_key if api_key is not None else settings.api_key("anthropic")
        if not key:
            raise AgentError(f"anthropic:{model}: no API key; set ANTHROPIC_API_KEY in the environment")
        self.name = f"anthropic:{model}"
        self.model = model
        self.base_url = base_url or settings.base_url("anthropic") or ANTHROPIC_API_URL
        self.max_retries = max_retries
        self.prompt_caching = prompt_caching
        self._secret = key
        self._sdk = anthropic
        self._client = anthropic.Anthropic(
            api_key=key, base_url=self.base_url, max_retries=max_retries, timeout=timeout_s
        )

    def __repr__(self) -> str:
        return f"AnthropicAgent(model={self.model!r}, base_url={self.base_url!r})"

    def step(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> AgentTurn:
        request = build_request(self.model, system, messages, tools, max_tokens, prompt_caching=self.prompt_caching)
        try:
            response = self._client.messages.create(**request)
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
        return parse_response(response, self.model)

    def _describe_status(self, err: Any) -> str:
        return describe_status_error(self.name, err, key_hint="check ANTHROPIC_API_KEY",
                                     retry_note=f"still failing after {self.max_retries} retries", secret=self._secret)

def build_request(
    model: str,
    system: str,
    messages: list[Message],
    tools: list[ToolSpec],
    max_tokens: int,
    *,
    prompt_caching: bool = True,
) -> dict[str, Any]:
    """The keyword arguments of `messages.create` for this conversation (plain JSON values)."""
    request: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": _wire_messages(messages)}
    if system:
        request["system"] = [{"type": "text", "text": system}]
    if tools:
        request["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]
    if prompt_caching:
        if tools:
            request["tools"][-1]["cache_control"] = dict(_EPHEMERAL)
        if system:
            request["system"][-1]["cache_control"] = dict(_EPHEMERAL)
        _mark_last_block(request["messages"])
    return request


def _wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    wire: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            # The API rejects empty content (e.g. an assistant turn cut off before any output).
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "user":
        return "user", ([{"type": "text", "text": message.text}] if message.text else [])
    if message.role == "tool":
        return "user", [
            {"type": "tool_result", "tool_use_id": r.call_id, "content": r.content, "is_error": r.is_error}
            for r in message.results
        ]
    turn = message.turn
    if turn is None:
        return "assistant", ([{"type": "text", "text": message.text}] if message.text else [])
    if turn.provider_content:
        return "assistant", [dict(block) for block in turn.provider_content]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in turn.tool_calls]
    return "assistant", blocks


def _mark_last_block(wire: list[dict[str, Any]]) -> None:
    if not wire:
        return
    for block in reversed(wire[-1]["content"]):
        if block.get("type") in _CACHEABLE:
            block["cache_control"] = dict(_EPHEMERAL)
            return


def parse_response(response: Any, requested_model: str) -> AgentTurn:
    """An SDK `Message` as an AgentTurn; keeps the raw blocks when they hold more than text and tools."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    raw_blocks: list[dict[str, Any]] = []
    plain = True
    for block in response.content or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
            raw_blocks.append({"type": "text", "text": block.text})
        elif kind == "tool_use":
            call = _tool_call(block)
            calls.append(call)
            raw_blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        else:
            # thinking / redacted_thinking / server tool blocks: returned verbatim next call.
            plain = False
            raw_blocks.append(block.to_dict(mode="json", exclude_none=True))
    usage = _usage(response.usage, requested_model, response.model or "")
    reason = response.stop_reason
    stop: StopReason = STOP_REASONS.get(reason or "", "tool_use" if calls else "end_turn")
    return AgentTurn(
        text="\n".join(t for t in texts if t),
        tool_calls=tuple(calls),
        stop_reason=stop,
        usage=usage,
        model=response.model or requested_model,
        provider_content=() if plain else tuple(raw_blocks),
    )


def _tool_call(block: Any) -> ToolCall:
    raw = block.input
    arguments, error = parse_arguments(raw)
    if isinstance(raw, str):
        raw_text = raw
    else:
        raw_text = json.dumps(raw) if raw is not None else ""
    return ToolCall(id=block.id, name=block.name, arguments=arguments, raw_arguments=raw_text, parse_error=error)


def _usage(usage: Any, requested_model: str, served_model: str) -> Usage:
    """Tokens as the API counts them: input_tokens excludes cache reads and writes."""
    if usage is None:
        return Usage()
    tokens = {
        "input_tokens": usage.input_tokens or 0,
        "output_tokens": usage.output_tokens or 0,
        "cache_write_tokens": usage.cache_creation_input_tokens or 0,
        "cache_read_tokens": usage.cache_read_input_tokens or 0,
    }
    # An alias may be missing from the table while the dated snapshot that served it is listed.
    cost = cost_usd(requested_model, **tokens)
    if cost is None and served_model:
        cost = cost_usd(served_model, **tokens)
    return Usage(**tokens, cost_usd=cost)
