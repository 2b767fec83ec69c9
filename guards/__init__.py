"""AST guards for the engine's red lines: ssot, dag, public-surface, fail-fast.

Run with `temper guards check [PATH ...]` or `python -m guards check`. Rules and their ids are
listed in guards/rules/; configuration (layers, env modules, whitelist) lives in guards.toml.
"""

__all__: list[str] = []
