"""exec-route: every line of code the engine runs is a line the guards have read.

The acceptance tests import the engine, so engine code runs in the process that computes a verdict. The
other rules read the engine's *.py files; code that reaches Python's power to run text, files or bytes as
code runs lines none of them read (a payload that patches the test runner, reads the environment, or
recognises the judge). So, in the packages guards.toml `[exec-route] packages` names, each of these is a
finding (the module, name or call is resolved through imports, `as` aliases, local aliases `r = runpy`, and
literal `__import__("x")` / `importlib.import_module("x")` roots):

* importing a module whose job is running code that is not in a *.py file the guards read (`_MODULES`):
  runpy, code / codeop, pdb / bdb, profile / cProfile / trace / timeit (they run statements given as text),
  the import machinery (importlib.util / machinery / abc, zipimport, pkgutil, imp, site), deserialisers
  of code-bearing formats (pickle, marshal, shelve, dill, cloudpickle, jsonpickle, joblib: unpickling calls
  whatever callable the bytes name), `builtins` (exec, eval, compile, __import__), logging.config and pydoc
  (objects built from dotted names), torch.package / torch.hub / torch.utils.cpp_extension;
* using a name that runs code (`_NAMES`): the builtins exec / eval / compile / breakpoint, `torch.load`
  without a literal `weights_only=True`, `numpy.load` with `allow_pickle`, PyYAML's loaders that build
  objects, entry points, `typing.get_type_hints` (evaluates annotation text), a module's `__loader__` /
  `__spec__` / `__builtins__`, `.exec_module` / `.load_module` / `.runsource` on anything, `.__self__` (a
  builtin function's is the builtins module), `getattr`, `__import__` or `import_module` passed as a value, `vars()` / `locals()` without an
  argument, `operator.attrgetter` / `methodcaller` / `inspect.getattr_static` with a computed name;
* a string naming a route (`"exec"`, `"run_path"`, `"__loader__"`, also built by `+`), as the name of
  getattr & co. or on its own (items of a table or a comparison are data), and a format string that
  reads a dunder attribute (`"{0.__globals__}"`);
* starting a child process whose command the guards cannot read: a launcher (subprocess, os.system /
  popen / exec* / spawn*, pty.spawn, asyncio) called with anything but a literal argument list, through a
  shell, with an `executable=`, or running an interpreter or shell (python, sh, env, torchrun, ...), or a
  launcher passed as a value.

And files (`check_tree`): under those packages every file is a *.py file the guards read or a data file
whose suffix `[exec-route] data_suffixes` lists. Anything else is refused by name: bytecode (.pyc / .pyo
outside `__pycache__` is imported without a source), extension modules (.so / .pyd), archives Python can
import from (.zip / .egg / .whl / .pyz), .pth files, .pyw, and any file of a type not listed as data; a
*.py file in a hidden folder (the per-module walk skips those). A `__pycache__` folder may hold only
timestamp-checked caches of a sibling *.py file, named as the interpreter names them (the judge never
reads in-tree caches: PYTHONPYCACHEPREFIX), never a hash-based .pyc (Python does not write those unless
told to, and loads an unchecked one without looking at the source).

A real need is marked `# guard: allow exec-route -- <why>` on the line, which a reviewer reads (the judge
refuses any suppression a candidate adds). The list of routes is open; this rule is the second layer:
the judge computes verdicts in a process that never imports candidate code.
"""

import ast
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from guards.astutil import Names, data_operands, import_edges, is_builtin, literal_head, names_of
from guards.config import CODE_SUFFIXES
from guards.findings import Finding
from guards.rules.base import Rule
from guards.source import SourceModule, display_path

__all__ = ["ExecRouteRule", "code_routes"]

