"""OpenAI Responses wire (POST /v1/responses, stream: true), the only wire the Codex CLI speaks.

Enough of it for Codex to run a turn: a final assistant message and function calls, streamed as
response.created / output_item.added / output_text.delta / output_item.done / response.completed.
"""

import itertools
import json
from typing import Any

from tests.loopback.server import LoopbackServer, Reply, Responder

__all__ = ["responses_server", "message_item", "function_call_item", "stream", "usage", "function_outputs"]

_ids = itertools.count(1)


def responses_server(*, fallback: Responder | None = None) -> LoopbackServer:
    return LoopbackServer({"/v1/responses"}, fallback=fallback)


def message_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{next(_ids):06d}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    n = next(_ids)
    return {
        "type": "function_call",
        "id": f"fc_{n:06d}",
        "call_id": f"call_{n:06d}",
        "status": "completed",
        "name": name,
        "arguments": json.dumps(arguments),
    }


def usage(input_tokens: int = 1000, cached: int = 0, output_tokens: int = 20) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def stream(*items: dict[str, Any], model: str = "gpt-5", tokens: dict[str, Any] | None = None) -> Reply:
    """One streamed response carrying `items`, in order."""
    seq = itertools.count()
    base = {
        "id": f"resp_{next(_ids):06d}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "in_progress",
        "model": model,
        "output": [],
    }
    events: list[tuple[str, dict[str, Any]]] = [("response.created", {"type": "response.created", "response": base})]
    for index, item in enumerate(items):
        started = dict(item, status="in_progress")
        if item["type"] == "message":
            started["content"] = []
        events.append(
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": index, "item": started},
            )
        )
        if item["type"] == "message":
            events.append(
                (
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "delta": item["content"][0]["text"],
                    },
                )
            )
        events.append(
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": index, "item": item})
        )
    done = dict(base, status="completed", output=list(items), usage=tokens if tokens is not None else usage())
    events.append(("response.completed", {"type": "response.completed", "response": done}))
    for _, data in events:
        data["sequence_number"] = next(seq)
    return Reply(200, sse=events)


def function_outputs(body: Any) -> list[dict[str, Any]]:
    """The function_call_output items a request carries (what Codex sends back after running a tool)."""
    items = body.get("input", []) if isinstance(body, dict) else []
    return [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
