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

Stray handles. Outside those forms, anything that can reach the environment without an `os.environ`
reference the checks above can see is a finding everywhere, the env module included:
* the os / posix / nt module itself used other than `os.<attribute>` (passed on, assigned `o = os`,
  `vars(os)`, `os.__dict__`), imported dynamically (`importlib.import_module("os")`,
  `__import__("os")`), fetched from `sys.modules["os"]`, or reached through another module that
  imported it (`torch.os`, `getattr(shutil, "os")`);
* an attribute named like an env accessor (`.environ`, `.getenv`, `.putenv`, `.expandvars`, ...) on a
  base that is not the os module as imported (`o.environ` after `o = os`, `libc.getenv`);
* a string naming one (`"environ"`, `"getenv"`, also built by `+`: `vars(os)["environ"]`,
  `getattr(m, "env" + "iron")`) or a `/proc/<pid>/environ` path;
* a child process that reports the environment it inherits: a command that runs `env` / `printenv` /
  `set` / `export`, or whose literal text expands `$VAR` or names `environ` / `getenv`, and any shell
  command (`shell=True`, `os.system`, `os.popen`) built at run time;
* `eval` / `exec` / `compile` of a string: code the check cannot read. A launch that passes `env=`
  explicitly gives the child only what it was handed and is fine;
* in the packages `[exec-route] packages` names, every other way to run code this check cannot read
  (guards/rules/exec_routes.py: runpy, pickle, `getattr(builtins, ...)`, loaders, a child started with
  computed code): the same routes read the environment past the checks above.

