"""fail-fast: errors surface where they happen instead of turning into silent defaults.

Every way Python can drop an exception is a finding:
* a bare `except:` (it also catches KeyboardInterrupt and SystemExit), whatever its body;
* `except Exception` / `except BaseException` (also `except*`, in a tuple, through an alias such as
  `E = Exception` or `ERRORS = (KeyError, Exception)`, or `builtins.Exception`) whose body does not
  re-raise or exit on every path and does not hand the exception object on (returned, stored in an
  attribute / item, or passed to a method such as `errors.append(err)`, not of a container made on
  the spot: `[].append(err)`). Logging, printing or warning is not handing on: log-and-continue is
  swallowing;
* `contextlib.suppress(...)` of a broad exception, however `suppress` was imported or aliased;
* `return` / `break` / `continue` in a `finally` block: they discard the exception in flight;
* replacing `sys.excepthook`, `sys.unraisablehook` or `threading.excepthook` (assignment or setattr);
* a context manager `__exit__` / `__aexit__` that may return a true value: it suppresses the
  exception of its `with` block; so does an exit callback pushed on a `contextlib.ExitStack`
  (`stack.push(lambda *exc: True)`), which is the same hook without the class.
Narrow handlers (`except KeyError: pass`) stay allowed: they name the one failure they expect.
"""

import ast
from collections.abc import Iterator

from guards.astutil import ImportTable, imports_of, is_builtin
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["FailFastRule"]

_BROAD = frozenset({"Exception", "BaseException"})
_BROAD_QUALIFIED = frozenset({"builtins.Exception", "builtins.BaseException"})
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log",
                          "print_exc", "print_exception", "print_stack", "write", "flush"})
_EXITS = frozenset({"sys.exit", "os._exit", "os.abort"})
_HOOKS = frozenset({"sys.excepthook", "sys.unraisablehook", "threading.excepthook"})
_SUPPRESS = "contextlib.suppress"
_EXIT_STACKS = frozenset({"contextlib.ExitStack", "contextlib.AsyncExitStack"})
_EXIT_PUSHES = frozenset({"push", "push_async_exit"})
# A container made on the spot: `[].append(err)` hands the exception to nothing.
_THROWAWAY = (ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp, ast.SetComp)


class _Names:
    """What this file's names stand for: broad exception aliases and aliases of contextlib.suppress.

    Flow-insensitive like ImportTable: `E = Exception` anywhere makes `E` broad everywhere in the file.
    """

    def __init__(self, module: SourceModule, imports: ImportTable):
        self.imports = imports
        self.broad: set[str] = set()
        self.suppress = {name for name, target in imports.bindings.items() if target == _SUPPRESS}
        assigns = [(t.id, node.value) for node in module.nodes(ast.Assign) for t in node.targets
                   if isinstance(t, ast.Name)]
        assigns += [(node.target.id, node.value) for node in module.nodes(ast.AnnAssign)
                    if isinstance(node.target, ast.Name) and node.value is not None]
        changed = True
        while changed:  # aliases of aliases: repeat until nothing new is learnt
            changed = False
            for name, value in assigns:
                if name not in self.broad and self.is_broad(value):
                    self.broad.add(name)
                    changed = True
                if name not in self.suppress and self.is_suppress(value):
                    self.suppress.add(name)
                    changed = True

    def is_broad(self, node: ast.AST | None) -> bool:
        """The expression names Exception or BaseException anywhere (a tuple, a concatenation, an alias)."""
        if node is None:
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (sub.id in self.broad or
                                              (sub.id in _BROAD and sub.id not in self.imports.bindings)):
                return True
            if isinstance(sub, ast.Name) and self.imports.bindings.get(sub.id) in _BROAD_QUALIFIED:
                return True
            if isinstance(sub, ast.Attribute) and self.imports.qualify(sub) in _BROAD_QUALIFIED:
                return True
            if isinstance(sub, ast.Constant) and sub.value in _BROAD:  # getattr(builtins, "Exception")
                return True
        return False

    def is_suppress(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.suppress) or self.imports.qualify(node) == _SUPPRESS


