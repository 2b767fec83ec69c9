"""Which implementation of each hot op a run uses, and loading it.

Why and how: docs/engine/ops.md, section `engine/ops/dispatch.py`.
"""

import importlib
import inspect
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.env import op_override
from engine.errors import ConfigError, KernelLoadError, KernelRegistryError

__all__ = [
    "OP_NAMES",
    "FP8_OPS",
    "DEVICES",
    "OPS_ROOT",
    "KernelVersion",
    "Register",
    "OpSet",
    "register_path",
    "FP8_CAPABILITIES",
    "check_fp8",
    "load_register",
    "resolve_version",
    "load_op",
    "resolve_ops",
    "DOCUMENT_KEYWORDS",
    "takes_documents",
    "check_documents",
]

OP_NAMES = ("attention", "rmsnorm", "gemm_fc1", "gemm_output", "rope")
# Ops only --fp8 runs call (resolved only then): the cast of an FP8 GEMM operand and the FP8 weight-gradient GEMM
# accumulated into the fp32 gradient (engine/distributed/fp8.py).
FP8_OPS = ("fp8_cast", "fp8_wgrad")
DEVICES = ("cpu", "cuda")
OPS_ROOT = Path(__file__).resolve().parent

_VERSION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_OP_KEYS = ("name", "description", "env", "default", "fp8_default")
_VERSION_KEYS = ("entry", "devices", "requires", "description", "fp8")
# What a version's `fp8` key may list: the --fp8 recipes it runs, and fast-accum where its forward GEMM can accumulate
# at the FP8 tensor cores' precision (--fp8-fast-accum). No key: everything its `fp8` keyword is passed.
FP8_CAPABILITIES = ("tensorwise", "rowwise", "fast-accum")


@dataclass(kw_only=True, frozen=True)
class KernelVersion:
    """One `[versions.<name>]` table of a register."""

    name: str
    entry: str
    devices: tuple[str, ...]
    requires: tuple[str, ...]
    description: str
    fp8: tuple[str, ...] | None = None  # what of --fp8 it runs (FP8_CAPABILITIES); None: all of it


@dataclass(kw_only=True, frozen=True)
class Register:
    """A validated `register.toml`."""

    op: str
    description: str
    env: str
    default: str
    versions: dict[str, KernelVersion]
    path: Path
    fp8_default: str | None = None  # the CUDA version of a --fp8 run that names none (the default has no FP8 path)


@dataclass(kw_only=True, frozen=True)
class OpSet:
    """The op callables a run uses, and which version each one is (for the run header)."""

    attention: Callable[..., Any]
    rmsnorm: Callable[..., Any]
    gemm_fc1: Callable[..., Any]
    gemm_output: Callable[..., Any]
    rope: Callable[..., Any]
    versions: dict[str, str]
    fp8_cast: Callable[..., Any] | None = None  # only with --fp8
    fp8_wgrad: Callable[..., Any] | None = None  # only with --fp8


def _check_op(op: str) -> None:
    if op not in OP_NAMES + FP8_OPS:
        raise ConfigError("op", op, f"use one of: {', '.join(OP_NAMES + FP8_OPS)}", "is not a known op")


def register_path(op: str, ops_root: Path | None = None) -> Path:
    """Where the register of `op` lives (`ops_root` lets tests point at a temporary tree)."""
    _check_op(op)
    return (ops_root if ops_root is not None else OPS_ROOT) / op / "register.toml"


def _str_field(table: dict[str, Any], key: str, where: str, path: str, example: str) -> str:
    if key not in table:
        raise KernelRegistryError(path, where, f"has no key {key!r}", f"add {key} = {example}")
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise KernelRegistryError(path, f"{where}.{key}", f"is {value!r}, not a non-empty string", f"set {key} = {example}")
    return value


def _str_list(table: dict[str, Any], key: str, where: str, path: str, example: str) -> list[str]:
    if key not in table:
        raise KernelRegistryError(path, where, f"has no key {key!r}", f"add {key} = {example}")
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise KernelRegistryError(path, f"{where}.{key}", f"is {value!r}, not a list of strings", f"set {key} = {example}")
    return value


def _unknown_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str, path: str) -> None:
    # A typo such as `device = [...]` must not silently leave the real key at a default.
    extra = sorted(set(table) - set(allowed))
    if extra:
        raise KernelRegistryError(path, where, f"has unknown key(s) {', '.join(extra)}", f"use only: {', '.join(allowed)}")


