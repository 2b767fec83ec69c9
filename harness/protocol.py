"""The provider-neutral conversation every part of the harness speaks: messages, turns, tool calls, usage.

harness/agents/api.py translates it to and from the wires; records store it as JSON; replay plays turns back.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["ToolSpec", "ToolCall", "ToolResult", "Usage", "AgentTurn", "Message", "StopReason", "Submitted",
           "LimitsExceeded", "FormatError", "AgentError", "LoopOptions"]

# end_turn: the model finished without tool calls; tool_use: it asked for tools; max_tokens: output
# was cut off; refusal: the model declined; pause_turn: the server paused a long turn (continue it).
StopReason = Literal["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to API agents: name, description and a JSON-schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation; arguments the model sent as invalid JSON are {} with `parse_error` saying why."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""
    parse_error: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned to the model. `submitted` is set by the `submit` tool only."""

    call_id: str
    content: str
    is_error: bool = False
    submitted: bool = False


@dataclass(frozen=True)
class Usage:
    """Tokens of one model call, and its cost; cost_usd is None when the price is unknown."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None

    def __add__(self, other: "Usage") -> "Usage":
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.cache_read_tokens + other.cache_read_tokens, self.cache_write_tokens + other.cache_write_tokens, cost)


@dataclass(frozen=True)
class AgentTurn:
    """One model response: text, tool calls, why it stopped, and what it cost. `provider_content`: the provider's
    own blocks when they say more than text and tool calls (Anthropic thinking blocks, sent back verbatim)."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason = "end_turn"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    provider_content: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "AgentTurn":
        return AgentTurn(
            text=data.get("text", ""),
            tool_calls=tuple(ToolCall(**c) for c in data.get("tool_calls", ())),
            stop_reason=data.get("stop_reason", "end_turn"),
            usage=Usage(**data.get("usage", {})),
            model=data.get("model", ""),
            provider_content=tuple(data.get("provider_content", ())),
        )


@dataclass(frozen=True)
class Message:
    """One entry of the conversation: "user" `text` from the harness (prompt, gate feedback), an "assistant"
    `turn`, or "tool" `results` of the previous turn's calls in call order. The system prompt is not a Message."""

    role: Literal["user", "assistant", "tool"]
    text: str = ""
    turn: AgentTurn | None = None
    results: tuple[ToolResult, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Message":
        turn = data.get("turn")
        return Message(
            role=data["role"],
            text=data.get("text", ""),
            turn=AgentTurn.from_json(turn) if turn else None,
            results=tuple(ToolResult(**r) for r in data.get("results", ())),
        )


class AgentError(RuntimeError):
    """A backend failed for good (after the SDK's own retries): auth, bad request, server down."""


class Submitted(Exception):
    """Control flow: the agent called `submit`; the loop judges the attempt."""


class LimitsExceeded(Exception):
    """Control flow: a budget (turns, tokens, cost, wall time, attempts) is spent."""


class FormatError(Exception):
    """Control flow: the model's output could not be used (e.g. a truncated tool call)."""


@dataclass(frozen=True)
class LoopOptions:
    """Knobs of the loop itself (the milestone's budget bounds the run)."""

    max_output_tokens: int = 16_384  # per model call
    shell_timeout_s: float = 300.0  # default of the agent's `run` tool
