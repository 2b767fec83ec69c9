"""Replay backend (`replay:<path>`): plays recorded turns back in order, as a real ChatAgent (the demo and the
loop's tests drive the real loop and gates with it). It reads a trajectory JSONL (`{"type": "turn", ...}` per
line) or a run's events.jsonl (the `turn` of each `llm_call`); other lines are skipped. It does not react.
"""

import json
from pathlib import Path

from harness.protocol import AgentError, AgentTurn, Message, ToolSpec

__all__ = ["ReplayAgent", "load_turns"]


def load_turns(path: Path) -> list[AgentTurn]:
    """The recorded turns of a trajectory or run-events file, in file order."""
    if path.is_dir():
        path = path / "events.jsonl"
    if not path.is_file():
        raise ValueError(f"replay file not found: {path}")
    turns: list[AgentTurn] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                continue
            kind = record.get("type")
            if kind == "turn":
                turns.append(AgentTurn.from_json({k: v for k, v in record.items() if k != "type"}))
            elif kind == "llm_call" and isinstance(record.get("turn"), dict):
                turns.append(AgentTurn.from_json(record["turn"]))
    if not turns:
        raise ValueError(f"{path}: no recorded turns (lines with type 'turn', or 'llm_call' events with a 'turn')")
    return turns


class ReplayAgent:
    """Returns the recorded turns one per `step`; AgentError once they run out."""

    def __init__(self, turns: list[AgentTurn], *, name: str = "replay") -> None:
        self.name = name
        self._turns = list(turns)
        self._next = 0

    @classmethod
    def from_path(cls, path: str | Path) -> "ReplayAgent":
        return cls(load_turns(Path(path)), name=f"replay:{path}")

    @property
    def remaining(self) -> int:
        return len(self._turns) - self._next

    def step(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> AgentTurn:
        if self._next >= len(self._turns):
            raise AgentError(f"replay exhausted after {len(self._turns)} turns")
        turn = self._turns[self._next]
        self._next += 1
        return turn
