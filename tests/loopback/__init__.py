"""Loopback HTTP servers speaking the Anthropic Messages and OpenAI Chat Completions wires, for
tests that drive the real SDK clients (and real CLIs) end to end without network or mocks."""

__all__: list[str] = []
