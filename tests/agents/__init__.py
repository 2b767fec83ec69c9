"""Tests of harness.agents: real SDK clients and CLIs against loopback servers."""

__all__: list[str] = []
