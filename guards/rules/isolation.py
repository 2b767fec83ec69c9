"""isolation: the engine keeps to itself; it never reaches into the process that runs it.

Engine code runs inside processes it does not own: a test runner imports it, a benchmark calls its ops and
times them. From inside, code can change how that process reports and measures (turn failing tests into
passes, end a timed segment early, read the seed its inputs are drawn from), and nothing the engine has to do
needs any of it. So, in the packages guards.toml `[isolation] packages` names, each of these is a finding:

* importing test or judging machinery or raw memory access (`[isolation] forbidden_imports`: pytest, unittest,
  ctypes, ...), at any depth, by a statement or `importlib.import_module("literal")`;
* importing a module whose name is computed at run time (it can be any module of the process), outside the
  loader modules (`loader_modules`, e.g. the op registry's);
* reaching the process by a name: frames and the object graph (`sys._getframe`, `inspect.stack`,
  `gc.get_referrers`, `.f_back` / `.f_locals` / `.tb_frame` ...), tracing and scheduling hooks (`sys.settrace`,
  `sys.setswitchinterval`, `sys.addaudithook`, ...), the module registry and the import system (`sys.modules`,
  `sys.meta_path`, `sys.path`, `importlib.util.spec_from_file_location`, ...), rewiring file descriptors
  (`os.dup2`, ...), code and module objects made at run time (`types.CodeType`, ...), `__builtins__`, and the
  command line (`sys.argv`) outside the modules that parse or print it (`argv_modules`);
* rebinding what belongs to another module: assigning or deleting an attribute of an imported module or of
  anything reached through one (`torch.dot = f`, `TestReport.__init__ = f`, also through a local alias of it;
  library switches meant to be assigned, such as `torch.backends.cudnn.benchmark`, are listed in `settable`),
  `setattr` / `delattr` / `__setattr__` on anything but `self`, `vars(module)` / `module.__dict__`, and swapping
  a function's `__code__` / `__globals__` / `__defaults__` / `__closure__` or an object's `__class__`;
* an attribute of a module reached by a computed name (`getattr(torch, name)`), `globals()`, the ways from any
  object to every class or global (`__subclasses__`, `__globals__`), or a string naming one of the above
  (`"_getframe"`, `"/proc/self/..."`, `"/dev/stdout"`): reaching it by name hides it from this check.

A justified exception is marked `# guard: allow isolation -- <why>`, which a reviewer reads.
"""

import ast
from collections.abc import Iterator

from guards.astutil import (ImportTable, data_operands, dynamic_import_target, import_edges, imports_of, is_builtin,
                            literal_head, names_of)
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["IsolationRule"]

# Qualified names that reach the process around the engine, with why.
_REACH: dict[str, str] = {
    **{f"sys.{n}": "reads the call stack" for n in ("_getframe", "_current_frames", "_getframemodulename")},
    **{f"inspect.{n}": "reads the call stack" for n in ("currentframe", "stack", "trace", "getouterframes",
                                                          "getinnerframes", "getframeinfo")},
    "traceback.walk_stack": "reads the call stack",
    **{f"gc.{n}": "walks the object graph" for n in ("get_objects", "get_referrers", "get_referents", "callbacks")},
    **{f"sys.{n}": "hooks the interpreter" for n in ("settrace", "setprofile", "setswitchinterval", "addaudithook",
                                                     "monitoring", "displayhook", "breakpointhook", "unraisablehook")},
    **{f"threading.{n}": "hooks the interpreter" for n in ("settrace", "setprofile", "settrace_all_threads",
                                                           "setprofile_all_threads")},
    **{f"sys.{n}": "changes how the process imports" for n in ("modules", "meta_path", "path_hooks",
                                                               "path_importer_cache", "path")},
    **{f"importlib.{n}": "changes how the process imports" for n in (
        "reload", "util.spec_from_file_location", "util.module_from_spec", "util.spec_from_loader",
        "machinery.SourceFileLoader", "machinery.SourcelessFileLoader", "machinery.ModuleSpec")},
    **{f"os.{n}": "rewires the process's file descriptors" for n in ("dup", "dup2", "fdopen", "openpty")},
    **{f"types.{n}": "makes code or modules at run time" for n in ("CodeType", "FunctionType", "ModuleType",
                                                                   "CellType")},
}
_ARGV = frozenset({"sys.argv", "sys.orig_argv"})
_FRAME_ATTRS = frozenset({"f_back", "f_locals", "f_globals", "f_builtins", "f_trace", "tb_frame", "gi_frame",
                          "cr_frame", "ag_frame"})
