"""The shape of a rule: a stable id, a per-file check, a look at the other files, and an optional whole-run step."""

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar

from guards.findings import Finding
from guards.project import Project
from guards.source import SourceModule

__all__ = ["Rule"]


class Rule:
    """Subclasses set `id` and `summary` and override `check` (and `finish` for cross-file facts).

    One instance lives for one run, so a rule may collect per-file facts in `check` and judge them
    in `finish` (import cycles, constants defined twice). Trees are not kept: collect small facts.
    """

    id: ClassVar[str]
    summary: ClassVar[str]

    def __init__(self, project: Project):
        self.project = project
        self.config = project.config

    def check(self, module: SourceModule) -> Iterable[Finding]:
        return ()

    def check_tree(self, paths: Sequence[Path], cwd: Path) -> Iterable[Finding]:
        """Findings about files the per-module check never sees (files that are not *.py): `paths` as given."""
        return ()

    def finish(self) -> Iterable[Finding]:
        return ()
