"""What rules may ask about the whole run: the config, which modules exist, which lines are suppressed."""

from pathlib import Path

from guards.config import GuardsConfig

__all__ = ["Project"]


class Project:
    """Shared, read-mostly state of one check run; built by the runner before any file is parsed."""

    def __init__(self, config: GuardsConfig, modules: dict[str, Path]):
        self.config = config
        self.root = config.root
        self.modules = modules  # dotted name -> file, for every file of this run
        self._exists: dict[str, bool] = {}
        self._suppressed: dict[str, dict[int, frozenset[str]]] = {}

    def is_module(self, name: str) -> bool:
        """A module (or package) of this run, or a file for it under the config root."""
        if name in self.modules:
            return True
        known = self._exists.get(name)
        if known is None:
            base = self.root.joinpath(*name.split("."))
            known = self._exists[name] = base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
        return known

    def add_suppressions(self, path: str, by_line: dict[int, frozenset[str]]) -> None:
        if by_line:
            self._suppressed[path] = by_line

    def is_suppressed(self, path: str, line: int, rule: str) -> bool:
        return rule in self._suppressed.get(path, {}).get(line, ())
