"""API models (`anthropic:`, `openai:`, `openai-compatible:`) through their official SDKs, with one translator
between the provider-neutral conversation (harness.protocol) and the two wires.

Anthropic Messages: system prompt -> a system block; an assistant turn -> text + tool_use blocks (or its
`provider_content` verbatim: thinking blocks must come back unchanged or the API rejects the tool loop); tool
results -> one user message of tool_result blocks; same-role messages merged (the API wants alternating
roles). Prompt caching marks the last tool, the system block and the newest message's last block, so each
call reads the previous call's cache. OpenAI Chat Completions: a system message; arguments as JSON strings;
one "tool" message per result ("ERROR: " prefixed: the wire has no error flag). OpenAI caches prefixes itself.

`openai-compatible:` (vLLM, SGLang, Ollama) sends a placeholder key unless given one (the OpenAI key never goes
to a foreign server) and has no price. Non-streaming on purpose: a malformed tool call must reach the loop as
`ToolCall.parse_error`, and the SDKs' stream accumulators raise on it instead.
"""

import importlib
import json
from typing import Any

from harness import settings
from harness.agents.pricing import cost_usd
from harness.protocol import AgentError, AgentTurn, Message, StopReason, ToolCall, ToolSpec, Usage

__all__ = ["ApiAgent", "anthropic_agent", "openai_agent", "build_request", "parse_arguments", "PLACEHOLDER_KEY"]

# The SDKs retry 408/409/429/5xx and connection errors themselves, honouring retry-after; four retries with
# their 0.5 s doubling backoff ride out ~8 s of trouble. The explicit timeout keeps the Anthropic SDK from
# refusing non-streaming calls with a large max_tokens, and a hung server from stalling a run forever.
DEFAULT_MAX_RETRIES = 4
DEFAULT_TIMEOUT_S = 600.0
PLACEHOLDER_KEY = "not-needed"  # the SDK insists on a key; local servers ignore it
_URLS = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}
_STOPS: dict[str, StopReason] = {
    "end_turn": "end_turn", "stop_sequence": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",  # cut off exactly as at max_tokens
    "pause_turn": "pause_turn", "refusal": "refusal",  # Anthropic's; OpenAI's below
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
    "content_filter": "refusal",
}
_EPHEMERAL = {"type": "ephemeral"}
_CACHEABLE = ("text", "tool_use", "tool_result", "image", "document")  # thinking blocks cannot carry a breakpoint


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str]:
    """Tool arguments as a dict, plus "" or why they cannot be used (never raises: the loop answers a tool error).

    The wire gives an object (Anthropic) or a JSON string (OpenAI), and models get it wrong: invalid JSON, a list.
    """
    if raw is None or isinstance(raw, str) and not raw.strip():
        return {}, ""  # servers send "" for a tool without parameters (Ollama, some vLLM parsers)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            return {}, f"arguments are not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
    if isinstance(raw, dict):
        return raw, ""
    return {}, f"arguments must be a JSON object, got {type(raw).__name__}"


def _entries(anthropic: bool, message: Message) -> list[dict[str, Any]]:
    """The wire messages of one neutral message (none when it would be empty: the APIs reject empty content)."""
    if message.role == "user":
        content: Any = [{"type": "text", "text": message.text}] if anthropic else message.text
        return [{"role": "user", "content": content}] if message.text else []
    if message.role == "tool":
        if not message.results:
            return []
        if anthropic:
            return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.call_id, "content": r.content,
                                                  "is_error": r.is_error} for r in message.results]}]
        return [{"role": "tool", "tool_call_id": r.call_id, "content": ("ERROR: " if r.is_error else "") + r.content}
                for r in message.results]
    turn = message.turn
    text, calls = (turn.text, turn.tool_calls) if turn is not None else (message.text, ())
    if anthropic:
        if turn is not None and turn.provider_content:
            return [{"role": "assistant", "content": [dict(block) for block in turn.provider_content]}]
        blocks = [{"type": "text", "text": text}] if text else []
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in calls]
        return [{"role": "assistant", "content": blocks}] if blocks else []
    if not text and not calls:
        return []
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:  # what the model wrote when it was valid (keeps the cached prefix byte-identical), else "{}"-like
        entry["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": c.raw_arguments if c.raw_arguments and not c.parse_error else json.dumps(c.arguments)}}
            for c in calls]
    return [entry]


