"""Keeping tool output inside the model's budget: cut the middle, keep head and tail, say how much."""

__all__ = ["truncate_middle", "omitted_marker"]


def omitted_marker(n: int, unit: str = "bytes") -> str:
    return f"\n[... {n} {unit} omitted ...]\n"


def truncate_middle(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its head and tail around an omission marker.

    The middle goes because the head says what ran and the tail says how it ended (errors, the
    exit code), which is what a model needs to act.
    """
    if limit <= 0 or len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head = text[: keep // 2]
    tail = text[len(text) - (keep - keep // 2) :]
    return head + omitted_marker(len(text) - len(head) - len(tail), "characters") + tail