def _parse_version(name: str, table: Any, path: str) -> KernelVersion:
    where = f"versions.{name}"
    if not _VERSION_NAME.match(name):
        raise KernelRegistryError(path, where, "has an invalid version name", "use lowercase letters, digits, '_' and '-'")
    if not isinstance(table, dict):
        raise KernelRegistryError(path, where, f"is {table!r}, not a table", f"write it as a [{where}] table")
    _unknown_keys(table, _VERSION_KEYS, where, path)
    entry = _str_field(table, "entry", where, path, '"package.module:function"')
    if not _ENTRY.match(entry):
        raise KernelRegistryError(path, f"{where}.entry", f"is {entry!r}, not 'package.module:function'",
                                  'write e.g. entry = "engine.ops.attention.baseline:attention"')
    devices = _str_list(table, "devices", where, path, '["cpu", "cuda"]')
    bad = [d for d in devices if d not in DEVICES]
    if not devices or bad:
        raise KernelRegistryError(path, f"{where}.devices", f"is {devices!r}",
                                  f"list one or more of: {', '.join(repr(d) for d in DEVICES)}")
    requires = _str_list(table, "requires", where, path, '[] or ["flash_attn.cute"]')
    for module in requires:
        if not _MODULE.match(module):
            raise KernelRegistryError(path, f"{where}.requires", f"has {module!r}, not a dotted module name",
                                      'write e.g. requires = ["flash_attn.cute"]')
    description = _str_field(table, "description", where, path, '"what this version is"')
    fp8 = None
    if "fp8" in table:
        fp8 = _str_list(table, "fp8", where, path, '["tensorwise"]')
        if not fp8 or set(fp8) - set(FP8_CAPABILITIES) or not set(fp8) & {"tensorwise", "rowwise"}:
            raise KernelRegistryError(path, f"{where}.fp8", f"is {fp8!r}",
                                      f"list the recipes it runs (tensorwise, rowwise) and fast-accum where its forward "
                                      f"GEMM can accumulate fast, or leave the key out (all of them)")
    return KernelVersion(name=name, entry=entry, devices=tuple(devices), requires=tuple(requires), description=description,
                         fp8=None if fp8 is None else tuple(fp8))


def load_register(op: str, ops_root: Path | None = None) -> Register:
    """Read and validate `<ops_root>/<op>/register.toml`; every problem raises KernelRegistryError."""
    file = register_path(op, ops_root)
    path = str(file)
    if not file.is_file():
        raise KernelRegistryError(path, "op", "does not exist", f"create it with an [op] table and a [versions.baseline] table for op {op!r}")
    try:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise KernelRegistryError(path, "file", f"is not valid TOML ({err})", "fix the TOML syntax") from err

    _unknown_keys(data, ("op", "versions"), "top level", path)
    head = data.get("op")
    if not isinstance(head, dict):
        raise KernelRegistryError(path, "op", "is missing or not a table", f'add an [op] table with name = "{op}", description, env, default')
    _unknown_keys(head, _OP_KEYS, "op", path)
    name = _str_field(head, "name", "op", path, f'"{op}"')
    if name != op:
        raise KernelRegistryError(path, "op.name", f"is {name!r} but the folder is {op!r}", f'set name = "{op}"')
    description = _str_field(head, "description", "op", path, '"what the op computes"')
    env = _str_field(head, "env", "op", path, f'"TEMPER_OP_{op.upper()}"')
    if env != f"TEMPER_OP_{op.upper()}":
        # engine.env.op_override reads exactly this name; a register naming another would lie.
        raise KernelRegistryError(path, "op.env", f"is {env!r}, not the variable engine/env.py reads", f'set env = "TEMPER_OP_{op.upper()}"')
    default = _str_field(head, "default", "op", path, '"baseline"')

    tables = data.get("versions")
    if not isinstance(tables, dict) or not tables:
        raise KernelRegistryError(path, "versions", "is missing or empty", "add at least a [versions.baseline] table")
    versions = {vname: _parse_version(vname, table, path) for vname, table in tables.items()}

    known = ", ".join(versions)
    if default not in versions:
        raise KernelRegistryError(path, "op.default", f"is {default!r}, which is not among the versions ({known})",
                                  f"set default to one of: {known}, or add a [versions.{default}] table")
    if "cuda" not in versions[default].devices:
        raise KernelRegistryError(path, "op.default", f"is {default!r}, whose devices do not include 'cuda'",
                                  "choose a default that runs on cuda (the default is the CUDA choice; CPU uses baseline)")
    if "baseline" not in versions or "cpu" not in versions["baseline"].devices:
        raise KernelRegistryError(path, "versions.baseline", "is missing or does not list 'cpu'",
                                  'add [versions.baseline] with devices = ["cpu", "cuda"]: CPU runs resolve to it')
    fp8_default = _str_field(head, "fp8_default", "op", path, '"baseline"') if "fp8_default" in head else None
    if fp8_default is not None and (fp8_default not in versions or "cuda" not in versions[fp8_default].devices):
        raise KernelRegistryError(path, "op.fp8_default", f"is {fp8_default!r}, which is not a version that runs on "
                                  f"cuda ({known})", "set fp8_default to one of them, or leave it out")
    return Register(op=op, description=description, env=env, default=default, versions=versions, path=file,
                    fp8_default=fp8_default)


