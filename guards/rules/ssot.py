"""ssot: one source of truth for every knob.

Environment. Each package reads (and writes) environment variables in the one module guards.toml
`[ssot] env_modules` names for it, and only names ENV_WHITELIST.md lists. Every way of reaching the
environment is a reference to `os.environ` / `os.environb` / `os.getenv` / `os.putenv` /
`os.unsetenv` (or posix / nt), however it was imported or aliased, or fetched with
`getattr(os, "environ")`. A reference is fine only inside the env module and only in a form whose
variable name can be checked: `E["X"]`, `E.get("X")`, `E.pop("X")`, `"X" in E`, `getenv("X")`,
`E["X"] = v`. Anything else — `E.copy()`, `dict(E)`, iterating, passing `E` on — uses the whole
environment and is a finding even in the env module. A name is checkable when it is a literal, an
f-string / concatenation / %-format / .format whose literal prefix a `PREFIX_*` row covers, or a
parameter of a private helper of the env module whose every call passes a checkable name.

Constants. A module-level UPPER_CASE name bound to a literal (number, string, tuple of literals)
that two modules of one top-level package bind to different values is the same knob defined twice;
each site is reported, naming the other. Leading underscores count too: `_TIMEOUT = 30` in one
module and `_TIMEOUT = 60` in another are still one knob with two values.
"""

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from guards.astutil import ImportTable, dynamic_import_target, imports_of, is_builtin, literal_head
from guards.findings import Finding
from guards.project import Project
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["SsotRule"]

_ENV_MODULES = frozenset({"os", "posix", "nt"})
_MAPPINGS = frozenset({"os.environ", "os.environb", "posix.environ", "nt.environ"})
_FUNCTIONS = frozenset({"os.getenv", "os.getenvb", "os.putenv", "os.unsetenv",
                        "posix.putenv", "posix.unsetenv", "nt.putenv", "nt.unsetenv"})
_WRITERS = frozenset({"putenv", "unsetenv"})
_ENV_ATTRS = frozenset(q.rpartition(".")[2] for q in _MAPPINGS | _FUNCTIONS)
_MAPPING_METHODS = {"get": "reads", "__getitem__": "reads", "__contains__": "reads", "pop": "writes",
                    "setdefault": "writes", "__setitem__": "writes", "__delitem__": "writes"}
_MAX_INDIRECTION = 4  # helper -> helper -> ... chains longer than this are not followed


@dataclass(frozen=True)
class _Access:
    """One use of the environment whose variable name sits in `name` (None: the whole environment)."""

    node: ast.AST
    name: ast.AST | None
    verb: str  # "reads" or "writes"


@dataclass(frozen=True)
class _Constant:
    module: str
    path: str
    line: int
    col: int
    key: str
    shown: str


def _env_refs(module: SourceModule, imports: ImportTable) -> tuple[dict[int, tuple[ast.AST, str]], list[ast.Call]]:
    """Every expression that denotes an env mapping / function -> (node, "os.environ"); and dynamic getattr(os, ...)."""
    refs: dict[int, tuple[ast.AST, str]] = {}
    aliases = {name for name, target in imports.bindings.items() if target in _MAPPINGS or target in _FUNCTIONS}
    if aliases:
        for node in module.nodes(ast.Name):
            if node.id in aliases and isinstance(node.ctx, ast.Load):
                refs[id(node)] = (node, imports.bindings[node.id])
    for node in module.nodes(ast.Attribute):
        if node.attr in _ENV_ATTRS:
            target = imports.qualify(node)
            if target in _MAPPINGS or target in _FUNCTIONS:
                refs[id(node)] = (node, target)
    dynamic = []
    for call in module.nodes(ast.Call):
        if len(call.args) >= 2 and is_builtin(call.func, "getattr", imports) and imports.qualify(call.args[0]) in _ENV_MODULES:
            attr = call.args[1]
            if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                target = f"{imports.qualify(call.args[0])}.{attr.value}"
                if target in _MAPPINGS or target in _FUNCTIONS:
                    refs[id(call)] = (call, target)
            else:
                dynamic.append(call)
    return refs, dynamic


