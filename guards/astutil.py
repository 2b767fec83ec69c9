"""AST helpers the rules share: what a module's imports bind, where its imports point, literal strings.

Name binding is flow-insensitive on purpose: an `import os as o` anywhere in a file makes `o` mean
`os` everywhere in it. That is what a reader assumes too, and it cannot be dodged by moving the import
into a function. Every walk here is iterative: generated files nest expressions thousands deep.
"""

import ast
from collections.abc import Callable
from dataclasses import dataclass

from guards.source import SourceModule

__all__ = ["ImportTable", "ImportEdge", "Names", "imports_of", "names_of", "import_edges", "resolve_from", "literal_head",
           "literal_fragments", "data_operands", "dotted_chain", "is_builtin", "dynamic_import_target", "IMPORT_FUNCTIONS"]

# What `from X import *` binds, for the few modules whose names the rules look for.
_STAR_EXPORTS = {
    "os": ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"),
    "posix": ("environ", "putenv", "unsetenv"),
    "nt": ("environ", "putenv", "unsetenv"),
    "contextlib": ("suppress",),
    "importlib": ("import_module",),
}

IMPORT_FUNCTIONS = frozenset({"importlib.import_module", "importlib.__import__", "builtins.__import__"})


class ImportTable:
    """Local names bound by import statements, mapped to the dotted names they stand for.

    `import a.b` binds `a` -> "a"; `import a.b as c` binds `c` -> "a.b"; `from a import b as c` binds
    `c` -> "a.b" (a module or a name in `a`: callers that care ask whether "a.b" is a module).
    """

    def __init__(self, module: SourceModule):
        self.bindings: dict[str, str] = {}
        self.module_aliases: set[str] = set()  # bound by `import ...`: certainly modules
        star_bases: list[str] = []
        for node in module.nodes(ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.bindings.setdefault(alias.asname, alias.name)
                    self.module_aliases.add(alias.asname)
                else:
                    top = alias.name.split(".", 1)[0]
                    self.bindings.setdefault(top, top)
                    self.module_aliases.add(top)
        for node in module.nodes(ast.ImportFrom):
            base = resolve_from(module, node)
            if base is None:
                continue
            for alias in node.names:
                if alias.name == "*":
                    star_bases.append(base)
                else:
                    self.bindings.setdefault(alias.asname or alias.name, f"{base}.{alias.name}")
        for base in star_bases:
            for name in _STAR_EXPORTS.get(base, ()):
                self.bindings.setdefault(name, f"{base}.{name}")
        self.has_star = bool(star_bases)

    def qualify(self, node: ast.AST) -> str | None:
        """"os.environ.get" for `o.environ.get` after `import os as o`; None if the root is not imported."""
        chain = dotted_chain(node)
        if chain is None:
            return None
        root, _, rest = chain.partition(".")
        base = self.bindings.get(root)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base


class Names:
    """What a name or attribute chain stands for, through imports and through local aliases of them.

    `o = os; o.getpid` and `g = os.getpid; g` qualify as "os.getpid" (a local name bound anywhere in the
    file by `=` or `:=` to something reached through an import), and so does `__import__("os").getpid`
    (a literal dynamic import as the root). Flow-insensitive, like ImportTable.
    """

    def __init__(self, module: SourceModule):
        self.module = module
        self.imports = imports_of(module)
        self.aliases: dict[str, str] = {}
        binds = [(t, n.value) for n in module.nodes(ast.Assign) for t in n.targets]
        binds += [(n.target, n.value) for n in module.nodes(ast.AnnAssign) if n.value is not None]
        binds += [(n.target, n.value) for n in module.nodes(ast.NamedExpr)]
        for target, value in binds:
            qualified = self._direct(value)
            if qualified is not None and isinstance(target, ast.Name):
                self.aliases.setdefault(target.id, qualified)

    def _direct(self, node: ast.AST) -> str | None:
        qualified = self.imports.qualify(node)
        if qualified is not None:
            return qualified
        root, parts = _root_and_attrs(node)
        if isinstance(root, ast.Call):
            base = _call_target(self.module, root, self.imports)
            if base is None:
                return None
            if not isinstance(root.func, ast.Attribute) and "." in base:  # __import__("a.b") returns a
                base = base.split(".", 1)[0]
            return ".".join([base, *reversed(parts)])
        return None

    def qualify(self, node: ast.AST) -> str | None:
        qualified = self._direct(node)
        if qualified is not None:
            return qualified
        root, parts = _root_and_attrs(node)
        if isinstance(root, ast.Name) and root.id in self.aliases and root.id not in self.imports.bindings:
            return ".".join([self.aliases[root.id], *reversed(parts)])
        return None


def _root_and_attrs(node: ast.AST) -> tuple[ast.AST, list[str]]:
    """`a.b.c` -> (the node `a`, ["c", "b"]): the attribute names innermost last."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return node, parts


def data_operands(module: SourceModule) -> set[int]:
    """ids of the items of tuple / list / set displays and of comparison operands: a string there is data about
    names (a table of them, a test against one), not a way to what it names."""
    cached = module.cache.get("data_operands")
    if isinstance(cached, set):
        return cached
    found: set[int] = set()
    for display in (*module.nodes(ast.Tuple), *module.nodes(ast.List), *module.nodes(ast.Set)):
        found.update(id(e) for e in display.elts)
    for compare in module.nodes(ast.Compare):
        found.update(id(e) for e in (compare.left, *compare.comparators))
    module.cache["data_operands"] = found
    return found


def names_of(module: SourceModule) -> Names:
    names = module.cache.get("names")
    if not isinstance(names, Names):
        names = module.cache["names"] = Names(module)
    return names


def literal_fragments(node: ast.AST) -> list[str]:
    """Every literal piece of text a string expression is built from: the constants of an f-string, both
    sides of `+`, the template of `%` / `.format`, bytes decoded as latin-1. "/proc/{pid}/stat" -> ["/proc/",
    "/stat"]. Used where a piece alone (a path component) gives the expression away."""
    found: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Constant):
            if isinstance(current.value, str):
                found.append(current.value)
            elif isinstance(current.value, bytes):
                found.append(current.value.decode("latin-1"))
        elif isinstance(current, ast.JoinedStr):
            stack.extend(current.values)
        elif isinstance(current, ast.BinOp) and isinstance(current.op, (ast.Add, ast.Mod)):
            stack.extend((current.left, current.right) if isinstance(current.op, ast.Add) else (current.left,))
        elif isinstance(current, ast.Call) and isinstance(current.func, ast.Attribute) and current.func.attr == "format":
            stack.append(current.func.value)
    return found


def dotted_chain(node: ast.AST) -> str | None:
    """"a.b.c" for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def is_builtin(node: ast.AST, name: str, imports: ImportTable) -> bool:
    """`node` is the bare builtin `name` (not something an import rebound to that name)."""
    return isinstance(node, ast.Name) and node.id == name and name not in imports.bindings


def imports_of(module: SourceModule) -> ImportTable:
    table = module.cache.get("imports")
    if not isinstance(table, ImportTable):
        table = module.cache["imports"] = ImportTable(module)
    return table


def _package_parts(module: SourceModule) -> list[str]:
    parts = module.name.split(".")
    return parts if module.is_package else parts[:-1]


def _anchor(package_parts: list[str], level: int) -> list[str] | None:
    """The package `level` dots point at, or None when the dots climb above the top package."""
    if level > len(package_parts):
        return None
    return package_parts[: len(package_parts) - (level - 1)]


def resolve_from(module: SourceModule, node: ast.ImportFrom) -> str | None:
    """Absolute dotted name of the module in `from <here> import ...`."""
    if not node.level:
        return node.module
    base = _anchor(_package_parts(module), node.level)
    if base is None:
        return None
    if node.module:
        base = base + [node.module]
    return ".".join(base) if base else None


def literal_head(node: ast.AST) -> tuple[str, bool] | None:
    """The literal start of a string expression and whether that is the whole string.

    "X" -> ("X", True); f"TEMPER_OP_{op}" -> ("TEMPER_OP_", False); "A_" + x -> ("A_", False);
    "A_%s" % x and "A_{}".format(x) -> ("A_", False); a bare variable -> None (nothing literal).
    """
    if isinstance(node, ast.Constant):
        return (node.value, True) if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        head = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                head.append(part.value)
            else:
                return "".join(head), False
        return "".join(head), True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        operands = []
        while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            operands.append(node.right)
            node = node.left
        operands.append(node)
        head = []
        for operand in reversed(operands):
            nested_add = isinstance(operand, ast.BinOp) and isinstance(operand.op, ast.Add)
            part = None if nested_add else literal_head(operand)
            if part is None:
                return ("".join(head), False) if head else None
            head.append(part[0])
            if not part[1]:
                return "".join(head), False
        return "".join(head), True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):
        return node.left.value.split("%", 1)[0], False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
        return node.func.value.value.split("{", 1)[0], False
    return None