_UNPICKLES = "unpickling calls whatever callable the bytes name (`__reduce__`), so loading data runs code"
_IMPORTER = "the import machinery: it runs files (of any name) as modules"
_TEXT = "runs statements given as text"
# Modules (dotted prefixes) whose job is running code from text, files or bytes.
_MODULES: dict[str, str] = {
    "runpy": "runs a file or module given by name or path",
    "code": "an interactive interpreter: compiles and runs source text",
    "codeop": "compiles source text",
    **{m: "a debugger: runs source text and commands" for m in ("pdb", "bdb")},
    **{m: _TEXT for m in ("profile", "cProfile", "trace", "timeit")},
    **{m: _UNPICKLES for m in ("pickle", "_pickle", "cPickle", "shelve", "dill", "cloudpickle", "jsonpickle", "joblib",
                               "copyreg")},
    "marshal": "loads code objects from bytes",
    **{m: _IMPORTER for m in ("importlib.util", "importlib.machinery", "importlib.abc", "importlib._bootstrap",
                              "importlib._bootstrap_external", "zipimport", "pkgutil", "imp", "_imp", "pkg_resources")},
    "site": "processes .pth files, whose `import` lines run",
    "builtins": "holds exec, eval, compile and __import__",
    "__builtin__": "holds exec, eval, compile and __import__",
    "logging.config": "builds objects from dotted names in a config (`()` factories), importing them",
    "pydoc": "locates and imports objects by dotted name",
    "_posixsubprocess": "starts processes below the subprocess module",
    "torch.package": "imports Python code from an archive",
    "torch.hub": "runs a repository's hubconf.py",
    "torch.utils.cpp_extension": "compiles and loads native code the guards cannot read",
}
# Qualified names (dotted prefixes) that run code; the calls in _CONDITIONAL are fine in their safe form.
_NAMES: dict[str, str] = {
    **{f"builtins.{n}": "runs code given as text or an object" for n in ("exec", "eval", "compile", "execfile")},
    "builtins.breakpoint": "starts a debugger that runs typed code",
    "torch.load": _UNPICKLES + "; pass a literal `weights_only=True`",
    "torch.serialization.load": _UNPICKLES + "; pass a literal `weights_only=True`",
    "torch.jit.load": "loads TorchScript code from a file",
    **{f"torch.{n}.load_library": "loads a native library the guards cannot read" for n in ("ops", "classes")},
    "numpy.load": _UNPICKLES + " (`allow_pickle`)",
    **{f"yaml.{n}": "PyYAML's object-building loaders call constructors the document names" for n in (
        "load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all", "Loader", "UnsafeLoader",
        "FullLoader", "CLoader", "CUnsafeLoader", "CFullLoader")},
    "pandas.read_pickle": _UNPICKLES,
    **{f"importlib.metadata.{n}": "entry points import and return any object named in package metadata"
       for n in ("entry_points", "EntryPoint")},
    **{f"typing.{n}": "evaluates annotation text as code" for n in ("get_type_hints", "ForwardRef", "_eval_type")},
    "inspect.get_annotations": "evaluates annotation text as code (`eval_str`)",
    "inspect.getmodule": "returns the module of any object (the builtins module of a builtin)",
    "multiprocessing.set_executable": "starts children with another interpreter",
    "multiprocessing.set_forkserver_preload": "imports modules by name in the fork server",
}
# Attributes that run code whatever object they are on (loaders, interpreters).
_ATTRS: dict[str, str] = {
    **{n: _IMPORTER for n in ("exec_module", "load_module", "get_code", "source_to_code", "exec_dynamic",
                              "create_dynamic", "exec_builtin")},
    **{n: "an interpreter object's way to run source text" for n in ("runsource", "runcode", "runctx", "runeval",
                                                                     "compile_command")},
    "__self__": "a builtin function's `__self__` is the builtins module (exec, eval, __import__)",
    "__loader__": "a module's loader runs files as modules",
}
_DUNDER_NAMES = {"__loader__": _ATTRS["__loader__"], "__spec__": "a module's spec holds the loader that runs files as modules",
                 "__builtins__": "holds exec, eval, compile and __import__"}
_IMPORTERS = frozenset({"importlib.import_module", "importlib.__import__", "builtins.__import__"})
_BUILTINS = {"exec": "runs code given as text", "eval": "runs code given as text", "compile": "turns text into code",
             "breakpoint": "starts a debugger that runs typed code", "execfile": "runs a file"}
