"""guards.toml and ENV_WHITELIST.md, read and validated before any file is checked.

Anything missing or malformed raises `GuardsConfigError` with one line that names the file, the key
and the fix; the CLI turns it into exit code 2. The format (every key optional unless noted):

    [ssot]
    env_whitelist = "ENV_WHITELIST.md"            # required; relative to guards.toml
    env_modules = { engine = "engine/env.py" }    # package -> the one module that may read the environment

    [dag]
    forbidden = { engine = ["harness"] }          # package -> module prefixes it must never import

    [dag.engine]                                  # any package name except "forbidden"
    layers = [["engine.errors"], ["engine.cli"]]  # required; dotted prefixes, lowest layer first

    [public-surface]
    allow_private = ["torch._foreach_*"]          # private names that may be used anyway (`*`: prefix)

    [exec-route]
    packages = ["engine"]                         # packages that never run code the guards cannot read
    data_suffixes = [".toml", ".md"]              # the only files besides *.py those packages may hold

    [recognition]
    packages = ["engine"]                         # packages that never look at what machine runs them
    process = ["engine/atomic_files.py"]                # fact family -> the files that may read it (FAMILIES)

A layer entry covers the module it names and everything below it ("engine.model" covers
engine/model/*), except the package's own name ("engine"), which covers only engine/__init__.py:
otherwise every module would silently fall into that layer. The most specific entry wins.
"""

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GuardsConfig", "IsolationSettings", "ExecRouteSettings", "RecognitionSettings", "FAMILIES", "CODE_SUFFIXES",
           "EnvWhitelist", "LayerMap", "GuardsConfigError", "CONFIG_NAME", "load_config",
           "find_config", "parse_whitelist"]

CONFIG_NAME = "guards.toml"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_SEPARATOR_CELL = re.compile(r":?-{3,}:?")
# Files Python loads as code (bytecode, extension modules, archives on sys.path, .pth lines, windowed scripts):
# never data, whatever a config says.
CODE_SUFFIXES = frozenset({".pyc", ".pyo", ".pyw", ".pyz", ".pth", ".so", ".pyd", ".dll", ".dylib", ".zip", ".egg",
                           ".whl"})


class GuardsConfigError(ValueError):
    """guards.toml or the whitelist is missing or malformed; the message names the fix."""