Constants. A module-level UPPER_CASE name bound to a literal (number, string, tuple of literals)
that two modules of one top-level package bind to different values is the same knob defined twice;
each site is reported, naming the other. Leading underscores count too: `_TIMEOUT = 30` in one
module and `_TIMEOUT = 60` in another are still one knob with two values.
"""

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from guards.astutil import ImportTable, data_operands, dynamic_import_target, imports_of, is_builtin, literal_head
from guards.findings import Finding
from guards.project import Project
from guards.rules.base import Rule
from guards.rules.exec_routes import code_routes
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
_STRAY = _ENV_ATTRS | {"secure_getenv", "expandvars"}
_ENV_FILES = frozenset({"environ", "environb"})  # /proc/<pid>/environ
_LAUNCHERS = frozenset({f"subprocess.{f}" for f in ("run", "call", "check_call", "check_output", "Popen", "getoutput",
                                                     "getstatusoutput")}
                       | {f"os.{f}" for f in ("system", "popen", "execv", "execl", "execlp", "execvp", "spawnv",
                                              "spawnl", "spawnlp", "spawnvp", "posix_spawn", "posix_spawnp")}
                       | {"asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "pty.spawn"})
_SHELL_STRINGS = frozenset({"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
                            "asyncio.create_subprocess_shell"})
_ENV_PROGRAMS = frozenset({"env", "printenv", "set", "export", "declare", "typeset", "compgen"})
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
        stray = _StrayScan(self.id, module, imports)
        yield from stray.findings()
        if module.package in self.config.exec_route.packages:
            # exec of "import os; os.environ[...]", a pickle that reaches os.getenv, a child started with computed
            # code: each runs code this rule cannot read, so each is an environment read it cannot check.
            for line, col, message in code_routes(module, self.project.is_module):
                if line in stray.lines:
                    continue
                yield module.finding(self.id, f"{message}; code this check cannot read may read any environment "
                                              f"variable: {_FIX}", line=line, col=col)
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


_FIX = "read whitelisted names in the env module with `os.environ.get(\"NAME\")`"


class _StrayScan:
    """Ways to the environment that bypass a visible `os.environ` / `os.getenv` reference (module docstring)."""

    def __init__(self, rule_id: str, module: SourceModule, imports: ImportTable):
        self.rule_id = rule_id
        self.module = module
        self.imports = imports
        self.reported: set[int] = set()  # ids of nodes already reported, so one trick is one finding
        self.lines: set[int] = set()  # lines with a finding: a string there adds nothing

    def findings(self) -> Iterator[Finding]:
        yield from self._handles()
        yield from self._code_strings()
        yield from self._attributes()
        yield from self._strings()
        yield from self._launches()

    def _finding(self, node: ast.AST, message: str) -> Finding:
        self.reported.add(id(node))
        self.lines.add(getattr(node, "lineno", 0))
        return self.module.finding(self.rule_id, message, node)

    def _handles(self) -> Iterator[Finding]:
        module, imports = self.module, self.imports
        for call in module.nodes(ast.Call):
            target = dynamic_import_target(module, call, imports)
            if target in _ENV_MODULES:
                yield self._finding(call, f"imports the {target} module dynamically, which hides its environment "
                                          f"accesses; use `import os` in the env module and {_FIX}")
            elif _sys_modules_key(call.func, imports) and call.args and _literal(call.args[0]) in _ENV_MODULES:
                yield self._finding(call, f"fetches the os module from sys.modules; {_FIX}")
        for node in module.nodes(ast.Subscript):
            if imports.qualify(node.value) == "sys.modules" and _literal(node.slice) in _ENV_MODULES:
                yield self._finding(node, f"fetches the os module from sys.modules; {_FIX}")
        for node in module.nodes(ast.Attribute):  # `torch.os`, `shutil.os`: the os module through another module
            if node.attr in _ENV_MODULES and imports.qualify(node.value) is not None:
                yield self._finding(node, f"reaches the {node.attr} module through {imports.qualify(node.value)}, which "
                                          f"hides its environment accesses; {_FIX}")
        for call in module.nodes(ast.Call):  # getattr(shutil, "os")
            if len(call.args) >= 2 and is_builtin(call.func, "getattr", imports) and _literal(call.args[1]) in _ENV_MODULES \
                    and imports.qualify(call.args[0]) not in _ENV_MODULES:
                yield self._finding(call, f"fetches the {_literal(call.args[1])} module by name from another object; {_FIX}")
        handles = {name for name, target in imports.bindings.items() if target in _ENV_MODULES}
        if not handles:
            return
        allowed = {id(n.value) for n in module.nodes(ast.Attribute) if n.attr != "__dict__"}
        allowed |= {id(c.args[0]) for c in module.nodes(ast.Call) if len(c.args) >= 2
                    and is_builtin(c.func, "getattr", imports)}  # getattr(os, ...) is judged by _env_refs
        for node in module.nodes(ast.Name):
            if node.id in handles and isinstance(node.ctx, ast.Load) and id(node) not in allowed:
                yield self._finding(node, f"uses the {imports.bindings[node.id]} module as a value (passed on, "
                                          "aliased, `vars()` or `__dict__`), so its environment accesses cannot be "
                                          f"followed; use `os.<name>` directly, and {_FIX}")

    def _code_strings(self) -> Iterator[Finding]:
        for call in self.module.nodes(ast.Call):
            for builtin in ("eval", "exec", "compile"):
                if is_builtin(call.func, builtin, self.imports):
                    yield self._finding(call, f"`{builtin}()` runs code this check cannot read, which may reach the "
                                              f"environment; write the code out, and {_FIX}")

    def _attributes(self) -> Iterator[Finding]:
        for node in self.module.nodes(ast.Attribute):
            if node.attr not in _STRAY or id(node.value) in self.reported:
                continue
            target = self.imports.qualify(node)
            if target in _MAPPINGS or target in _FUNCTIONS:
                continue  # a visible reference: judged by the main check
            yield self._finding(node, f"`.{node.attr}` on something that is not the os module as imported (an alias, "
                                      f"a dynamic import, a C library) may reach the environment; {_FIX}")
        for node in self.module.nodes(ast.Name):
            target = self.imports.bindings.get(node.id, "")
            if isinstance(node.ctx, ast.Load) and target.rpartition(".")[2] == "expandvars":
                yield self._finding(node, f"`expandvars` substitutes any environment variable; {_FIX}")

    def _strings(self) -> Iterator[Finding]:
        module = self.module
        consumed = {id(c.args[1]) for c in module.nodes(ast.Call) if len(c.args) >= 2
                    and is_builtin(c.func, "getattr", self.imports)
                    and self.imports.qualify(c.args[0]) in _ENV_MODULES}  # judged by _env_refs
        # Items of a collection display and operands of a comparison are data about names (this
        # package's own tables), not a way to an access: a handle they could be used on is flagged
        # where it is made.
        consumed |= data_operands(module)
        candidates = [n for n in module.nodes(ast.Constant) if id(n) not in consumed]
        candidates += [n for n in module.nodes(ast.BinOp) if isinstance(n.op, ast.Add) and id(n) not in consumed]
        for node in candidates:
            text = _literal(node)
            if text is None or node.lineno in self.lines:
                continue
            if text in _STRAY or _ENV_FILES & set(text.split("/")):
                yield self._finding(node, f"the string {text[:60]!r} names an environment accessor or file; "
                                          f"reaching it by name hides the access from this check; {_FIX}")

    def _launches(self) -> Iterator[Finding]:
        for call in self.module.nodes(ast.Call):
            launcher = self.imports.qualify(call.func)
            if launcher not in _LAUNCHERS or any(k.arg == "env" for k in call.keywords):
                continue
            command = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "args"), None)
            if command is None:
                continue
            shell = launcher in _SHELL_STRINGS or any(
                k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in call.keywords)
            words = _command_words(command)
            if words is None and shell:
                yield self._finding(call, "a shell command built at run time can expand any environment variable; "
                                          "use a literal argument list, or pass `env=` with only what the child needs")
            elif words and any(_reads_env(word) for word in words):
                yield self._finding(call, "this command reports the environment it inherits (env / printenv / $VAR / "
                                          f"environ); {_FIX}, or pass `env=` with only what the child needs")


def _literal(node: ast.AST) -> str | None:
    """The whole text of a string (or bytes) literal or a concatenation of literals, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
        return node.value.decode("latin-1")
    head = literal_head(node)
    return head[0] if head and head[1] else None


def _sys_modules_key(func: ast.AST, imports: ImportTable) -> bool:
    """`sys.modules.get` / `.pop` / `.setdefault` / `.__getitem__`."""
    return isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault", "__getitem__") \
        and imports.qualify(func.value) == "sys.modules"


def _command_words(command: ast.AST) -> list[str] | None:
    """Literal words of a command (a string, or a list / tuple whose literal items count); None if none is literal."""
    parts = command.elts if isinstance(command, (ast.List, ast.Tuple)) else [command]
    texts = [t for t in (_literal(p) if not isinstance(p, ast.JoinedStr) else literal_head(p)[0] for p in parts) if t]
    if not texts:
        return None
    words = []
    for text in texts:
        for mark in ";|&()`'\"=<>{}[]\n\t":
            text = text.replace(mark, " ")
        words.extend(text.split())
    return words


def _reads_env(word: str) -> bool:
    return ("$" in word or word.rpartition("/")[2] in _ENV_PROGRAMS or "environ" in word or "getenv" in word)


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
