"""A milestone's stated formula (its learning-rate contract), parsed and evaluated without `eval`.

A milestone that asks for a new schedule states it as a formula, e.g. demo-tiny's
`lr * min(s / W, sqrt(W / s))`; the judge evaluates it itself at every step of every drawn job
(harness/judge/claims/contract.py), so no gate needs to trust a test or the engine for it. Milestone files are
protected, but a formula is still text: it is parsed with `ast` into a small whitelist (numbers, the
names below, + - * / ** and unary minus, comparisons, `a if cond else b`, and the functions min, max,
sqrt, exp, log, cos, sin, abs) and walked here; anything else (attributes, subscripts, other calls,
lambdas, strings) is refused when the milestone loads, naming what was found. Stdlib only: the spec
loader (harness/spec/) validates with it and the judge evaluates with it.
"""

import ast
import math
from collections.abc import Mapping

__all__ = ["FormulaError", "Formula", "VARIABLES"]

# The names a formula may use, bound per step by the judge (harness/judge/claims/contract.py says how):
VARIABLES: dict[str, str] = {
    "s": "the optimizer step as printed (1-based)",
    "lr": "the peak learning rate (--lr)",
    "W": "the warmup steps, at least 1 (max(--warmup-steps, 1))",
    "warmup": "the warmup steps as given (--warmup-steps, may be 0)",
    "N": "the run's steps (--num-steps)",
    "D": "--decay-steps",
    "min_lr": "lr x --min-lr-ratio",
    "pi": "3.14159...",
}
_FUNCTIONS = {"min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "cos": math.cos,
              "sin": math.sin, "abs": abs}
_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}
_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b}
_MAX_LENGTH = 400


class FormulaError(ValueError):
    """A formula outside the whitelist, or one that cannot be evaluated (the message says where)."""


class Formula:
    """One parsed formula; `value(**names)` evaluates it in float arithmetic."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise FormulaError("empty formula")
        if len(text) > _MAX_LENGTH:
            raise FormulaError(f"formula longer than {_MAX_LENGTH} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as err:
            raise FormulaError(f"{text!r} is not an expression: {err.msg}") from None
        self.text = text.strip()
        self._tree = tree.body
        self.names = frozenset(self._check(self._tree))

    def _check(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return set()
        if isinstance(node, ast.Name):
            if node.id not in VARIABLES:
                raise FormulaError(f"unknown name {node.id!r} in {self.text!r}; known: {', '.join(VARIABLES)}")
            return {node.id}
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._check(node.left) | self._check(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self._check(node.operand)
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            return set().union(self._check(node.left), *(self._check(c) for c in node.comparators))
        if isinstance(node, ast.IfExp):
            return self._check(node.test) | self._check(node.body) | self._check(node.orelse)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                and not node.keywords and node.args and not any(isinstance(a, ast.Starred) for a in node.args)):
            return set().union(*(self._check(a) for a in node.args))
        raise FormulaError(f"{ast.unparse(node)!r} in {self.text!r} is outside what a formula may hold (numbers, "
                           f"{', '.join(VARIABLES)}, + - * / **, comparisons, `a if c else b`, "
                           f"{', '.join(_FUNCTIONS)})")

    def value(self, names: Mapping[str, float]) -> float:
        """The formula at `names` (pi is bound here); FormulaError when a name is unbound or the math fails."""
        bound = {"pi": math.pi, **names}
        try:
            return float(self._eval(self._tree, bound))
        except (ArithmeticError, ValueError, TypeError) as err:
            raise FormulaError(f"{self.text!r} at {dict(names)}: {err}") from None

    def _eval(self, node: ast.AST, names: Mapping[str, float]) -> float | bool:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise FormulaError(f"{self.text!r}: no value for {node.id!r}")
            return names[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._eval(node.left, names), self._eval(node.right, names))
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, names)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, names)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = self._eval(right_node, names)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, names) else node.orelse, names)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return _FUNCTIONS[node.func.id](*(self._eval(a, names) for a in node.args))

    def __repr__(self) -> str:
        return f"Formula({self.text!r})"
