"""Small helpers every API backend needs: secret redaction, defensive tool-argument parsing, and
one-line descriptions of HTTP errors."""

import json
from typing import Any

__all__ = ["redact", "parse_arguments", "describe_status_error", "DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT_S"]

# The SDKs retry 408/409/429/5xx and connection errors themselves, honouring retry-after; with
# their 0.5 s doubling backoff (capped at 8 s) four retries ride out ~8 s of trouble without
# retry-after, and as long as the server asks for with it.
DEFAULT_MAX_RETRIES = 4
# Explicit, so the Anthropic SDK does not refuse non-streaming calls with a large max_tokens (it
# does when the client runs on its default timeout) and a hung server cannot stall a run forever.
DEFAULT_TIMEOUT_S = 600.0


def redact(text: str, *secrets: str) -> str:
    """`text` with every occurrence of each non-empty secret replaced, for error messages."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
    return text


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str]:
    """Tool arguments as a dict, plus "" or why they could not be used.

    The wire gives an object (Anthropic) or a JSON string (OpenAI), but models and servers get it
    wrong: invalid JSON, a list, a string holding JSON. The loop answers a parse error with a tool
    error instead of crashing, so this never raises.
    """
    if isinstance(raw, dict):
        return raw, ""
    if isinstance(raw, str):
        if not raw.strip():
            # Servers send "" for a tool without parameters (Ollama, some vLLM parsers).
            return {}, ""
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            return {}, f"arguments are not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        if isinstance(value, dict):
            return value, ""
        return {}, f"arguments must be a JSON object, got {type(value).__name__}"
    if raw is None:
        return {}, ""
    return {}, f"arguments must be a JSON object, got {type(raw).__name__}"


def describe_status_error(name: str, err: Any, *, key_hint: str, retry_note: str, secret: str) -> str:
    """One line for an SDK's APIStatusError: backend, status, error type and message, a hint for
    auth failures (key_hint, e.g. "check ANTHROPIC_API_KEY"; "" for none) and for errors the SDK
    already retried (retry_note), the request id; redacted and capped at 2000 characters.

    Both SDKs hand over the error body; OpenAI-style servers may still nest it under "error".
    """
    body = err.body if isinstance(err.body, dict) else {}
    detail = body.get("error") if isinstance(body.get("error"), dict) else body
    kind = detail.get("type") or detail.get("code") or type(err).__name__
    message = detail.get("message") or str(err.body or err.message)
    text = f"{name}: HTTP {err.status_code} {kind}: {message}"
    if err.status_code in (401, 403) and key_hint:
        text += f" ({key_hint})"
    elif err.status_code == 429 or err.status_code >= 500:
        text += f" ({retry_note})"
    if err.request_id:
        text += f" [request-id {err.request_id}]"
    return redact(text[:2000], secret)