@dataclass(frozen=True)
class EnvWhitelist:
    """Environment variable names that may be read; `prefixes` come from rows ending in `*`."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    def allows(self, name: str) -> bool:
        return name in self.names or any(name.startswith(p) for p in self.prefixes)

    def allows_prefix(self, head: str) -> bool:
        """True when every name starting with `head` is allowed (a wildcard row covers it)."""
        return any(head.startswith(p) for p in self.prefixes)


@dataclass(frozen=True)
class LayerMap:
    """The declared layers of one package; `layer_of` answers with a 0-based index or None."""

    package: str
    layers: tuple[tuple[str, ...], ...]
    _by_length: tuple[tuple[str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        entries = [(entry, i) for i, layer in enumerate(self.layers) for entry in layer]
        object.__setattr__(self, "_by_length", tuple(sorted(entries, key=lambda e: -len(e[0]))))

    def covers(self, module: str) -> bool:
        return module == self.package or module.startswith(self.package + ".")

    def layer_of(self, module: str) -> int | None:
        for entry, index in self._by_length:
            if module == entry or (entry != self.package and module.startswith(entry + ".")):
                return index
        return None


@dataclass(kw_only=True, frozen=True)
class IsolationSettings:
    """`[isolation]`: the packages that must not reach into the process running them, and their exceptions."""

    packages: tuple[str, ...] = ()
    forbidden_imports: tuple[str, ...] = ()  # module prefixes never imported (test / judging / raw-memory machinery)
    argv_modules: tuple[str, ...] = ()  # files (relative paths) that may read sys.argv: the CLI, the run header
    loader_modules: tuple[str, ...] = ()  # files that may import modules named at run time (the op registry)
    settable: tuple[str, ...] = ()  # dotted prefixes of library switches meant to be assigned (torch.backends)


@dataclass(kw_only=True, frozen=True)
class ExecRouteSettings:
    """`[exec-route]`: the packages whose code must all be readable by the guards, and the data files they hold."""

    packages: tuple[str, ...] = ()
    data_suffixes: tuple[str, ...] = ()  # file suffixes besides .py allowed under those packages (".toml")


# The facts a process can tell a judged run by (guards/rules/recognition.py); each is allowed per file.
FAMILIES = ("process", "network", "hostname", "writability", "interpreter", "system-files")


@dataclass(kw_only=True, frozen=True)
class RecognitionSettings:
    """`[recognition]`: the packages that never read facts of the machine or process they run on, and for each
    fact family the few files that need it (atomic temp names carry the pid, the run header names the host)."""

    packages: tuple[str, ...] = ()
    allowed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # family -> relative .py paths

    def allows(self, family: str, relpath: str | None) -> bool:
        return relpath is not None and relpath in self.allowed.get(family, ())


@dataclass(kw_only=True, frozen=True)
class GuardsConfig:
    path: Path
    root: Path
    whitelist_path: Path
    whitelist: EnvWhitelist
    env_modules: dict[str, str]
    layers: dict[str, LayerMap]
    forbidden: dict[str, tuple[str, ...]]
    allow_private: tuple[str, ...] = ()
    isolation: IsolationSettings = field(default_factory=IsolationSettings)
    exec_route: ExecRouteSettings = field(default_factory=ExecRouteSettings)
    recognition: RecognitionSettings = field(default_factory=RecognitionSettings)

    def private_allowed(self, dotted: str) -> bool:
        for pattern in self.allow_private:
            if dotted == pattern or (pattern.endswith("*") and dotted.startswith(pattern[:-1])):
                return True
        return False


def find_config(start: Path) -> Path:
    """The nearest guards.toml in `start` or one of its parents."""
    for folder in (start, *start.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
    raise GuardsConfigError(f"no {CONFIG_NAME} in {start} or any parent folder; run from the project or pass --config PATH")


def parse_whitelist(path: Path) -> EnvWhitelist:
    """Names in backticks in the first column of the Markdown table(s) of ENV_WHITELIST.md."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise GuardsConfigError(f"{path}: env whitelist not found; create it or fix [ssot] env_whitelist") from err
    except (OSError, UnicodeDecodeError) as err:
        raise GuardsConfigError(f"{path}: cannot read the env whitelist ({err})") from err
    names: set[str] = set()
    prefixes: list[str] = []
    row_in_table = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("|"):
            row_in_table = 0
            continue
        row_in_table += 1
        first = line.strip("|").split("|")[0].strip()
        if row_in_table == 1 or _SEPARATOR_CELL.fullmatch(first):
            continue  # the header row and the |---| row
        match = re.fullmatch(r"`([^`]*)`", first)
        if not match or not _ENV_NAME.fullmatch(match.group(1)):
            raise GuardsConfigError(
                f"{path}:{lineno}: first column {first!r} is not a variable name in backticks; "
                "write it as `NAME` (a trailing * matches any suffix)")
        name = match.group(1)
        if name.endswith("*"):
            prefixes.append(name[:-1])
        else:
            names.add(name)
    if not names and not prefixes:
        raise GuardsConfigError(f"{path}: no table rows with a `NAME` in the first column; the whitelist is empty or malformed")
    return EnvWhitelist(frozenset(names), tuple(prefixes))


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise GuardsConfigError(f"{where}: `{key}` must be a table")
    return value


def _unknown_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise GuardsConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _str_list(value: Any, where: str, pattern: re.Pattern[str] | None = _DOTTED) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GuardsConfigError(f"{where} must be a list of strings")
    for v in value:
        if pattern is not None and not pattern.fullmatch(v):
            raise GuardsConfigError(f"{where}: {v!r} is not a dotted module name")
    return tuple(value)


def _load_layers(package: str, table: dict[str, Any], where: str) -> LayerMap:
    _unknown_keys(table, {"layers"}, where)
    if "layers" not in table:
        raise GuardsConfigError(f"{where}: missing `layers` (a list of lists of dotted module prefixes, lowest first)")
    raw = table["layers"]
    if not isinstance(raw, list) or not raw:
        raise GuardsConfigError(f"{where}.layers must be a non-empty list of lists of module prefixes")
    layers = tuple(_str_list(layer, f"{where}.layers[{i}]") for i, layer in enumerate(raw))
    seen: set[str] = set()
    for layer in layers:
        for entry in layer:
            if entry != package and not entry.startswith(package + "."):
                raise GuardsConfigError(f"{where}: {entry!r} is not inside package {package!r}")
            if entry in seen:
                raise GuardsConfigError(f"{where}: {entry!r} is listed in more than one place")
            seen.add(entry)
    return LayerMap(package, layers)


