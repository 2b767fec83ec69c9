"""public-surface: every module says what it exports, and nobody reaches for another module's privates.

* `__all__` must be assigned at module level, once or more, each time to a literal list or tuple of
  string literals (`__all__: list[str] = []` is fine); every name in it must be defined or imported
  by the module (or be a submodule of the package). A module with `from x import *` or a module
  `__getattr__` may provide names dynamically, so only the literal form is checked there.
* `from x import _y` and `x._y` (x an imported module) are violations: a leading underscore means
  "private to that module". Dunder names are public. Private *modules* (`pkg/_impl.py`) are private
  to their package, so modules inside `pkg` may import them; a private name defined in a module is
  private to that module, so a package's own submodules may not import each other's.
* guards.toml `[public-surface] allow_private` lists dotted names that may be used anyway; the few
  underscore names the standard library documents as public (`os._exit`, `sys._getframe`) are fine.
"""

import ast
from collections.abc import Iterator

from guards.astutil import imports_of, resolve_from
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["PublicSurfaceRule", "module_bindings"]

# Underscore names the standard library documents as public API.
_DOCUMENTED_PUBLIC = frozenset({"os._exit", "sys._getframe", "sys._current_frames", "sys._xoptions"})
_BLOCKS = (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While, ast.Match)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_statements(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements that run at module level, including those inside if / try / with / for blocks."""
    pending: list[ast.stmt] = list(reversed(tree.body))
    while pending:
        stmt = pending.pop()
        yield stmt
        if isinstance(stmt, _BLOCKS):
            children: list[ast.stmt] = []
            for field in ("body", "orelse", "finalbody"):
                children.extend(getattr(stmt, field, []))
            for handler in getattr(stmt, "handlers", []):
                children.extend(handler.body)
            for case in getattr(stmt, "cases", []):
                children.extend(case.body)
            pending.extend(reversed(children))


def _target_names(target: ast.AST) -> Iterator[str]:
    pending = [target]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, (ast.Tuple, ast.List)):
            pending.extend(node.elts)
        elif isinstance(node, ast.Starred):
            pending.append(node.value)


def module_bindings(module: SourceModule) -> set[str]:
    """Names the module binds at top level: defs, classes, assignments, imports, loop / with targets."""
    names: set[str] = set()
    for stmt in _module_statements(module.tree):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                names.update(_target_names(target))
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            names.update(_target_names(stmt.target))
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            names.update(_target_names(stmt.target))
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    names.update(_target_names(item.optional_vars))
        elif isinstance(stmt, ast.Import):
            names.update(a.asname or a.name.split(".", 1)[0] for a in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            names.update(a.asname or a.name for a in stmt.names)
        elif isinstance(stmt, (ast.Try, ast.TryStar)):
            names.update(h.name for h in stmt.handlers if h.name)
        elif type(stmt).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12+)
            names.update(_target_names(stmt.name))  # type: ignore[attr-defined]
    for node in module.nodes(ast.Global):  # `global X` in a function that assigns X
        names.update(node.names)
    return names


def _is_literal_all(value: ast.AST | None) -> bool:
    return isinstance(value, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)


class PublicSurfaceRule(Rule):
    id = "public-surface"
    summary = "every module declares a literal __all__ of names it has; no use of other modules' _private names"

    def check(self, module: SourceModule) -> Iterator[Finding]:
        yield from self._check_all(module)
        yield from self._check_private_imports(module)
        yield from self._check_private_attributes(module)

    # --- __all__
    def _check_all(self, module: SourceModule) -> Iterator[Finding]:
        literal_lists: list[ast.List | ast.Tuple] = []
        declared = False
        for stmt in _module_statements(module.tree):
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
                value: ast.AST | None = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "__all__":
                value = stmt.value
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "__all__":
                yield module.finding(self.id, "`__all__ +=` builds the export list at run time; write one literal "
                                              "`__all__ = [...]` listing every public name", stmt)
                continue
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                    and isinstance(stmt.value.func, ast.Attribute) and isinstance(stmt.value.func.value, ast.Name) \
                    and stmt.value.func.value.id == "__all__":
                yield module.finding(self.id, "`__all__` is changed at run time; write one literal `__all__ = [...]` "
                                              "listing every public name", stmt)
                continue
            else:
                continue
            declared = True
            if _is_literal_all(value):
                literal_lists.append(value)  # type: ignore[arg-type]
            else:
                yield module.finding(self.id, "`__all__` must be a literal list or tuple of strings so it can be "
                                              "checked; write the names out", stmt)
        if not declared:
            yield module.finding(self.id, "module has no `__all__`; declare `__all__ = [...]` with its public names "
                                          "(`__all__: list[str] = []` when it exports nothing)")
            return
        if not literal_lists:
            return
        bindings = module_bindings(module)
        if imports_of(module).has_star or "__getattr__" in bindings:
            return  # names may come from a star import or a module __getattr__: cannot be checked
        for listing in literal_lists:
            for element in listing.elts:
                name = element.value  # type: ignore[attr-defined]
                if name in bindings or (module.is_package and self.project.is_module(f"{module.name}.{name}")):
                    continue
                yield module.finding(self.id, f"`__all__` lists {name!r}, which the module neither defines nor "
                                              "imports; define it or remove it from `__all__`", element)

    # --- private names
    def _inside(self, module: SourceModule, package: str) -> bool:
        return module.name == package or module.name.startswith(package + ".")

    def _private_module_part(self, module: SourceModule, dotted: str) -> str | None:
        """The first private component of a module path that `module` may not use, as a dotted prefix."""
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if _is_private(part):
                owner = ".".join(parts[:i])
                if not owner or self._inside(module, owner):
                    continue  # private to its package, which may use it (top-level `_thread` has no owner)
                prefix = ".".join(parts[: i + 1])
                return None if self.config.private_allowed(prefix) else prefix
        return None

    def _private_finding(self, module: SourceModule, node: ast.AST, dotted: str) -> Finding:
        owner, _, name = dotted.rpartition(".")
        return module.finding(self.id, f"uses private name `{name}` of {owner or 'another module'}; make it public "
                                       "there (no leading underscore, listed in `__all__`) or keep the code that "
                                       "needs it in that module", node)

    def _check_private_imports(self, module: SourceModule) -> Iterator[Finding]:
        for node in module.nodes(ast.Import):
            for alias in node.names:
                bad = self._private_module_part(module, alias.name)
                if bad:
                    yield self._private_finding(module, node, bad)
        for node in module.nodes(ast.ImportFrom):
            base = resolve_from(module, node)
            if base is None:
                continue
            bad = self._private_module_part(module, base)
            if bad:
                yield self._private_finding(module, node, bad)
                continue
            for alias in node.names:
                if not _is_private(alias.name) or base == module.name:
                    continue
                dotted = f"{base}.{alias.name}"
                if self.config.private_allowed(dotted):
                    continue
                if self.project.is_module(dotted) and self._inside(module, base):
                    continue  # a private submodule, imported from inside its own package
                yield self._private_finding(module, node, dotted)

    def _check_private_attributes(self, module: SourceModule) -> Iterator[Finding]:
        imports = imports_of(module)
        if not imports.module_aliases and not imports.bindings:
            return
        for node in module.nodes(ast.Attribute):
            if not _is_private(node.attr):
                continue
            # Only `alias.public.chain._private`: the first private step is the one reported.
            value = node.value
            chain = []
            while isinstance(value, ast.Attribute) and not _is_private(value.attr):
                chain.append(value.attr)
                value = value.value
            if not isinstance(value, ast.Name):
                continue
            target = imports.bindings.get(value.id)
            if target is None:
                continue
            if value.id not in imports.module_aliases and not self.project.is_module(target):
                continue  # `from x import obj`: obj._y is an object's attribute, not a module's private name
            owner = ".".join([target, *reversed(chain)])
            dotted = f"{owner}.{node.attr}"
            if self.config.private_allowed(dotted) or dotted in _DOCUMENTED_PUBLIC or owner == module.name:
                continue
            if self._inside(module, owner) and self.project.is_module(dotted):
                continue
            yield self._private_finding(module, node, dotted)
