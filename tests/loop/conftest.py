"""Fixtures of loop_helpers, visible to every test here."""

from tests.loop.loop_helpers import home, project_template

__all__ = ["home", "project_template"]
