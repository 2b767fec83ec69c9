"""Reporters: one `path:line:col: rule message` line per finding, or a JSON list of objects."""

import json
from collections.abc import Sequence

from guards.findings import Finding

__all__ = ["format_text", "format_json", "FORMATS"]


def format_text(findings: Sequence[Finding]) -> str:
    return "".join(f.to_text() + "\n" for f in findings)


def format_json(findings: Sequence[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2) + "\n"


FORMATS = {"text": format_text, "json": format_json}
