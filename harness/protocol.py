"""The small data types every part of the harness speaks: conversation, tool calls, usage, results.

Provider-neutral on purpose: each agent backend converts `Message`s to its own wire format
(Anthropic Messages, OpenAI Chat Completions) and back to an `AgentTurn`. Records store these
types as JSON (`to_json` / `from_json`), and the replay backend plays recorded turns back.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "ToolSpec",
    "ToolCall",
    "ToolResult",
    "Usage",
    "AgentTurn",
    "Message",
    "StopReason",
    "Submitted",
    "LimitsExceeded",
    "FormatError",
    "AgentError",
]

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
    """One tool invocation requested by the model.

    `arguments` is the parsed JSON object. When the model sent arguments that are not valid JSON,
    `arguments` is {} and `parse_error` says why; the loop answers with a tool error, not a crash.
    """

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
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=cost,
        )


@dataclass(frozen=True)
class AgentTurn:
    """One model response: text, tool calls, why it stopped, and what it cost.

    `provider_content` holds the provider's own content blocks of this turn when they carry more
    than `text` and `tool_calls` can say (Anthropic thinking blocks with their signatures, server
    tool blocks). The backend that produced the turn sends them back verbatim on the next call,
    because the API rejects a tool loop whose thinking blocks were dropped. Empty otherwise.
    """

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
    """One entry of the provider-neutral conversation.

    role "user": `text` from the harness (milestone prompt, gate feedback).
    role "assistant": a model turn (`turn`).
    role "tool": results of the previous assistant turn's tool calls (`results`), in call order.
    The system prompt is not a Message: backends take it separately.
    """

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
