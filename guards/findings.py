"""A finding: one broken rule at one place in one file, with a message that says how to fix it."""

from dataclasses import dataclass
from typing import Any

__all__ = ["Finding"]


@dataclass(frozen=True, order=True)
class Finding:
    """Sorts by place, so reports are stable. `line` and `col` are 1-based, like ruff and flake8."""

    path: str
    line: int
    col: int
    rule: str
    message: str

    def to_text(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "path": self.path, "line": self.line, "col": self.col, "message": self.message}