def _accesses(module: SourceModule, refs: dict[int, tuple[ast.AST, str]]) -> list[_Access]:
    """Match each reference to the checkable form around it; what is left uses the whole environment."""
    used: set[int] = set()
    found: list[_Access] = []

    def mapping(node: ast.AST) -> bool:
        ref = refs.get(id(node))
        return ref is not None and ref[1] in _MAPPINGS

    for node in module.nodes(ast.Subscript):
        if mapping(node.value):
            used.add(id(node.value))
            found.append(_Access(node, node.slice, "reads" if isinstance(node.ctx, ast.Load) else "writes"))
    for node in module.nodes(ast.Compare):
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) and mapping(node.comparators[0]):
            used.add(id(node.comparators[0]))
            found.append(_Access(node, node.left, "reads"))
    for call in module.nodes(ast.Call):
        func = call.func
        first = call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else \
            next((k.value for k in call.keywords if k.arg == "key"), None)
        if isinstance(func, ast.Attribute) and func.attr in _MAPPING_METHODS and mapping(func.value):
            used.add(id(func.value))
            found.append(_Access(call, first, _MAPPING_METHODS[func.attr]))
        elif id(func) in refs and refs[id(func)][1] in _FUNCTIONS:
            used.add(id(func))
            verb = "writes" if refs[id(func)][1].rpartition(".")[2] in _WRITERS else "reads"
            found.append(_Access(call, first, verb))
    for key, (node, _) in refs.items():
        if key not in used:
            found.append(_Access(node, None, "uses"))
    return found


def _literal_value(node: ast.AST, depth: int = 0) -> tuple[bool, object]:
    """(True, value) for a number, string, or (nested) tuple of them; (False, None) otherwise."""
    if isinstance(node, ast.Constant) and node.value is not Ellipsis:
        return True, node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float, complex)):
        value = node.operand.value
        return True, (-value if isinstance(node.op, ast.USub) else +value)
    if isinstance(node, ast.Tuple) and depth < 8:
        items = []
        for element in node.elts:
            ok, value = _literal_value(element, depth + 1)
            if not ok:
                return False, None
            items.append(value)
        return True, tuple(items)
    return False, None


def _is_upper_constant_name(name: str) -> bool:
    core = name.strip("_")
    return bool(core) and core.upper() == core and any(c.isalpha() for c in core) and not name.startswith("__")