def _requested(op: str, cfg_value: str) -> tuple[str, str]:
    """(version, where it came from as a user would name it), or ("", "") when nothing was asked."""
    from_env = op_override(op)
    if from_env:
        return from_env, f"TEMPER_OP_{op.upper()}"
    if cfg_value:
        return cfg_value, f"--op-{op.replace('_', '-')}"
    return "", ""


def _unknown_version(reg: Register, version: str, source: str) -> ConfigError:
    known = ", ".join(reg.versions)
    return ConfigError(source, version, f"use one of: {known} (listed in {reg.path})", f"is not a version of op {reg.op!r}")


def resolve_version(op: str, cfg_value: str, device_type: str, *, ops_root: Path | None = None,
                    fp8: bool = False) -> str:
    """The version of `op` a run on `device_type` uses: env > config value > register default (on CUDA with `fp8`,
    a --fp8 run, the register's fp8_default where it has one: the CUDA default of gemm_fc1 has no FP8 path).

    Raises ConfigError for an unknown version name (listing the known ones) and for a requested
    version that cannot run on the device (naming op, version, device and the fix).
    """
    if device_type not in DEVICES:
        raise ConfigError("device", device_type, f"use one of: {', '.join(DEVICES)}", "has no kernel versions")
    reg = load_register(op, ops_root)
    version, source = _requested(op, cfg_value)
    if not version:
        if device_type != "cuda":
            return "baseline"
        return reg.fp8_default if fp8 and reg.fp8_default else reg.default
    if version not in reg.versions:
        raise _unknown_version(reg, version, source)
    devices = reg.versions[version].devices
    if device_type not in devices:
        runs_here = ", ".join(v.name for v in reg.versions.values() if device_type in v.devices)
        raise ConfigError(
            source, version,
            f"unset {source} or choose a version that runs on {device_type} ({runs_here}), or run on {'/'.join(devices)}",
            f"(op {op!r}) runs only on {', '.join(devices)}, not on {device_type}")
    return version


def load_op(op: str, version: str, *, ops_root: Path | None = None) -> Callable[..., Any]:
    """Import `version` of `op` (its `requires` first, then its entry) and return the op callable.

    Any failure raises KernelLoadError naming op, version and the import error; never a fallback.
    """
    reg = load_register(op, ops_root)
    if version not in reg.versions:
        raise _unknown_version(reg, version, f"op {op}")
    spec = reg.versions[version]
    fix = f"install what {spec.entry} needs (pyproject extra 'gpu' for CuTeDSL versions) or choose another version with --op-{op.replace('_', '-')} / TEMPER_OP_{op.upper()}"
    for module in spec.requires:
        try:
            importlib.import_module(module)
        # Kernel libraries fail at import with more than ImportError (quack 0.6.5 raises
        # TypeError); each is re-raised with its op and version, never swallowed.
        except Exception as err:  # re-raised with op and version
            raise KernelLoadError(op, version, spec.entry, f"required module {module!r}: {type(err).__name__}: {err}", fix) from err
    module_name, func_name = spec.entry.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # re-raised with op and version
        raise KernelLoadError(op, version, spec.entry, f"{type(err).__name__}: {err}", fix) from err
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise KernelLoadError(op, version, spec.entry, f"module {module_name!r} has no callable {func_name!r}",
                              f"define {func_name} in {module_name} or fix entry in {reg.path}")
    return func


DOCUMENT_KEYWORDS = ("cu_seqlens", "max_seqlen")


def takes_documents(fn: Callable[..., Any]) -> bool:
    """Whether an attention version names the contract's document-boundary keywords (keyword-only)."""
    params = inspect.signature(fn).parameters
    return all(name in params and params[name].kind is inspect.Parameter.KEYWORD_ONLY for name in DOCUMENT_KEYWORDS)


