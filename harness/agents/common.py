"""Small helpers every API backend needs: secret redaction and defensive tool-argument parsing."""

import json
from typing import Any

__all__ = ["redact", "parse_arguments", "DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT_S"]

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
