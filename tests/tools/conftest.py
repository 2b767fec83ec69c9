"""Fixtures of tools_helpers, visible to every test here."""

from tests.tools.tools_helpers import ctx, tree

__all__ = ["ctx", "tree"]