# Names distinctive enough that a string spelling one is a way to it (getattr(x, "ex" + "ec")).
_SPELLED = frozenset({"exec", "eval", "compile", "__import__", "breakpoint", "execfile", "run_path", "run_module",
                      "_run_code", "_run_module_code", "exec_module", "load_module", "runsource", "runcode", "runctx",
                      "spec_from_file_location", "module_from_spec", "spec_from_loader", "SourceFileLoader",
                      "SourcelessFileLoader", "builtins", "__builtin__", "__loader__", "__self__", "get_type_hints",
                      "system", "popen", "execv", "execve", "execvp", "execl", "spawnv", "spawnl", "posix_spawn",
                      "loads", "Unpickler", "_Unpickler"})
_SPELLED_AS_WORD = _SPELLED - {"eval", "compile", "system", "loads"}  # also common words: only as a getattr name
_GETATTRS = frozenset({"getattr", "hasattr", "delattr", "setattr"})
_NAME_TAKERS = {"operator.attrgetter": 0, "operator.methodcaller": 0, "inspect.getattr_static": 1}
_FORMAT_DUNDER = re.compile(r"\{[^{}]*(\.|\[)_{2}\w+")

_LAUNCHERS = frozenset({f"subprocess.{f}" for f in ("run", "call", "check_call", "check_output", "Popen", "getoutput",
                                                     "getstatusoutput")}
                       | {"os.system", "os.popen", "os.startfile", "os.posix_spawn", "os.posix_spawnp", "pty.spawn",
                          "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell"})
_SHELLS = frozenset({"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput",
                     "asyncio.create_subprocess_shell"})
_INTERPRETER = re.compile(r"(python|pypy|jython|ipython)[0-9.]*(\.exe)?|(ba|da|z|k|c|tc|fi|)sh|env|perl|ruby|node|deno|"
                          r"bun|php|lua|osascript|torchrun|accelerate|deepspeed|xargs|busybox|nohup|setsid|timeout|"
                          r"sudo|su|awk|gawk|find|make|pip[0-9.]*|uv|conda")
_CACHE_NAME = re.compile(r"(?P<stem>[A-Za-z_][A-Za-z0-9_]*)\.[a-z]+-[0-9]+(\.opt-[12])?\.pyc")


def _os_launcher(qualified: str) -> bool:
    name = qualified.rpartition(".")[2]
    return qualified.split(".", 1)[0] in ("os", "posix", "nt") and qualified.count(".") == 1 \
        and (name.startswith(("exec", "spawn")) or name in ("system", "popen", "posix_spawn", "posix_spawnp"))


def _route_of(qualified: str) -> tuple[str, str] | None:
    """(the route's name, why) for a qualified name that runs code, else None."""
    if qualified.split(".", 1)[0] in ("posix", "nt"):
        qualified = "os." + qualified.split(".", 1)[1] if "." in qualified else "os"
    for table in (_NAMES, _MODULES):
        hit = next((q for q in table if qualified == q or qualified.startswith(q + ".")), None)
        if hit is not None:
            return hit, table[hit]
    return None


def _literal(node: ast.AST) -> str | None:
    head = literal_head(node)
    return head[0] if head and head[1] else None


def _safe_call(qualified: str, call: ast.Call) -> bool:
    """The safe form of a conditional route: torch.load(weights_only=True), numpy.load without pickles,
    yaml.load(Loader=yaml.SafeLoader), inspect.get_annotations without eval_str."""
    if any(k.arg is None for k in call.keywords):
        return False  # **kwargs: anything
    keywords = {k.arg: k.value for k in call.keywords}

    def literal(key: str, value: bool) -> bool:
        node = keywords.get(key)
        return isinstance(node, ast.Constant) and node.value is value

    if qualified in ("torch.load", "torch.serialization.load"):
        return literal("weights_only", True)
    if qualified == "numpy.load":
        return "allow_pickle" not in keywords or literal("allow_pickle", False)
    if qualified == "inspect.get_annotations":
        return "eval_str" not in keywords or literal("eval_str", False)
    if qualified in ("yaml.load", "yaml.load_all"):
        loader = keywords.get("Loader", call.args[1] if len(call.args) > 1 else None)
        return loader is not None and ast.unparse(loader).rpartition(".")[2] in ("SafeLoader", "CSafeLoader", "BaseLoader")
    return False