@dataclass(frozen=True)
class ImportEdge:
    """`module` depends on `target` because of the import at line:col."""

    target: str
    line: int
    col: int


def dynamic_import_target(module: SourceModule, call: ast.Call, imports: ImportTable) -> str | None:
    """Public name of _call_target: what `__import__("os")` / `importlib.import_module("os")` imports."""
    return _call_target(module, call, imports)


def _call_target(module: SourceModule, call: ast.Call, imports: ImportTable) -> str | None:
    """The module an `importlib.import_module(...)` / `__import__(...)` call names, or its literal package."""
    func = imports.qualify(call.func)
    if func not in IMPORT_FUNCTIONS and not is_builtin(call.func, "__import__", imports):
        return None
    if not call.args:
        return None
    head = literal_head(call.args[0])
    if head is None:
        return None
    name, complete = head
    if not complete:
        name = name[: name.rfind(".")] if "." in name.lstrip(".") else ""
    if not name.startswith("."):
        return name or None
    if func != "importlib.import_module":
        return None  # __import__'s relative form needs globals() and a level: too rare to model
    package_arg = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "package"), None)
    if isinstance(package_arg, ast.Name) and package_arg.id in ("__package__", "__name__"):
        anchor_parts = _package_parts(module) if package_arg.id == "__package__" else module.name.split(".")
    elif isinstance(package_arg, ast.Constant) and isinstance(package_arg.value, str):
        anchor_parts = package_arg.value.split(".")
    else:
        return None
    level = len(name) - len(name.lstrip("."))
    base = _anchor(anchor_parts, level)
    if base is None:
        return None
    rest = name[level:]
    return ".".join(base + ([rest] if rest else [])) or None