def check_documents(cfg: EngineConfig, version: str, fn: Callable[..., Any], *, ops_root: Path | None = None) -> None:
    """Raise ConfigError when --document-mask is on and attention version `fn` cannot take the boundaries."""
    if not cfg.document_mask or takes_documents(fn):
        return
    entry = load_register("attention", ops_root).versions[version].entry
    raise ConfigError("--document-mask", True,
                      "choose a version that takes them with --op-attention (baseline does; engine/ops/README.md "
                      "lists the others), or run without --document-mask",
                      f"needs document boundaries (keywords {', '.join(DOCUMENT_KEYWORDS)}), which attention "
                      f"version {version!r} ({entry}) does not take")


def check_fp8(cfg: EngineConfig, version: str, fn: Callable[..., Any], runs: tuple[str, ...] | None = None) -> None:
    """Raise ConfigError when --fp8 is on and gemm_fc1 version `fn` has no FP8 path (no keyword-only `fp8`): FC1 would
    silently stay in bf16 while the run reports FP8; with tensorwise, when it takes no keyword-only `amax` (the layer
    passes it: a TypeError at the first step otherwise); or when its register entry's `fp8` (`runs`) leaves out the
    recipe or the fast accumulation the run asks for: FC1 would silently run another."""
    if cfg.fp8 == "off":
        return
    param = inspect.signature(fn).parameters.get("fp8")
    if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY:
        raise ConfigError("--op-gemm-fc1", version,
                          "pass --op-gemm-fc1 compiled (or baseline) with --fp8, or leave out --fp8",
                          f"has no FP8 path (engine/ops/gemm_fc1/register.toml: the `fp8` keyword), and --fp8 "
                          f"{cfg.fp8} asks for one")
    amax = inspect.signature(fn).parameters.get("amax")
    if cfg.fp8 == "tensorwise" and (amax is None or amax.kind is not inspect.Parameter.KEYWORD_ONLY):
        raise ConfigError("--op-gemm-fc1", version, "pass --op-gemm-fc1 triton (or baseline), or give the version "
                          "the keyword", f"takes no `amax` keyword (engine/ops/gemm_fc1/register.toml), which --fp8 "
                          f"tensorwise passes: FC2's input cast asks gemm_fc1 for its output's amax")
    if runs is not None and cfg.fp8 not in runs:
        recipes = " or ".join(r for r in runs if r != "fast-accum")
        raise ConfigError("--fp8", cfg.fp8, f"pass --fp8 {recipes}, or --op-gemm-fc1 compiled (or baseline)",
                          f"is a recipe gemm_fc1 {version} does not run (engine/ops/gemm_fc1/register.toml: fp8 = "
                          f"{list(runs)})")
    if runs is not None and cfg.fp8_fast_accum and "fast-accum" not in runs:
        raise ConfigError("--fp8-fast-accum", True, "leave out --fp8-fast-accum, or pass --op-gemm-fc1 compiled",
                          f"asks FC1's forward GEMM to accumulate fast, which gemm_fc1 {version}'s FP8 GEMM cannot "
                          f"(engine/ops/gemm_fc1/register.toml: fp8 = {list(runs)})")


def resolve_ops(cfg: EngineConfig, device: torch.device | str, *, ops_root: Path | None = None) -> OpSet:
    """Resolve and load every op for a run on `device` (config fields op_<op>, env overrides)."""
    device_type = torch.device(device).type
    versions: dict[str, str] = {}
    funcs: dict[str, Callable[..., Any]] = {}
    for op in OP_NAMES:
        versions[op] = resolve_version(op, getattr(cfg, f"op_{op}"), device_type, ops_root=ops_root,
                                       fp8=cfg.fp8 != "off")
        funcs[op] = load_op(op, versions[op], ops_root=ops_root)
    check_documents(cfg, versions["attention"], funcs["attention"], ops_root=ops_root)
    check_fp8(cfg, versions["gemm_fc1"], funcs["gemm_fc1"],
              load_register("gemm_fc1", ops_root).versions[versions["gemm_fc1"]].fp8)
    if cfg.fp8 != "off":
        for op in FP8_OPS:
            versions[op] = resolve_version(op, getattr(cfg, f"op_{op}"), device_type, ops_root=ops_root)
            funcs[op] = load_op(op, versions[op], ops_root=ops_root)
    return OpSet(versions=versions, **funcs)
