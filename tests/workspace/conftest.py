"""Fixtures of workspace_helpers, visible to every test here."""

from tests.workspace.workspace_helpers import user_repo

__all__ = ["user_repo"]