def code_routes(module: SourceModule, is_module: Callable[[str], bool]) -> Iterator[tuple[int, int, str]]:
    """(line, col, message) for each way the module runs code the guards cannot read (module docstring), one per line."""
    yield from _Scan(module, is_module).findings()


class _Scan:
    def __init__(self, module: SourceModule, is_module: Callable[[str], bool]):
        self.module = module
        self.is_module = is_module
        self.names: Names = names_of(module)
        self.imports = self.names.imports
        self.lines: set[int] = set()
        self.calls_by_func = {id(c.func): c for c in module.nodes(ast.Call)}

    def _hit(self, node: ast.AST | tuple[int, int], message: str) -> Iterator[tuple[int, int, str]]:
        line, col = node if isinstance(node, tuple) else (node.lineno, node.col_offset + 1)
        if line not in self.lines:
            self.lines.add(line)
            yield line, col, message

    def findings(self) -> Iterator[tuple[int, int, str]]:
        yield from self._imports()
        yield from self._launches()
        yield from self._references()
        yield from self._computed_names()
        yield from self._strings()

    def _imports(self) -> Iterator[tuple[int, int, str]]:
        for edge in import_edges(self.module, self.is_module):
            hit = next((q for q in _MODULES if edge.target == q or edge.target.startswith(q + ".")), None)
            if hit is not None:
                yield from self._hit((edge.line, edge.col), f"imports `{edge.target}`: {hit} {_MODULES[hit]}")

    def _references(self) -> Iterator[tuple[int, int, str]]:
        found: list[tuple[int, ast.AST, str, str]] = []
        for node in (*self.module.nodes(ast.Attribute), *self.module.nodes(ast.Name)):
            if not isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
                continue
            qualified = self.names.qualify(node)
            if qualified is not None:
                route = _route_of(qualified)
                if route is not None:
                    call = self.calls_by_func.get(id(node))
                    if call is not None and _safe_call(route[0], call):
                        continue
                    found.append((len(qualified), node, f"`{qualified}`", route[1]))
                    continue
            if isinstance(node, ast.Attribute) and node.attr in _ATTRS:
                found.append((0, node, f"`.{node.attr}`", _ATTRS[node.attr]))
            elif isinstance(node, ast.Name):
                if node.id in _DUNDER_NAMES:
                    found.append((0, node, f"`{node.id}`", _DUNDER_NAMES[node.id]))
                elif node.id in _BUILTINS and is_builtin(node, node.id, self.imports):
                    found.append((0, node, f"`{node.id}()`", _BUILTINS[node.id]))
                elif node.id in ("getattr", "__import__") and is_builtin(node, node.id, self.imports) \
                        and id(node) not in self.calls_by_func:
                    found.append((0, node, f"`{node.id}` as a value", "reaches attributes or modules by names given elsewhere"))
            if qualified in _IMPORTERS and id(node) not in self.calls_by_func:
                found.append((0, node, f"`{qualified}` as a value", "imports modules by names given elsewhere"))
        for call in self.module.nodes(ast.Call):
            if any(is_builtin(call.func, n, self.imports) for n in _GETATTRS) and len(call.args) >= 2:
                name, base = _literal(call.args[1]), self.names.qualify(call.args[0])
                route = _route_of(f"{base}.{name}") if name is not None and base is not None else None
                if route is not None:  # getattr(builtins, "ex" + "ec"): the most specific of its line
                    found.append((999, call, f"`{base}.{name}` (by getattr)", route[1]))
            if not call.args and not call.keywords and (is_builtin(call.func, "vars", self.imports)
                                                       or is_builtin(call.func, "locals", self.imports)):
                found.append((0, call, f"`{call.func.id}()`", "returns the namespace by string, `__builtins__` included"))
        # the most specific route of a line first (`runpy.run_path` rather than `runpy`)
        for _, node, route, why in sorted(found, key=lambda f: -f[0]):
            yield from self._hit(node, f"{route}: {why}")

    def _computed_names(self) -> Iterator[tuple[int, int, str]]:
        for call in self.module.nodes(ast.Call):
            func = self.names.qualify(call.func)
            if any(is_builtin(call.func, n, self.imports) for n in _GETATTRS) and len(call.args) >= 2:
                name = _literal(call.args[1])
                if name is not None and (name in _SPELLED or name in _ATTRS):
                    yield from self._hit(call, f"reaches `{name}` by name: a way to run code the guards cannot read")
            elif func in _NAME_TAKERS:
                index = _NAME_TAKERS[func]
                names = call.args[index:] if func != "operator.methodcaller" else call.args[:1]
                for arg in names:
                    text = _literal(arg)
                    if text is None or any(part in _SPELLED or part.startswith("__") for part in text.split(".")):
                        yield from self._hit(call, f"`{func}` with the name {text!r}: reaches an attribute by a computed "
                                                   "or code-running name; name the attribute")
                        break
            elif isinstance(call.func, ast.Attribute) and call.func.attr in ("__getattribute__", "__getattr__"):
                yield from self._hit(call, f"`.{call.func.attr}()` reaches attributes by string")

    def _strings(self) -> Iterator[tuple[int, int, str]]:
        module = self.module
        consumed = set(data_operands(module))
        for call in module.nodes(ast.Call):  # getattr & co.: judged by _computed_names
            if any(is_builtin(call.func, n, self.imports) for n in _GETATTRS):
                consumed.update(id(a) for a in call.args[1:2])
        candidates = [n for n in module.nodes(ast.Constant) if isinstance(n.value, str)]
        candidates += [n for n in module.nodes(ast.BinOp) if isinstance(n.op, ast.Add)]
        for node in candidates:
            text = _literal(node)
            if text is None:
                continue
            if id(node) not in consumed and text in _SPELLED_AS_WORD:
                yield from self._hit(node, f"the string {text!r} names a way to run code; reaching it by name hides it "
                                           "from the guards")
            elif isinstance(node, ast.Constant) and _FORMAT_DUNDER.search(text):
                yield from self._hit(node, f"the format string {text[:60]!r} reads a dunder attribute (a way from any "
                                           "object to every global)")

    def _launches(self) -> Iterator[tuple[int, int, str]]:
        for node in (*self.module.nodes(ast.Attribute), *self.module.nodes(ast.Name)):
            qualified = self.names.qualify(node)
            if qualified is None or not (qualified in _LAUNCHERS or _os_launcher(qualified)):
                continue
            call = self.calls_by_func.get(id(node))
            problem = _launch_problem(qualified, call) if call is not None else \
                "a process launcher passed as a value: the command it will run cannot be read"
            if problem:
                yield from self._hit(node, f"`{qualified}`: {problem}")