_CODE_ATTRS = frozenset({"__code__", "__globals__", "__defaults__", "__kwdefaults__", "__closure__", "__class__",
                         "__dict__", "__builtins__"})
_ESCAPES = frozenset({"__subclasses__", "__globals__", "__builtins__"})  # from any object to every class / global
# Names distinctive enough that a string spelling one is a way to it (getattr, __import__ of a built name).
_NAMED = frozenset({"_getframe", "_current_frames", "_getframemodulename", "settrace", "setprofile",
                    "setswitchinterval", "addaudithook", "get_referrers", "get_referents", "get_objects",
                    "currentframe", "getouterframes", "getinnerframes", "walk_stack", "meta_path", "path_hooks",
                    "spec_from_file_location", "module_from_spec", "orig_argv", "__code__", "__globals__",
                    "__builtins__"}) | _FRAME_ATTRS
_PATHS = ("/proc/", "/dev/fd/", "/dev/stdout", "/dev/stderr", "/dev/stdin")
_SETTERS = frozenset({"setattr", "delattr"})


class IsolationRule(Rule):
    id = "isolation"
    summary = "the engine never reaches into the process that runs it (tests, benchmarks)"

    def check(self, module: SourceModule) -> Iterator[Finding]:
        settings = self.config.isolation
        if module.package not in settings.packages:
            return
        imports = imports_of(module)
        scan = _Scan(self.id, module, imports, settings)
        yield from scan.findings(self.project.is_module)


