"""Tests of the repository (pytest)."""

__all__: list[str] = []