def _launch_problem(launcher: str, call: ast.Call) -> str | None:
    """Why a child process started by this call runs code the guards cannot read, or None."""
    name = launcher.rpartition(".")[2]
    if launcher in _SHELLS or any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                                  for k in call.keywords):
        return "runs a shell command line: any program, any code"
    if any(k.arg in ("executable", "preexec_fn") or k.arg is None for k in call.keywords):
        return "chooses the program or runs code in the child (`executable=`, `preexec_fn=`, `**kwargs`)"
    args = list(call.args)
    if name.startswith("spawn") and args:
        args = args[1:]  # the mode
    command = args[0] if args else next((k.value for k in call.keywords if k.arg == "args"), None)
    if command is None:
        return "starts a process whose command is not in the call"
    words: list[ast.AST] = []
    for arg in args if name.startswith(("exec", "spawn", "posix_spawn")) else [command]:
        words += arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
    texts = [_literal(w) for w in words]
    if any(t is None for t in texts) or not texts:
        return ("starts a process with a command built at run time (a computed script or `-c` code, "
                "`sys.executable`): the guards cannot read what it runs; use a literal argument list")
    program = os.path.basename(texts[0].split()[0]) if texts[0].split() else ""
    if _INTERPRETER.fullmatch(program):
        return f"starts {program!r}, which runs code given to it as text or a file the guards do not read"
    return None


