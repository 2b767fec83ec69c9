"""Anthropic Messages wire: response bodies, errors and their SSE form, as the real API sends them."""

import itertools
import json
from typing import Any

from tests.loopback.server import LoopbackServer, Recorded, Reply, Responder

__all__ = [
    "anthropic_server",
    "message",
    "text",
    "tool_use",
    "thinking",
    "reply",
    "error",
    "rate_limited",
    "as_sse",
    "usage",
]

_ids = itertools.count(1)


def anthropic_server(*, fallback: Responder | None = None) -> LoopbackServer:
    """A loopback server for POST /v1/messages (non-streaming and stream: true both work)."""
    return LoopbackServer({"/v1/messages"}, fallback=fallback)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def thinking(value: str, signature: str = "sig-opaque") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": signature}


def usage(input_tokens: int = 10, output_tokens: int = 5, cache_write: int = 0, cache_read: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": cache_write,
        "cache_read_input_tokens": cache_read,
    }


def message(
    *content: dict[str, Any],
    stop_reason: str = "end_turn",
    model: str = "claude-opus-5",
    tokens: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": f"msg_{next(_ids):06d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": tokens if tokens is not None else usage(),
    }


def as_sse(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The event stream the API sends for `body` when the request had stream: true."""
    start = dict(body, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = dict(body["usage"], output_tokens=1)
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        elif block["type"] == "tool_use":
            first = dict(block, input={})
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        elif block["type"] == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        else:
            first, deltas = block, []
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": first}))
        for delta in deltas:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": body["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def reply(body: dict[str, Any], request: Recorded | None = None) -> Reply:
    """`body` as JSON, or as SSE when the request asked to stream."""
    if request is not None and isinstance(request.body, dict) and request.body.get("stream"):
        return Reply(200, sse=as_sse(body), headers={"request-id": f"req_{body['id']}"})
    return Reply(200, body, {"request-id": f"req_{body['id']}"})


def error(status: int, kind: str, text_: str, headers: dict[str, str] | None = None, hold_s: float = 0.0) -> Reply:
    return Reply(
        status,
        {"type": "error", "error": {"type": kind, "message": text_}},
        {"request-id": f"req_err_{next(_ids):06d}", **(headers or {})},
        hold_s=hold_s,
    )


def rate_limited(retry_after: str, *, header: str = "retry-after", hold_s: float) -> Reply:
    """A 429 that keeps answering 429 until `hold_s` has passed, like the real limiter."""
    return error(
        429, "rate_limit_error", "Number of requests has exceeded your rate limit", {header: retry_after}, hold_s
    )
