"""Secrets never reach a run's records: the literal values of ANTHROPIC_API_KEY / OPENAI_API_KEY and anything
shaped like an API key become "[redacted]" in every string the records write, and in job logs (scrubbed in
place when the job ends)."""

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.atomic import fsync_dir

__all__ = ["REDACTED", "scrub", "scrub_text", "scrub_file", "without_secret_fields"]

REDACTED = "[redacted]"

# Shapes of provider keys: Anthropic (sk-ant-api03-...), OpenAI (sk-..., sk-proj-...), any bearer token.
# The look-behind keeps words like "disk-usage-..." from matching "sk-".
_KEY_PATTERNS = (
    re.compile(r"(?<![A-Za-z0-9])sk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/\-]{16,}=*"),
)
# Literal env values shorter than this are not replaced: a 3-character "key" would shred every text.
_MIN_LITERAL = 8
# Agent-spec fields that must never be stored, whatever their value.
_SECRET_FIELDS = re.compile(r"(?i)(api[_-]?key|secret|token|password|authorization)$")
def _secret_literals() -> list[str]:
    from harness.settings import api_key

    values = {api_key("anthropic"), api_key("openai")}
    # Longest first, so a key that contains another is replaced whole.
    return sorted((v for v in values if len(v) >= _MIN_LITERAL), key=len, reverse=True)


def scrub_text(text: str, literals: Iterable[str] | None = None) -> str:
    """`text` with API keys (the literal env values and key-shaped strings) replaced by [redacted]."""
    for literal in _secret_literals() if literals is None else literals:
        text = text.replace(literal, REDACTED)
    for pattern in _KEY_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def scrub(value: Any, literals: Iterable[str] | None = None) -> Any:
    """Deep copy of a JSON-like value with every string scrubbed and non-finite floats as strings
    ("nan", "inf", "-inf"), so each event is strict JSON that any tool can read."""
    lits = _secret_literals() if literals is None else list(literals)
    if isinstance(value, str):
        return scrub_text(value, lits)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {scrub_text(str(k), lits): scrub(v, lits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, lits) for v in value]
    if isinstance(value, Path):
        return scrub_text(str(value), lits)
    raise TypeError(f"cannot record a {type(value).__name__}: convert it to JSON data first")


def without_secret_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (without_secret_fields(v) if isinstance(v, Mapping) else v)
            for k, v in spec.items() if not _SECRET_FIELDS.search(str(k))}


def scrub_file(path: str | Path) -> bool:
    """Scrub a text file in place (streamed line by line, replaced atomically). True if it changed."""
    path = Path(path)
    literals = _secret_literals()
    tmp = path.with_name(f".{path.name}.scrub-{os.getpid()}")
    changed = False
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="") as src, \
            tmp.open("w", encoding="utf-8", errors="surrogateescape", newline="") as dst:
        for line in src:
            clean = scrub_text(line, literals)
            changed |= clean != line
            dst.write(clean)
        dst.flush()
        os.fsync(dst.fileno())
    if changed:
        os.replace(tmp, path)
        fsync_dir(path.parent)
    else:
        tmp.unlink()
    return changed
