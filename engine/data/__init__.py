"""Data pipeline: tokenizers, `prepare` (datasets -> memory-mapped token shards), packing and loading.

Why and how: docs/engine/data.md, section `engine/data/__init__.py`.
"""

__all__: list[str] = []
