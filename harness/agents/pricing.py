"""List prices of well-known models, so budgets can be checked in dollars while a run goes on.

USD per million tokens: (input, output, cache write, cache read). Anthropic cache writes are the
5-minute ephemeral rate (1.25x input), the only TTL the backends request; OpenAI bills cache writes
as ordinary input, so its write column equals input.

Checked 2026-11 against the providers' pricing pages (Anthropic: platform.claude.com "Pricing"
and the model overview pages; OpenAI: developers.openai.com pricing, as quoted in 2026-11). Models
whose price is tiered by prompt length, changed within the last weeks or whose cache rates were
not confirmed (Claude Haiku 5.5, Sonnet 5.5, Opus 5.5, Fable 5.2) are left out on purpose: a wrong
price is worse than "cost unknown".

Unknown model -> None. That is a normal state: every openai-compatible server (vLLM, SGLang,
Ollama) and every model missing here reports tokens but no cost, and budgets in dollars do not
apply to them. The table is a budget aid, not billing.
"""

import re
from typing import NamedTuple

__all__ = ["Price", "PRICES", "PRICES_CHECKED", "price_for", "cost_usd"]

PRICES_CHECKED = "2026-11"


class Price(NamedTuple):
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float


_OPUS_4 = Price(15.00, 75.00, 18.75, 1.50)
_OPUS_45 = Price(5.00, 25.00, 6.25, 0.50)
_SONNET_4 = Price(3.00, 15.00, 3.75, 0.30)

PRICES: dict[str, Price] = {
    # Anthropic
    "claude-fable-5-1": Price(10.00, 50.00, 12.50, 0.25),
    "claude-mythos-5-1": Price(10.00, 50.00, 12.50, 0.25),
    "claude-fable-5": Price(10.00, 50.00, 12.50, 1.00),
    "claude-mythos-5": Price(10.00, 50.00, 12.50, 1.00),
    "claude-opus-5": _OPUS_45,
    "claude-opus-4-8": _OPUS_45,
    "claude-opus-4-7": _OPUS_45,
    "claude-opus-4-6": _OPUS_45,
    "claude-opus-4-5": _OPUS_45,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-opus-4": _OPUS_4,
    "claude-sonnet-5": Price(2.00, 10.00, 2.50, 0.20),
    "claude-sonnet-4-6": _SONNET_4,
    "claude-sonnet-4-5": _SONNET_4,
    "claude-sonnet-4-0": _SONNET_4,
    "claude-sonnet-4": _SONNET_4,
    "claude-3-7-sonnet": _SONNET_4,
    "claude-haiku-4-5": Price(1.00, 5.00, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.00, 1.00, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.30, 0.03),
    # OpenAI
    "gpt-5.4": Price(2.50, 15.00, 2.50, 0.25),
    "gpt-5.4-mini": Price(0.75, 4.50, 0.75, 0.075),
    "gpt-5.2": Price(1.75, 14.00, 1.75, 0.175),
    "gpt-5.1": Price(1.25, 10.00, 1.25, 0.125),
    "gpt-5": Price(1.25, 10.00, 1.25, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.25, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.05, 0.005),
    "gpt-4.1": Price(2.00, 8.00, 2.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.40, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.10, 0.025),
    "gpt-4o": Price(2.50, 10.00, 2.50, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.15, 0.075),
    "o3": Price(2.00, 8.00, 2.00, 0.50),
    "o4-mini": Price(1.10, 4.40, 1.10, 0.275),
}

# A dated snapshot or "-latest" alias costs what its family costs; nothing else is stripped, so
# "gpt-5.3" is unknown rather than silently priced as "gpt-5".
_SNAPSHOT = re.compile(r"^(?P<base>.+?)(?:-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")


def price_for(model: str) -> Price | None:
    """The list price of `model` (exact name, or a dated snapshot of a listed name), else None."""
    if model in PRICES:
        return PRICES[model]
    match = _SNAPSHOT.match(model)
    if match and match.group("base") in PRICES:
        return PRICES[match.group("base")]
    return None


def cost_usd(
    model: str, *, input_tokens: int, output_tokens: int, cache_write_tokens: int = 0, cache_read_tokens: int = 0
) -> float | None:
    """Dollar cost of one call. `input_tokens` excludes cached ones (they are priced separately)."""
    price = price_for(model)
    if price is None:
        return None
    return (
        input_tokens * price.input
        + output_tokens * price.output
        + cache_write_tokens * price.cache_write
        + cache_read_tokens * price.cache_read
    ) / 1_000_000