def _is_report(call: ast.AST, imports: ImportTable) -> bool:
    """print(...), warnings.warn(...), logger.error(...), traceback.print_exc(), sys.stderr.write(...)."""
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "print" or imports.bindings.get(func.id) in ("warnings.warn", "traceback.print_exc")
    return isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS


def _exits(stmt: ast.stmt, imports: ImportTable) -> bool:
    """The statement never completes normally: raise, sys.exit(), or an if / with whose every way out does."""
    if isinstance(stmt, ast.Raise):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return imports.qualify(stmt.value.func) in _EXITS
    if isinstance(stmt, ast.If):
        return _always_exits(stmt.body, imports) and _always_exits(stmt.orelse, imports)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return _always_exits(stmt.body, imports)
    return False


def _always_exits(body: list[ast.stmt], imports: ImportTable) -> bool:
    return any(_exits(stmt, imports) for stmt in body)


def _hands_on(handler: ast.ExceptHandler, imports: ImportTable) -> bool:
    """The caught exception object leaves the handler: returned, stored in an object, or passed to a method.

    `log.error("%s", err)` does not count (that is log-and-continue), nor does a plain function call
    such as `str(err)` on its own line, or binding it to a local name.
    """
    if not handler.name:
        return False

    def mentions(node: ast.AST | None) -> bool:
        return node is not None and any(isinstance(n, ast.Name) and n.id == handler.name for n in ast.walk(node))

    for stmt in handler.body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) and mentions(node.value):
                return True
            if isinstance(node, ast.Assign) and mentions(node.value) and \
                    any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not _is_report(node, imports) \
                    and not isinstance(node.func.value, _THROWAWAY) \
                    and any(mentions(a) for a in (*node.args, *(k.value for k in node.keywords))):
                return True
    return False


def _may_be_true(value: ast.AST) -> bool:
    return not (isinstance(value, ast.Constant) and value.value in (None, False))


def _jumps_out_of_finally(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """return anywhere in a finally block; break / continue not inside a loop of that block.

    Nested functions and classes are their own scope: their returns do not leave the finally.
    """
    pending = [(stmt, False) for stmt in body]
    while pending:
        node, in_loop = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return) or (isinstance(node, (ast.Break, ast.Continue)) and not in_loop):
            yield node
        loop = isinstance(node, (ast.For, ast.AsyncFor, ast.While))
        for child in ast.iter_child_nodes(node):
            # a loop's else clause runs after the loop, so a break there leaves the finally
            inside = in_loop or (loop and child not in getattr(node, "orelse", ()))
            pending.append((child, inside))


