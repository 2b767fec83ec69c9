"""Temper's harness: drives an LLM agent through milestone specs and judges every attempt with gates
the agent cannot edit. Entry point: the `temper` console script (harness/cli.py)."""

__all__: list[str] = []
