"""Fixtures of tools_helpers, visible to every test here."""

from tools_helpers import ctx, tree

__all__ = ["ctx", "tree"]
