"""Finding the files to check, naming their modules, and parsing each one exactly once.

A file under the config root is named by its path from the root (engine/model/attn.py ->
engine.model.attn), the way guards.toml names modules. A file outside the root (the installed torch)
is named by walking up through folders that hold an `__init__.py`, the way Python would import it.
A file that cannot be read or parsed becomes a `parse-error` finding instead of a crash.
"""

import ast
import io
import os
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path

from guards.findings import Finding

__all__ = ["SourceModule", "ModuleNamer", "iter_python_files", "parse_module", "display_path", "PARSE_ERROR"]

PARSE_ERROR = "parse-error"

# The node types every file is asked for; they are collected in the one walk over a file. Other types
# (Name, the most common node, is needed only where the environment may be reached) are collected by a
# second walk on first request.
_INDEXED = (ast.Attribute, ast.Call, ast.Subscript, ast.Compare, ast.Import, ast.ImportFrom, ast.ExceptHandler,
            ast.Global)
# Asked for by some rules on most files: collected together in one second walk on the first request.
_SECOND = (ast.Name, ast.Constant, ast.BinOp, ast.Tuple, ast.List, ast.Set, ast.Assign, ast.AnnAssign, ast.AugAssign,
           ast.Try, ast.TryStar, ast.FunctionDef, ast.AsyncFunctionDef)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _index(tree: ast.AST, types: tuple[type, ...]) -> dict[type, list[ast.AST]]:
    """One iterative pass (deep expression trees must not hit the recursion limit); skips `ctx` nodes."""
    index: dict[type, list[ast.AST]] = {cls: [] for cls in types}
    stack = [tree]
    pop, push = stack.pop, stack.append
    node_type = ast.AST
    while stack:
        node = pop()
        cls = node.__class__
        bucket = index.get(cls)
        if bucket is not None:
            bucket.append(node)
        names = _FIELDS.get(cls)
        if names is None:
            names = _FIELDS[cls] = tuple(n for n in cls._fields if n != "ctx")
        for name in names:
            value = getattr(node, name, None)
            if value.__class__ is list:
                for item in value:
                    if isinstance(item, node_type):
                        push(item)
            elif isinstance(value, node_type):
                push(value)
    return index  # not in source order; the runner sorts findings by place


class SourceModule:
    """One parsed file: its tree, its dotted name, and a per-type index of its nodes built on first use."""

    def __init__(self, *, path: Path, display: str, name: str, is_package: bool, relpath: str | None,
                 tree: ast.Module, text: str | None):
        self.path = path
        self.display = display
        self.name = name
        self.is_package = is_package
        self.relpath = relpath  # posix path relative to the config root, None outside it
        self.tree = tree
        self.text = text  # decoded source, kept only when it may hold suppression comments
        self._index: dict[type, list[ast.AST]] | None = None
        self.cache: dict[str, object] = {}  # per-file results shared between rules (see astutil)

    @property
    def package(self) -> str:
        return self.name.split(".", 1)[0]

    def nodes(self, cls: type) -> list:
        if self._index is None:
            self._index = _index(self.tree, _INDEXED)
        if cls not in self._index:
            self._index.update(_index(self.tree, _SECOND if cls in _SECOND else (cls,)))
        return self._index[cls]

    def finding(self, rule: str, message: str, node: ast.AST | None = None, line: int = 1, col: int = 1) -> Finding:
        if node is not None:
            line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
        return Finding(self.display, line, col, rule, message)


def display_path(path: Path, cwd: Path) -> str:
    """Relative to the working folder when the file is inside it, else absolute."""
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return str(path)


def iter_python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """*.py files under the given folders (sorted, skipping hidden and __pycache__ folders), and files as given."""
    seen: set[Path] = set()
    for path in paths:
        if path.is_file():
            candidates: Iterable[Path] = [path]
        else:
            candidates = _walk(path)
        for file in candidates:
            real = file.resolve()
            if real not in seen:
                seen.add(real)
                yield file


def _walk(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for filename in sorted(filenames):
            if filename.endswith(".py"):
                yield Path(dirpath, filename)


class ModuleNamer:
    """Dotted module names for files, relative to the config root or by `__init__.py` folders."""

    def __init__(self, root: Path):
        self.root = root
        self._package_of_dir: dict[Path, str | None] = {}

    def relpath(self, path: Path) -> str | None:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return None

    def name(self, path: Path) -> tuple[str, bool]:
        """(dotted name, is a package's __init__)."""
        is_package = path.name == "__init__.py"
        rel = self.relpath(path)
        if rel is not None:
            parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
        else:
            package = self._dir_package(path.parent)
            parts = ([package] if package else []) + [path.stem]
        if is_package and len(parts) > 1:
            parts = parts[:-1]
        return ".".join(parts), is_package

    def _dir_package(self, folder: Path) -> str | None:
        """Dotted name of the package a folder is, or None when it holds no __init__.py."""
        if folder in self._package_of_dir:
            return self._package_of_dir[folder]
        chain: list[Path] = []
        current = folder
        while current not in self._package_of_dir and (current / "__init__.py").is_file() and current.parent != current:
            chain.append(current)
            current = current.parent
        name = self._package_of_dir.get(current)
        for package_dir in reversed(chain):
            name = f"{name}.{package_dir.name}" if name else package_dir.name
            self._package_of_dir[package_dir] = name
        self._package_of_dir.setdefault(folder, None)
        return self._package_of_dir[folder]


def _syntax_error_place(err: SyntaxError) -> tuple[int, int]:
    line = err.lineno if isinstance(err.lineno, int) and err.lineno > 0 else 1
    col = err.offset if isinstance(err.offset, int) and err.offset > 0 else 1
    return line, col


def parse_module(path: Path, *, display: str, name: str, is_package: bool, relpath: str | None) -> SourceModule | Finding:
    """Parse a file once. Bytes go straight to the parser so PEP 263 coding cookies are honoured."""
    try:
        data = path.read_bytes()
    except OSError as err:
        return Finding(display, 1, 1, PARSE_ERROR, f"cannot read the file ({err.strerror or err}); fix its permissions or remove it")
    try:
        tree = ast.parse(data, filename=str(path))
    except SyntaxError as err:
        line, col = _syntax_error_place(err)
        return Finding(display, line, col, PARSE_ERROR, f"does not parse: {err.msg}; fix the syntax or encoding so it can be checked")
    except (ValueError, RecursionError, MemoryError) as err:
        # ValueError: bad bytes (e.g. NUL) on some versions; RecursionError: absurdly deep nesting.
        return Finding(display, 1, 1, PARSE_ERROR, f"does not parse: {type(err).__name__}: {err}; simplify or fix the file")
    text = None
    if b"guard:" in data:
        text = _decode(data)
    return SourceModule(path=path, display=display, name=name, is_package=is_package, relpath=relpath, tree=tree, text=text)


def _decode(data: bytes) -> str:
    """Decode like the interpreter does; the parser already accepted the bytes, so this succeeds."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)
