"""Reporters: one `path:line:col: rule message` line per finding, or a JSON list of objects; and the one-line
summary a person reads last ("120 files checked, no findings")."""

import json
from collections.abc import Sequence

from guards.findings import Finding

__all__ = ["format_text", "format_json", "FORMATS", "summary"]


def format_text(findings: Sequence[Finding]) -> str:
    return "".join(f.to_text() + "\n" for f in findings)


def format_json(findings: Sequence[Finding]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2) + "\n"


FORMATS = {"text": format_text, "json": format_json}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def summary(findings: int, files_with: int, files: int) -> str:
    """`120 files checked, no findings` or `3 findings in 2 of 120 files checked`: the count people look for first."""
    if not findings:
        return f"{_count(files, 'file')} checked, no findings"
    return f"{_count(findings, 'finding')} in {files_with} of {_count(files, 'file')} checked"
