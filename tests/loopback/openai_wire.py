"""OpenAI Chat Completions wire: completion bodies and errors, as api.openai.com and vLLM send them."""

import itertools
import json
from typing import Any

from tests.loopback.server import LoopbackServer, Reply, Responder

__all__ = ["openai_server", "completion", "tool_call", "error", "rate_limited", "usage"]

_ids = itertools.count(1)


def openai_server(*, fallback: Responder | None = None) -> LoopbackServer:
    """A loopback server for POST /v1/chat/completions (base_url = server.url + "/v1")."""
    return LoopbackServer({"/v1/chat/completions"}, fallback=fallback)


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """`arguments` goes out as given when a string (so tests can send broken JSON), else as JSON."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def usage(prompt: int = 20, completion_: int = 7, cached: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_,
        "total_tokens": prompt + completion_,
    }
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def completion(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    model: str = "gpt-4.1-2025-04-14",
    tokens: dict[str, Any] | None = None,
    refusal: str | None = None,
) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {
        "id": f"chatcmpl-{next(_ids):06d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": tokens if tokens is not None else usage(),
    }
    return Reply(200, body, {"x-request-id": f"req_{body['id']}"})


def error(status: int, kind: str, message: str, headers: dict[str, str] | None = None, hold_s: float = 0.0) -> Reply:
    return Reply(
        status,
        {"error": {"message": message, "type": kind, "param": None, "code": None}},
        {"x-request-id": f"req_err_{next(_ids):06d}", **(headers or {})},
        hold_s=hold_s,
    )


def rate_limited(retry_after: str, *, header: str = "retry-after", hold_s: float) -> Reply:
    return error(429, "rate_limit_exceeded", "Rate limit reached", {header: retry_after}, hold_s)
