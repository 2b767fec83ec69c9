"""fail-fast: errors surface where they happen instead of turning into silent defaults.

Flags a bare `except:`; an `except Exception` / `except BaseException` (alone or in a tuple, also
`except*`) whose body only passes, continues, breaks, returns or assigns a constant, or
logs / prints / warns; and `contextlib.suppress(Exception)` however it was imported. A handler that
raises, exits, or does real work is left alone: that is handling, not swallowing.
"""

import ast
from collections.abc import Iterator

from guards.astutil import ImportTable, imports_of
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule

__all__ = ["FailFastRule"]

_BROAD = frozenset({"Exception", "BaseException"})
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log",
                          "print_exc", "print_exception", "print_stack"})
_STREAMS = frozenset({"sys.stderr.write", "sys.stdout.write", "sys.stderr.flush", "sys.stdout.flush"})


def _is_broad(node: ast.AST | None, imports: ImportTable) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Tuple):
        return any(_is_broad(element, imports) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in _BROAD and node.id not in imports.bindings
    return imports.qualify(node) in ("builtins.Exception", "builtins.BaseException")


def _is_constant(node: ast.AST | None) -> bool:
    """None, a literal, or a container of literals: the shapes of a made-up default."""
    if node is None or isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(isinstance(e, ast.Constant) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(isinstance(v, ast.Constant) for v in (*node.keys, *node.values))
    return False


def _only_reports(call: ast.AST, imports: ImportTable) -> bool:
    """print(...), warnings.warn(...), logger.error(...), traceback.print_exc(), sys.stderr.write(...)."""
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "print" or imports.bindings.get(func.id) in ("warnings.warn", "traceback.print_exc")
    if isinstance(func, ast.Attribute):
        return func.attr in _LOG_METHODS or imports.qualify(func) in _STREAMS
    return False


def _swallows(body: list[ast.stmt], imports: ImportTable) -> bool:
    """True when no statement does anything but give up quietly (ifs are looked into)."""
    pending = list(body)
    while pending:
        stmt = pending.pop()
        if isinstance(stmt, (ast.Pass, ast.Continue, ast.Break)):
            continue
        if isinstance(stmt, ast.Return) and _is_constant(stmt.value):
            continue
        if isinstance(stmt, ast.Assign) and _is_constant(stmt.value):
            continue
        if isinstance(stmt, ast.Expr) and (isinstance(stmt.value, ast.Constant) or _only_reports(stmt.value, imports)):
            continue
        if isinstance(stmt, ast.If):
            pending.extend(stmt.body)
            pending.extend(stmt.orelse)
            continue
        return False
    return True


class FailFastRule(Rule):
    id = "fail-fast"
    summary = "no bare except, no except Exception that swallows, no contextlib.suppress(Exception)"

    def check(self, module: SourceModule) -> Iterator[Finding]:
        imports = imports_of(module)
        for handler in module.nodes(ast.ExceptHandler):
            if handler.type is None:
                yield module.finding(self.id, "bare `except:` also catches KeyboardInterrupt and SystemExit; "
                                              "catch the specific exceptions you expect", handler)
            elif _is_broad(handler.type, imports) and _swallows(handler.body, imports):
                yield module.finding(self.id, "`except Exception` that only passes / logs / returns a default hides "
                                              "the failure; catch the specific exception, or re-raise "
                                              "(`raise` or `raise ... from err`)", handler)
        if not any(target.endswith("suppress") for target in imports.bindings.values()):
            return  # the common case: nothing can name contextlib.suppress in this file
        for call in module.nodes(ast.Call):
            if imports.qualify(call.func) == "contextlib.suppress" and any(_is_broad(a, imports) for a in call.args):
                yield module.finding(self.id, "`contextlib.suppress(Exception)` hides every failure in its block; "
                                              "suppress only the specific exceptions you expect", call)