class _Scan:
    def __init__(self, rule_id: str, module: SourceModule, imports: ImportTable, settings):  # noqa: ANN001
        self.rule_id, self.module, self.imports, self.settings = rule_id, module, imports, settings
        self.reported: set[int] = set()
        self.lines: set[int] = set()
        self.names = names_of(module)

    def _finding(self, node: ast.AST, message: str) -> Finding:
        self.reported.add(id(node))
        self.lines.add(getattr(node, "lineno", 0))
        return self.module.finding(self.rule_id, message, node)

    def findings(self, is_module) -> Iterator[Finding]:  # noqa: ANN001
        yield from self._imports(is_module)
        yield from self._reach()
        yield from self._stores()
        yield from self._calls()
        yield from self._strings()

    def qualify(self, node: ast.AST) -> str | None:
        return self.names.qualify(node)

    def _settable(self, target: str) -> bool:
        return any(target == p or target.startswith(p + ".") for p in self.settings.settable)

    # -- checks
    def _imports(self, is_module) -> Iterator[Finding]:  # noqa: ANN001
        forbidden = self.settings.forbidden_imports
        for edge in import_edges(self.module, is_module):
            banned = next((p for p in forbidden if edge.target == p or edge.target.startswith(p + ".")), None)
            if banned:
                yield self.module.finding(self.rule_id, f"imports {edge.target}: {banned} is test, judging or raw-memory "
                                                        "machinery ([isolation] forbidden_imports), which the engine "
                                                        "never needs and could use to change how it is judged",
                                          line=edge.line, col=edge.col)
        loader = self.module.relpath in self.settings.loader_modules
        for call in self.module.nodes(ast.Call):
            is_import = self.imports.qualify(call.func) in ("importlib.import_module", "importlib.__import__") \
                or is_builtin(call.func, "__import__", self.imports)
            if is_import and dynamic_import_target(self.module, call, self.imports) is None and not loader:
                yield self._finding(call, "imports a module whose name is computed at run time: it can be any module of "
                                          "the process (the test runner, the benchmark); import it by name, or load op "
                                          "versions through the registry ([isolation] loader_modules)")

    def _reach(self) -> Iterator[Finding]:
        argv_ok = self.module.relpath in self.settings.argv_modules
        for node in self.module.nodes(ast.Attribute):
            if node.attr in _FRAME_ATTRS:
                yield self._finding(node, f"`.{node.attr}` reads a frame: the engine never looks at who called it")
                continue
            if isinstance(node.ctx, ast.Load) and node.attr in _ESCAPES:
                yield self._finding(node, f"`.{node.attr}` leads from any object to every class or global of the process")
                continue
            if isinstance(node.ctx, ast.Load) and node.attr == "__dict__" and self.qualify(node.value) is not None:
                yield self._finding(node, "a module's `__dict__` reaches (and can rebind) everything in it")
                continue
            target = self.qualify(node)
            if target is None or id(node) in self.reported:
                continue
            yield from self._named(node, target, argv_ok)
        for node in self.module.nodes(ast.Name):
            if node.id == "__builtins__":
                yield self._finding(node, "`__builtins__` reaches (and can rebind) every builtin of the process")
            elif isinstance(node.ctx, ast.Load) and node.id in self.imports.bindings and id(node) not in self.reported:
                target = self.imports.bindings[node.id]
                if target in _REACH or target in _ARGV:  # `from sys import _getframe`
                    yield from self._named(node, target, argv_ok)

    def _named(self, node: ast.AST, target: str, argv_ok: bool) -> Iterator[Finding]:
        hit = next((q for q in _REACH if target == q or target.startswith(q + ".")), None)
        if hit is not None:
            yield self._finding(node, f"`{hit}` {_REACH[hit]}: engine code never reaches into the process that runs "
                                      "it (a test runner, a benchmark)")
        elif target in _ARGV and not argv_ok:
            yield self._finding(node, f"`{target}` reads the process's command line outside the modules that parse it "
                                      "([isolation] argv_modules): a setting is an EngineConfig field, and the command "
                                      "line of a process the engine runs in is not the engine's")

    def _stores(self) -> Iterator[Finding]:
        targets: list[ast.AST] = []
        for node in self.module.nodes(ast.Assign):
            targets += node.targets
        for cls in (ast.AugAssign, ast.AnnAssign):
            targets += [n.target for n in self.module.nodes(cls)]
        for node in self.module.nodes(ast.Delete):
            targets += node.targets
        flat: list[ast.AST] = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
            else:
                flat.append(t)
        for t in flat:
            if isinstance(t, ast.Attribute) and t.attr in _CODE_ATTRS:
                yield self._finding(t, f"assigning `{t.attr}` swaps what a function runs or what an object is")
            elif isinstance(t, ast.Attribute) and self.qualify(t.value) is not None and not self._settable(self.qualify(t)):
                yield self._finding(t, f"rebinds `{self.qualify(t)}`, an attribute of another module (monkeypatching): "
                                       "it changes that module for everyone in the process ([isolation] settable lists "
                                       "the library switches meant to be assigned)")
            elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "__dict__" \
                    and id(t.value) not in self.reported:
                yield self._finding(t, "writes into an object's `__dict__` (monkeypatching)")

    def _calls(self) -> Iterator[Finding]:
        for call in self.module.nodes(ast.Call):
            func = call.func
            first = call.args[0] if call.args else None
            self_arg = isinstance(first, ast.Name) and first.id == "self"
            if (any(is_builtin(func, n, self.imports) for n in _SETTERS)
                    or (isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__"))) and not self_arg:
                yield self._finding(call, "sets or deletes an attribute by a call: on anything but `self` that is "
                                          "monkeypatching, which changes other code in the process")
            elif is_builtin(func, "vars", self.imports) and first is not None and self.qualify(first) is not None:
                yield self._finding(call, "`vars()` of a module reaches (and can rebind) everything in it")
            elif (is_builtin(func, "getattr", self.imports) or is_builtin(func, "hasattr", self.imports)) \
                    and len(call.args) >= 2:
                base = self.qualify(call.args[0])
                name = literal_head(call.args[1])
                if base is not None:
                    if name is None or not name[1]:
                        yield self._finding(call, f"reaches an attribute of `{base}` by a computed name: it can be any of "
                                                  "the process's modules and hooks; name the attribute, or look it up "
                                                  "in a table of the ones meant")
                    else:
                        yield from self._named(call, f"{base}.{name[0]}", self.module.relpath in self.settings.argv_modules)
            elif is_builtin(func, "globals", self.imports):
                yield self._finding(call, "`globals()` reaches this module's names by string, and through them every "
                                          "module it imported")

    def _strings(self) -> Iterator[Finding]:
        module = self.module
        consumed = set(data_operands(module))
        for call in module.nodes(ast.Call):  # getattr(x, "name") is judged by _calls
            if call.args[1:] and (is_builtin(call.func, "getattr", self.imports) or is_builtin(call.func, "hasattr", self.imports)):
                consumed.add(id(call.args[1]))
        candidates = [n for n in module.nodes(ast.Constant) if id(n) not in consumed and isinstance(n.value, str)]
        candidates += [n for n in module.nodes(ast.BinOp) if isinstance(n.op, ast.Add) and id(n) not in consumed]
        candidates += [n for n in module.nodes(ast.JoinedStr) if id(n) not in consumed]
        for node in candidates:
            head = literal_head(node)
            if head is None or node.lineno in self.lines:
                continue
            text, complete = head
            if (complete and text in _NAMED) or text.startswith(_PATHS):
                yield self._finding(node, f"the string {text[:60]!r} names a way into the process (a frame, a hook, the "
                                          "command line, a raw stream); reaching it by name hides it from this check")