class ExecRouteRule(Rule):
    id = "exec-route"
    summary = "engine code never runs code the guards cannot read (exec-likes, deserialisers, loaders, children)"

    def check(self, module: SourceModule) -> Iterator[Finding]:
        if module.package not in self.config.exec_route.packages:
            return
        for line, col, message in code_routes(module, self.project.is_module):
            yield module.finding(self.id, f"{message}; write the code in a *.py file and call it (a real need: "
                                          "`# guard: allow exec-route -- <why>`)", line=line, col=col)

    def check_tree(self, paths: Sequence[Path], cwd: Path) -> Iterator[Finding]:
        settings = self.config.exec_route
        root = self.project.root
        seen: set[Path] = set()
        for start in paths:
            for file in _files_under(Path(start).resolve(), root, settings.packages):
                if file in seen:
                    continue
                seen.add(file)
                why = _unreadable(file, root, settings.data_suffixes)
                if why:
                    yield Finding(display_path(file, cwd), 1, 1, self.id, why)


def _in_scope(rel: str, packages: Sequence[str]) -> bool:
    return rel.split("/", 1)[0] in packages


def _files_under(start: Path, root: Path, packages: Sequence[str]) -> Iterator[Path]:
    """Every file (hidden folders and __pycache__ included) under `start` that lies in one of the packages."""
    if start.is_file():
        try:
            rel = start.relative_to(root).as_posix()
        except ValueError:
            return
        if _in_scope(rel, packages):
            yield start
        return
    for dirpath, dirnames, filenames in os.walk(start):
        folder = Path(dirpath)
        try:
            rel = folder.relative_to(root).as_posix()
        except ValueError:
            dirnames[:] = []
            continue
        if rel == ".":
            dirnames[:] = sorted(d for d in dirnames if d in packages)
            continue
        if not _in_scope(rel, packages):
            dirnames[:] = []
            continue
        dirnames.sort()
        for name in sorted(filenames):
            yield folder / name


def _unreadable(file: Path, root: Path, data_suffixes: Sequence[str]) -> str | None:
    """Why a file under an exec-route package is code the guards cannot read, or None."""
    rel = file.relative_to(root).as_posix()
    parts = rel.split("/")
    fix = "delete it, or write the code as a *.py file"
    if "__pycache__" in parts[:-1]:
        return _cache_problem(file)
    suffix = file.suffix.lower()
    if suffix == ".py":
        if any(p.startswith(".") for p in parts[:-1]):
            return f"{rel}: a *.py file in a hidden folder, which the guards' walk skips; move it to a package folder"
        return None
    if suffix in CODE_SUFFIXES:
        return f"{rel}: Python loads {suffix} files as code (bytecode, native code, an importable archive, .pth lines), " \
               f"and the guards cannot read them; {fix}"
    if suffix in data_suffixes:
        return None
    listed = ", ".join(data_suffixes) or "none"
    return (f"{rel}: not a *.py file and not a data file guards.toml lists ([exec-route] data_suffixes: {listed}); "
            "a file the guards cannot read may be run as code. Keep data in a listed format, or a reviewer adds "
            "the suffix to guards.toml")


def _cache_problem(file: Path) -> str | None:
    """A __pycache__ entry is fine only as the interpreter writes it: a timestamp-checked cache of a sibling source."""
    rel = file.name
    match = _CACHE_NAME.fullmatch(file.name)
    if file.parent.name != "__pycache__" or match is None:
        return f"{file.parent.name}/{rel}: only the interpreter's caches of sibling *.py files belong in __pycache__; delete it"
    if not (file.parent.parent / f"{match.group('stem')}.py").is_file():
        return f"__pycache__/{rel}: a cache without its *.py source (bytecode the guards cannot read); delete it"
    try:
        with file.open("rb") as fh:
            header = fh.read(8)
    except OSError as err:
        return f"__pycache__/{rel}: cannot be read ({err}); delete it"
    if len(header) < 8 or int.from_bytes(header[4:8], "little") != 0:
        return (f"__pycache__/{rel}: a hash-based or malformed .pyc, which the interpreter never writes by itself "
                "and may load without its source; delete it")
    return None