class FailFastRule(Rule):
    id = "fail-fast"
    summary = ("no bare except, no broad except that swallows, no suppress(Exception), no return/break/continue "
               "in finally, no excepthook override, no __exit__ that returns true")

    def check(self, module: SourceModule) -> Iterator[Finding]:
        imports = imports_of(module)
        names = _Names(module, imports)
        yield from self._handlers(module, imports, names)
        yield from self._suppress(module, names)
        yield from self._finally(module)
        yield from self._hooks(module, imports)
        yield from self._exit_methods(module)
        yield from self._exit_stack_pushes(module, imports)

    def _handlers(self, module: SourceModule, imports: ImportTable, names: _Names) -> Iterator[Finding]:
        for handler in module.nodes(ast.ExceptHandler):
            if handler.type is None:
                yield module.finding(self.id, "bare `except:` also catches KeyboardInterrupt and SystemExit; "
                                              "catch the specific exceptions you expect", handler)
            elif names.is_broad(handler.type) and not _always_exits(handler.body, imports) \
                    and not _hands_on(handler, imports):
                yield module.finding(self.id, "`except Exception` whose body can finish without re-raising hides the "
                                              "failure (passing, logging, returning a default or continuing is "
                                              "swallowing); catch the specific exception, or re-raise on every path "
                                              "(`raise` or `raise ... from err`)", handler)

    def _suppress(self, module: SourceModule, names: _Names) -> Iterator[Finding]:
        for call in module.nodes(ast.Call):
            if names.is_suppress(call.func) and any(names.is_broad(a) for a in call.args):
                yield module.finding(self.id, "`contextlib.suppress(Exception)` hides every failure in its block; "
                                              "suppress only the specific exceptions you expect", call)

    def _finally(self, module: SourceModule) -> Iterator[Finding]:
        for node in (*module.nodes(ast.Try), *module.nodes(ast.TryStar)):
            for jump in _jumps_out_of_finally(node.finalbody):
                word = type(jump).__name__.lower()
                yield module.finding(self.id, f"`{word}` in a `finally` block discards the exception in flight; "
                                              f"move the `{word}` after the try statement", jump)

    def _hooks(self, module: SourceModule, imports: ImportTable) -> Iterator[Finding]:
        targets = [(t, node) for node in module.nodes(ast.Assign) for t in node.targets]
        targets += [(node.target, node) for node in (*module.nodes(ast.AugAssign), *module.nodes(ast.AnnAssign))]
        for target, node in targets:
            if imports.qualify(target) in _HOOKS:
                yield self._hook_finding(module, imports.qualify(target), node)
        for call in module.nodes(ast.Call):
            if is_builtin(call.func, "setattr", imports) and len(call.args) >= 2 \
                    and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
                hook = f"{imports.qualify(call.args[0])}.{call.args[1].value}"
                if hook in _HOOKS:
                    yield self._hook_finding(module, hook, call)

    def _hook_finding(self, module: SourceModule, hook: str, node: ast.AST) -> Finding:
        return module.finding(self.id, f"replacing `{hook}` changes what happens to uncaught exceptions; let them "
                                       "reach the default hook (catch specific errors where they happen)", node)

    def _exit_methods(self, module: SourceModule) -> Iterator[Finding]:
        for func in (*module.nodes(ast.FunctionDef), *module.nodes(ast.AsyncFunctionDef)):
            if func.name not in ("__exit__", "__aexit__"):
                continue
            for node in ast.walk(func):
                value = node.value if isinstance(node, ast.Return) else None
                if value is not None and not (isinstance(value, ast.Constant) and value.value in (None, False)):
                    yield module.finding(self.id, f"`{func.name}` returning a true value suppresses the exception of "
                                                  "its `with` block; return None (or False)", node)

    def _exit_stack_pushes(self, module: SourceModule, imports: ImportTable) -> Iterator[Finding]:
        """`stack.push(f)` on a contextlib.ExitStack, where f may return a true value: an `__exit__` by another name."""
        def is_stack(node: ast.AST) -> bool:
            return isinstance(node, ast.Call) and imports.qualify(node.func) in _EXIT_STACKS

        stacks = {item.optional_vars.id for w in (*module.nodes(ast.With), *module.nodes(ast.AsyncWith))
                  for item in w.items if is_stack(item.context_expr) and isinstance(item.optional_vars, ast.Name)}
        stacks |= {t.id for a in module.nodes(ast.Assign) if is_stack(a.value) for t in a.targets if isinstance(t, ast.Name)}
        functions = {f.name: f for f in (*module.nodes(ast.FunctionDef), *module.nodes(ast.AsyncFunctionDef))}
        for call in module.nodes(ast.Call):
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr in _EXIT_PUSHES and call.args
                    and ((isinstance(func.value, ast.Name) and func.value.id in stacks) or is_stack(func.value))):
                continue
            callback = call.args[0]
            if isinstance(callback, ast.Lambda):
                suppresses = _may_be_true(callback.body)
            elif isinstance(callback, ast.Name) and callback.id in functions:
                suppresses = any(n.value is not None and _may_be_true(n.value)
                                 for n in ast.walk(functions[callback.id]) if isinstance(n, ast.Return))
            else:
                suppresses = True  # a callable this file does not define may return True
            if suppresses:
                yield module.finding(self.id, "an exit callback pushed on an ExitStack that may return a true value "
                                              "suppresses the exception of the `with` block; return None (or use "
                                              "`stack.callback`, which never suppresses)", call)