def build_request(provider: str, model: str, system: str, messages: list[Message], tools: list[ToolSpec],
                  max_tokens: int, *, prompt_caching: bool = True) -> dict[str, Any]:
    """The keyword arguments of `messages.create` (anthropic) or `chat.completions.create` (the others)."""
    anthropic = provider == "anthropic"
    wire: list[dict[str, Any]] = [] if anthropic or not system else [{"role": "system", "content": system}]
    for message in messages:
        for entry in _entries(anthropic, message):
            if anthropic and wire and wire[-1]["role"] == entry["role"]:
                wire[-1]["content"].extend(entry["content"])
            else:
                wire.append(entry)
    request: dict[str, Any] = {"model": model, "messages": wire}
    # OpenAI's reasoning models reject max_tokens; Anthropic, vLLM, SGLang and Ollama read it.
    request["max_completion_tokens" if provider == "openai" else "max_tokens"] = max_tokens
    if anthropic:
        if system:
            request["system"] = [{"type": "text", "text": system}]
        if tools:
            request["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]
        if prompt_caching:
            for part in (request.get("tools", [])[-1:] + request.get("system", [])):
                part["cache_control"] = dict(_EPHEMERAL)
            last = next((b for b in reversed(wire[-1]["content"]) if b.get("type") in _CACHEABLE), None) if wire else None
            if last is not None:
                last["cache_control"] = dict(_EPHEMERAL)
    elif tools:
        request["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                              "parameters": t.parameters}} for t in tools]
    return request


def _call(call_id: str, name: str, raw: Any) -> ToolCall:
    arguments, error = parse_arguments(raw)
    text = raw if isinstance(raw, str) else json.dumps(raw) if raw is not None else ""
    return ToolCall(id=call_id, name=name, arguments=arguments, raw_arguments=text, parse_error=error)


def _usage(model: str, served: str, priced: bool, **tokens: int) -> Usage:
    """Usage with its cost; an alias missing from the price table may be listed under the snapshot that served it."""
    cost = cost_usd(model, **tokens) if priced else None
    if priced and cost is None and served:
        cost = cost_usd(served, **tokens)
    return Usage(**tokens, cost_usd=cost)


def parse_response(provider: str, response: Any, model: str, name: str = "") -> AgentTurn:
    """An SDK response as an AgentTurn. Anthropic's raw blocks are kept when they hold more than text and tools."""
    if provider == "anthropic":
        texts, calls, blocks, plain = [], [], [], True
        for block in response.content or ():
            if block.type == "text":
                texts.append(block.text)
                blocks.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                calls.append(_call(block.id, block.name, block.input))
                blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": calls[-1].arguments})
            else:  # thinking / redacted_thinking / server tool blocks: sent back verbatim next call
                plain = False
                blocks.append(block.to_dict(mode="json", exclude_none=True))
        u = response.usage  # input_tokens excludes cache reads and writes
        usage = _usage(model, response.model or "", True, input_tokens=u.input_tokens or 0, output_tokens=u.output_tokens or 0,
                       cache_write_tokens=u.cache_creation_input_tokens or 0, cache_read_tokens=u.cache_read_input_tokens or 0
                       ) if u is not None else Usage()
        stop = _STOPS.get(response.stop_reason or "", "tool_use" if calls else "end_turn")
        return AgentTurn("\n".join(t for t in texts if t), tuple(calls), stop, usage, response.model or model,
                         () if plain else tuple(blocks))
    if not response.choices:
        raise AgentError(f"{name or model}: the server answered with no choices")
    choice, calls = response.choices[0], []
    for i, c in enumerate(choice.message.tool_calls or ()):
        if getattr(c, "function", None) is None:  # a "custom" (free-form) tool call: never offered, so reported
            custom = getattr(c, "custom", None)
            calls.append(ToolCall(getattr(c, "id", None) or f"call_{i}", getattr(custom, "name", "") or "", {},
                                  getattr(custom, "input", "") or "", "not a function tool call"))
        else:
            calls.append(_call(getattr(c, "id", None) or f"call_{i}", c.function.name or "", c.function.arguments))
    refusal = getattr(choice.message, "refusal", None)
    if refusal and not choice.message.content:
        stop: StopReason = "refusal"
    elif calls and choice.finish_reason in (None, "stop"):
        stop = "tool_use"  # vLLM and Ollama often say "stop" although the message carries tool calls
    else:
        stop = _STOPS.get(choice.finish_reason or "", "tool_use" if calls else "end_turn")
    u, usage = response.usage, Usage()
    if u is not None:  # prompt_tokens includes the cached ones; Usage.input_tokens is the uncached rest
        details = getattr(u, "prompt_tokens_details", None)
        cached, written = (getattr(details, "cached_tokens", None) or 0), (getattr(details, "cache_write_tokens", None) or 0)
        usage = _usage(model, "", provider == "openai", input_tokens=max((u.prompt_tokens or 0) - cached - written, 0),
                       output_tokens=u.completion_tokens or 0, cache_read_tokens=cached, cache_write_tokens=written)
    return AgentTurn(choice.message.content or refusal or "", tuple(calls), stop, usage, response.model or model)


class ApiAgent:
    """A model behind an API. Stateless: each `step` sends the whole conversation, so a run resumes from its records."""

    def __init__(self, provider: str, model: str, *, api_key: str, base_url: str, max_retries: int, timeout_s: float,
                 prompt_caching: bool = False) -> None:
        self.provider, self.model, self.base_url, self.max_retries = provider, model, base_url, max_retries
        self.name = f"openai-compatible:{base_url}#{model}" if provider == "openai-compatible" else f"{provider}:{model}"
        self.prompt_caching = prompt_caching
        self._secret = "" if api_key == PLACEHOLDER_KEY else api_key
        self._sdk: Any = importlib.import_module("anthropic" if provider == "anthropic" else "openai")
        client = self._sdk.Anthropic if provider == "anthropic" else self._sdk.OpenAI
        self._client = client(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s)

    def __repr__(self) -> str:
        return f"ApiAgent({self.name!r}, base_url={self.base_url!r})"

    def step(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> AgentTurn:
        request = build_request(self.provider, self.model, system, messages, tools, max_tokens,
                                prompt_caching=self.prompt_caching)
        create = self._client.messages.create if self.provider == "anthropic" else self._client.chat.completions.create
        try:
            return parse_response(self.provider, create(**request), self.model, self.name)
        except self._sdk.APIStatusError as err:
            raise AgentError(self._redact(self._describe(err))) from None
        except self._sdk.APIConnectionError as err:
            what = "timed out" if isinstance(err, self._sdk.APITimeoutError) else "could not connect"
            raise AgentError(self._redact(f"{self.name}: request to {self.base_url} {what} after {self.max_retries} "
                                          f"retries: {err}")) from None

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "<redacted>") if self._secret else text

    def _describe(self, err: Any) -> str:
        """One line: status, error type and message (OpenAI-style servers nest it under "error"), a hint, the request id."""
        body = err.body if isinstance(err.body, dict) else {}
        detail = body.get("error") if isinstance(body.get("error"), dict) else body
        kind = detail.get("type") or detail.get("code") or type(err).__name__
        text = f"{self.name}: HTTP {err.status_code} {kind}: {detail.get('message') or str(err.body or err.message)}"
        if err.status_code in (401, 403) and self.provider != "openai-compatible":
            text += f" (check {self.provider.upper()}_API_KEY)"
        elif err.status_code == 429 or err.status_code >= 500:
            text += f" (still failing after {self.max_retries} retries" + \
                    (")" if self.provider == "anthropic" else ", or retry-after beyond the SDK's limit)")
        if err.request_id:
            text += f" [request-id {err.request_id}]"
        return text[:2000]


def anthropic_agent(model: str, *, api_key: str | None = None, base_url: str | None = None, max_retries: int = DEFAULT_MAX_RETRIES,
                    timeout_s: float = DEFAULT_TIMEOUT_S, prompt_caching: bool = True) -> ApiAgent:
    """`anthropic:<model>`: needs ANTHROPIC_API_KEY (or api_key); ANTHROPIC_BASE_URL or base_url moves it."""
    key = api_key if api_key is not None else settings.api_key("anthropic")
    if not key:
        raise AgentError(f"anthropic:{model}: no API key; set ANTHROPIC_API_KEY in the environment")
    return ApiAgent("anthropic", model, api_key=key, base_url=base_url or settings.base_url("anthropic") or _URLS["anthropic"],
                    max_retries=max_retries, timeout_s=timeout_s, prompt_caching=prompt_caching)


def openai_agent(model: str, *, base_url: str | None = None, api_key: str | None = None, compatible: bool = False,
                 max_retries: int = DEFAULT_MAX_RETRIES, timeout_s: float = DEFAULT_TIMEOUT_S) -> ApiAgent:
    """`openai:<model>` (OPENAI_API_KEY, priced) or, with `compatible`, a server at `base_url` (cost unknown)."""
    if compatible:
        if not base_url:
            raise AgentError(f"openai-compatible agent for {model!r} needs a base_url")
        return ApiAgent("openai-compatible", model, api_key=api_key or PLACEHOLDER_KEY, base_url=base_url,
                        max_retries=max_retries, timeout_s=timeout_s)
    key = api_key if api_key is not None else settings.api_key("openai")
    if not key:
        raise AgentError(f"openai:{model}: no API key; set OPENAI_API_KEY in the environment")
    return ApiAgent("openai", model, api_key=key, base_url=base_url or settings.base_url("openai") or _URLS["openai"],
                    max_retries=max_retries, timeout_s=timeout_s)