def import_edges(module: SourceModule, is_module: Callable[[str], bool]) -> list[ImportEdge]:
    """Every import in the file, at any depth (function-local imports still create the dependency).

    `from a import b` points at `a.b` when that is a module, else at `a`. Parent packages that Python
    also initialises are not edges: `import engine.model.attn` does not make a module depend on
    engine/__init__.py, which would put every module above the top layer.
    """
    cached = module.cache.get("import_edges")
    if isinstance(cached, list):
        return cached
    edges: list[ImportEdge] = []
    for node in module.nodes(ast.Import):
        for alias in node.names:
            edges.append(ImportEdge(alias.name, node.lineno, node.col_offset + 1))
    for node in module.nodes(ast.ImportFrom):
        base = resolve_from(module, node)
        if base is None:
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if alias.name != "*" and is_module(sub) else base
            edges.append(ImportEdge(target, node.lineno, node.col_offset + 1))
    imports = imports_of(module)
    # Cheap pre-filter: only calls spelled like an import function are worth resolving.
    spellings = {"__import__", "import_module"} | {n for n, t in imports.bindings.items() if t in IMPORT_FUNCTIONS}
    for call in module.nodes(ast.Call):
        func = call.func
        spelled = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if spelled in spellings:
            target = _call_target(module, call, imports)
            if target:
                edges.append(ImportEdge(target, call.lineno, call.col_offset + 1))
    module.cache["import_edges"] = edges
    return edges