def load_config(path: Path) -> GuardsConfig:
    path = path.resolve()
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as err:
        raise GuardsConfigError(f"{path}: not found; pass --config PATH to an existing {CONFIG_NAME}") from err
    except OSError as err:
        raise GuardsConfigError(f"{path}: cannot read ({err})") from err
    except tomllib.TOMLDecodeError as err:
        raise GuardsConfigError(f"{path}: not valid TOML ({err}); fix the syntax") from err
    _unknown_keys(data, {"ssot", "dag", "public-surface", "isolation", "exec-route", "recognition"}, str(path))

    ssot = _table(data, "ssot", str(path))
    _unknown_keys(ssot, {"env_whitelist", "env_modules"}, f"{path} [ssot]")
    if not isinstance(ssot.get("env_whitelist"), str):
        raise GuardsConfigError(f"{path} [ssot]: set env_whitelist = \"ENV_WHITELIST.md\" (path relative to {path.name})")
    env_modules = _table(ssot, "env_modules", f"{path} [ssot]")
    for package, module in env_modules.items():
        if not isinstance(module, str) or not module.endswith(".py") or module.startswith("/"):
            raise GuardsConfigError(f"{path} [ssot] env_modules.{package}: give a relative path to a .py file")
    whitelist_path = path.parent / ssot["env_whitelist"]

    dag = _table(data, "dag", str(path))
    forbidden_raw = _table(dag, "forbidden", f"{path} [dag]")
    forbidden = {pkg: _str_list(v, f"{path} [dag] forbidden.{pkg}") for pkg, v in forbidden_raw.items()}
    layers = {}
    for package, table in dag.items():
        if package == "forbidden":
            continue
        if not isinstance(table, dict):
            raise GuardsConfigError(f"{path} [dag]: `{package}` must be a table [dag.{package}] with `layers`")
        layers[package] = _load_layers(package, table, f"{path} [dag.{package}]")

    surface = _table(data, "public-surface", str(path))
    _unknown_keys(surface, {"allow_private"}, f"{path} [public-surface]")
    allow_private = _str_list(surface.get("allow_private", []), f"{path} [public-surface] allow_private",
                              re.compile(r"[A-Za-z0-9_.]+\*?"))

    isolation = _table(data, "isolation", str(path))
    where = f"{path} [isolation]"
    _unknown_keys(isolation, {"packages", "forbidden_imports", "argv_modules", "loader_modules", "settable"}, where)
    files = re.compile(r"[^/].*\.py")
    settings = IsolationSettings(
        packages=_str_list(isolation.get("packages", []), f"{where} packages"),
        forbidden_imports=_str_list(isolation.get("forbidden_imports", []), f"{where} forbidden_imports"),
        argv_modules=_str_list(isolation.get("argv_modules", []), f"{where} argv_modules (relative .py paths)", files),
        loader_modules=_str_list(isolation.get("loader_modules", []), f"{where} loader_modules (relative .py paths)", files),
        settable=_str_list(isolation.get("settable", []), f"{where} settable"))

    routes = _table(data, "exec-route", str(path))
    where = f"{path} [exec-route]"
    _unknown_keys(routes, {"packages", "data_suffixes"}, where)
    exec_route = ExecRouteSettings(
        packages=_str_list(routes.get("packages", []), f"{where} packages"),
        data_suffixes=_str_list(routes.get("data_suffixes", []), f"{where} data_suffixes (suffixes such as \".toml\")",
                                re.compile(r"\.[a-z0-9]+")))
    if ".py" in exec_route.data_suffixes or any(s in CODE_SUFFIXES for s in exec_route.data_suffixes):
        raise GuardsConfigError(f"{where} data_suffixes: {', '.join(s for s in exec_route.data_suffixes if s == '.py' or s in CODE_SUFFIXES)} "
                                "is code Python can load, not data; remove it")

    recognition = _table(data, "recognition", str(path))
    where = f"{path} [recognition]"
    _unknown_keys(recognition, {"packages", *FAMILIES}, where)
    recognition_settings = RecognitionSettings(
        packages=_str_list(recognition.get("packages", []), f"{where} packages"),
        allowed={family: _str_list(recognition.get(family, []), f"{where} {family} (relative .py paths)", files)
                 for family in FAMILIES})

    return GuardsConfig(path=path, root=path.parent, whitelist_path=whitelist_path,
                        whitelist=parse_whitelist(whitelist_path), env_modules=dict(env_modules),
                        layers=layers, forbidden=forbidden, allow_private=allow_private, isolation=settings,
                        exec_route=exec_route, recognition=recognition_settings)