class SsotRule(Rule):
    id = "ssot"
    summary = "env vars only in the declared env module and only whitelisted names; no constant defined twice"

    def __init__(self, project: Project):
        super().__init__(project)
        self._constants: dict[tuple[str, str], list[_Constant]] = defaultdict(list)

    # --- environment
    def check(self, module: SourceModule) -> Iterator[Finding]:
        self._collect_constants(module)
        imports = imports_of(module)
        for node in module.nodes(ast.Attribute):  # __import__("os").environ needs no import statement
            if (node.attr in _ENV_ATTRS and isinstance(node.value, ast.Call)
                    and dynamic_import_target(module, node.value, imports) in _ENV_MODULES):
                yield module.finding(self.id, f"reaches `{node.attr}` through a dynamic import of the os module; read "
                                              "whitelisted names in the env module with `os.environ.get(\"NAME\")`", node)
        if not any(target.split(".", 1)[0] in _ENV_MODULES for target in imports.bindings.values()):
            return  # os / posix / nt are never imported: nothing here can reach the environment
        refs, dynamic = _env_refs(module, imports)
        for call in dynamic:
            yield module.finding(self.id, "`getattr(os, <computed name>)` may reach the environment and cannot be "
                                          "checked; use the attribute by name", call)
        if not refs:
            return
        env_module = self.config.env_modules.get(module.package)
        inside = env_module is not None and module.relpath == env_module
        checker = _EnvModuleNames(self, module) if inside else None
        for access in _accesses(module, refs):
            if checker is not None:
                yield from checker.check(access)
            else:
                yield self._outside(module, access, env_module)

    def _outside(self, module: SourceModule, access: _Access, env_module: str | None) -> Finding:
        head = literal_head(access.name) if access.name is not None else None
        what = f"environment variable {head[0]!r}" if head and head[1] else "the environment"
        if env_module is None:
            return module.finding(self.id, f"{access.verb} {what}, but package {module.package!r} has no env module "
                                           "(guards.toml [ssot] env_modules); make it a config field / CLI flag instead",
                                  access.node)
        listed = "" if not head or not head[1] or self.config.whitelist.allows(head[0]) else \
            " (and the name is not in ENV_WHITELIST.md)"
        return module.finding(self.id, f"{access.verb} {what} outside {env_module}{listed}; add an accessor there "
                                       "and call it (or make it an EngineConfig field / CLI flag)", access.node)

    def whitelist_problem(self, name: ast.AST) -> str | None:
        """Why a name expression fails the whitelist; None when it passes; "" when it is not a literal at all."""
        head = literal_head(name)
        if head is None:
            return ""
        text, complete = head
        if complete:
            if self.config.whitelist.allows(text):
                return None
            return (f"environment variable {text!r} is not in ENV_WHITELIST.md; make it an EngineConfig field "
                    "(a CLI flag), or add a row to ENV_WHITELIST.md saying why it cannot be one")
        if self.config.whitelist.allows_prefix(text):
            return None
        return (f"environment variable name built from {text!r} + <run-time value> is not covered by a `PREFIX_*` "
                "row of ENV_WHITELIST.md; use a literal name or add a wildcard row")

    # --- constants
    def _collect_constants(self, module: SourceModule) -> None:
        for stmt in module.tree.body:
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            else:
                continue
            names = [t.id for t in targets if isinstance(t, ast.Name) and _is_upper_constant_name(t.id)]
            if not names:
                continue
            ok, literal = _literal_value(value)
            if not ok:
                continue
            shown = repr(literal)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            key = f"{type(literal).__name__}:{literal!r}"
            for name in names:
                self._constants[(module.package, name)].append(
                    _Constant(module.name, module.display, stmt.lineno, stmt.col_offset + 1, key, shown))

    def finish(self) -> Iterator[Finding]:
        for (_, name), sites in self._constants.items():
            if len(sites) < 2 or len({s.key for s in sites}) < 2:
                continue
            for site in sites:
                others = [o for o in sites if o.key != site.key and o.module != site.module]
                if not others:
                    continue
                other = others[0]
                more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
                yield Finding(site.path, site.line, site.col, self.id,
                              f"{name} = {site.shown} here, but {other.path}:{other.line} sets {name} = {other.shown}"
                              f"{more}; define the constant once and import it (knobs belong in EngineConfig)")


