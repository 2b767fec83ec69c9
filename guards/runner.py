"""One check run: find the files, parse each once, hand every tree to every rule, drop suppressed findings."""

import gc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from guards.config import GuardsConfig
from guards.findings import Finding
from guards.project import Project
from guards.rules import RULES
from guards.source import ModuleNamer, display_path, iter_python_files, parse_module
from guards.suppression import scan_suppressions

__all__ = ["CheckResult", "check_paths", "DEFAULT_PACKAGES"]

DEFAULT_PACKAGES = ("engine", "harness", "guards")


@dataclass(frozen=True)
class CheckResult:
    findings: list[Finding]
    files: int


def check_paths(paths: Iterable[Path], config: GuardsConfig, rule_ids: Sequence[str] | None = None,
                cwd: Path | None = None) -> CheckResult:
    """Check every *.py file under `paths` with the selected rules (all by default)."""
    unknown = sorted(set(rule_ids or ()) - set(RULES))
    if unknown:
        raise ValueError(f"unknown rule id(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
    cwd = (cwd or Path.cwd()).resolve()
    paths = [Path(p) for p in paths]
    files = [f.resolve() for f in iter_python_files(paths)]
    namer = ModuleNamer(config.root)
    names = [namer.name(f) for f in files]
    modules: dict[str, Path] = {}
    for file, (name, _) in zip(files, names):
        modules.setdefault(name, file)
    project = Project(config, modules)
    rules = [RULES[rule_id](project) for rule_id in (rule_ids or RULES)]
    known = frozenset(RULES)
    findings: list[Finding] = []
    # Parsing allocates millions of short-lived, acyclic AST nodes; the default cyclic-GC threshold
    # runs a collection every 700 allocations and costs a third of the time on a big tree like torch.
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        for file, (name, is_package) in zip(files, names):
            display = display_path(file, cwd)
            parsed = parse_module(file, display=display, name=name, is_package=is_package, relpath=namer.relpath(file))
            if isinstance(parsed, Finding):
                findings.append(parsed)
                continue
            allowed, problems = scan_suppressions(parsed, known)
            project.add_suppressions(display, allowed)
            findings.extend(problems)
            for rule in rules:
                findings.extend(rule.check(parsed))
        for rule in rules:
            findings.extend(rule.check_tree(paths, cwd))
            findings.extend(rule.finish())
    finally:
        gc.set_threshold(*threshold)
    kept = {f for f in findings if not project.is_suppressed(f.path, f.line, f.rule)}
    return CheckResult(sorted(kept), len(files))