class _EnvModuleNames:
    """Checks the variable names used inside a package's env module, following private helpers' parameters."""

    def __init__(self, rule: SsotRule, module: SourceModule):
        self.rule = rule
        self.module = module
        self.functions = [s for s in module.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.calls_by_name: dict[str, list[ast.Call]] = defaultdict(list)
        self.loads_by_name: dict[str, int] = defaultdict(int)
        names = {f.name for f in self.functions}
        for call in module.nodes(ast.Call):
            if isinstance(call.func, ast.Name) and call.func.id in names:
                self.calls_by_name[call.func.id].append(call)
        for node in module.nodes(ast.Name):
            if node.id in names and isinstance(node.ctx, ast.Load):
                self.loads_by_name[node.id] += 1

    def check(self, access: _Access) -> Iterator[Finding]:
        if access.name is None:
            yield self.module.finding(self.rule.id, "uses the whole environment (copied, iterated or passed on), so the "
                                                    "variables it reads cannot be checked; read whitelisted names one "
                                                    "at a time (`os.environ.get(\"NAME\")`)", access.node)
            return
        yield from self._check_name(access.name, access.node, 0)

    def _check_name(self, name: ast.AST, where: ast.AST, depth: int) -> Iterator[Finding]:
        table = self._table_values(name)
        if table is not None:
            for value in table:
                yield from self._check_name(value, value, depth + 1)
            return
        problem = self.rule.whitelist_problem(name)
        if problem is None:
            return
        if problem:
            yield self.module.finding(self.rule.id, problem, name)
            return
        call_args = self._helper_arguments(name) if depth < _MAX_INDIRECTION else None
        if call_args is None:
            yield self.module.finding(self.rule.id, "environment variable name is computed at run time, so it cannot be "
                                                    "checked against ENV_WHITELIST.md; use a literal name (or an "
                                                    "f-string whose literal prefix a `PREFIX_*` row covers)", where)
            return
        for argument, call in call_args:
            if argument is None:
                yield self.module.finding(self.rule.id, "environment variable name cannot be determined at this call "
                                                        "(*args / **kwargs); pass the name as a literal", call)
            else:
                yield from self._check_name(argument, argument, depth + 1)

    def _table_values(self, name: ast.AST) -> list[ast.AST] | None:
        """For `TABLE[key]` where TABLE is a read-only table of names: every value it can yield.

        A table is a module-level name bound once, and never rebound or deleted, to
        `types.MappingProxyType({...})` of a dict display without `**` entries. Then the key, however
        computed, can only pick one of the literal values, and each value is checked instead.
        """
        if not (isinstance(name, ast.Subscript) and isinstance(name.value, ast.Name)):
            return None
        table = name.value.id
        stores = [n for n in self.module.nodes(ast.Name) if n.id == table and not isinstance(n.ctx, ast.Load)]
        if len(stores) != 1 or any(table in g.names for g in self.module.nodes(ast.Global)):
            return None
        binding = next((s for s in self.module.tree.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                        and stores[0] in (s.targets if isinstance(s, ast.Assign) else [s.target])), None)
        if binding is None or binding.value is None:
            return None
        value = binding.value
        if not (isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords
                and imports_of(self.module).qualify(value.func) == "types.MappingProxyType"
                and isinstance(value.args[0], ast.Dict) and None not in value.args[0].keys):
            return None
        return list(value.args[0].values)

    def _helper_arguments(self, name: ast.AST) -> list[tuple[ast.AST | None, ast.Call]] | None:
        """For a parameter of a private, only-called helper: the argument each call passes for it."""
        if not isinstance(name, ast.Name):
            return None
        line = getattr(name, "lineno", 0)
        func = next((f for f in self.functions if f.lineno <= line <= (f.end_lineno or f.lineno)), None)
        if func is None or not func.name.startswith("_"):
            return None
        calls = self.calls_by_name.get(func.name, [])
        if self.loads_by_name[func.name] != len(calls):
            return None  # the helper is passed around as a value: its callers are unknown
        args = func.args
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        keyword_only = [a.arg for a in args.kwonlyargs]
        if name.id not in positional and name.id not in keyword_only:
            return None
        if any(isinstance(n, ast.Name) and n.id == name.id and not isinstance(n.ctx, ast.Load) for n in ast.walk(func)):
            return None  # the parameter is reassigned inside the helper
        defaults: dict[str, ast.AST] = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        defaults.update({a: d for a, d in zip(keyword_only, args.kw_defaults) if d is not None})
        found: list[tuple[ast.AST | None, ast.Call]] = []
        for call in calls:
            index = positional.index(name.id) if name.id in positional else None
            starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
            if starred:
                found.append((None, call))
            elif index is not None and index < len(call.args):
                found.append((call.args[index], call))
            else:
                argument = next((k.value for k in call.keywords if k.arg == name.id), defaults.get(name.id))
                if argument is not None:  # else the call itself is a TypeError: nothing is read
                    found.append((argument, call))
        return found
