"""The configuration a milestone's job asked for, as the BASE commit defines it, never the candidate.

A job's claims (its config.json, its checkpoint's meta.json) say what it ran; the judge needs what it
was asked to run: the base commit's EngineConfig defaults, overlaid with the preset its `--preset`
names in the base commit's engine/model_spec.toml, overlaid with the flags of the argv the judge
rendered. The defaults are read from the base's engine/config.py with `ast` (literals of the
`field: type = _f(default, help, group)` lines): nothing of the engine is imported or run.
"""

import ast
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ConfigUnknown", "base_file", "engine_defaults", "flag_values", "expected_config", "load_base"]


class ConfigUnknown(ValueError):
    """The judge cannot tell what the job was asked to run (the message says why)."""


def base_file(repo: Path, base: str, path: str) -> bytes | None:
    """A file as the base commit has it (None when it does not exist there)."""
    proc = subprocess.run(["git", "-C", str(repo), "show", f"{base}:{path}"], capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def engine_defaults(config_source: str) -> dict[str, Any]:
    """{field: default} of `class EngineConfig` in the source of engine/config.py."""
    tree = ast.parse(config_source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineConfig"), None)
    if cls is None:
        raise ConfigUnknown("the base commit's engine/config.py has no class EngineConfig")
    out: dict[str, Any] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            continue
        value = node.value
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        try:
            out[node.target.id] = ast.literal_eval(value)
        except ValueError:
            continue  # a computed default: not one the judge can state
    return out


def flag_values(argv: Sequence[str]) -> dict[str, str | bool]:
    """`--name value`, `--name=value` and bare `--flag` / `--no-flag` of an argv (last one wins)."""
    out: dict[str, str | bool] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        if sep:
            out[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
        elif name.startswith("no-"):
            out[name[3:]] = False
        else:
            out[name] = True
    return out


def _coerce(name: str, raw: str | bool, default: Any) -> Any:
    if isinstance(default, bool) or isinstance(raw, bool):
        return raw if isinstance(raw, bool) else raw.lower() in ("1", "true", "yes")
    try:
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise ConfigUnknown(f"--{name.replace('_', '-')} {raw!r} in the job's argv is not a number") from None
    return raw


def expected_config(argv: Sequence[str], *, defaults: Mapping[str, Any], presets: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults < preset < argv flags, the same precedence as the engine's CLI (minus --config files,
    which the judge cannot vouch for and refuses)."""
    flags = flag_values(argv)
    if "config" in flags:
        raise ConfigUnknown("the job's argv passes --config; the judge states expected configs from flags only")
    config = dict(defaults)
    preset = flags.get("preset")
    if isinstance(preset, str):
        if preset not in presets:
            raise ConfigUnknown(f"preset {preset!r} is not in the base commit's engine/model_spec.toml")
        config.update(presets[preset])
        config["preset"] = preset
    for flag, raw in flags.items():
        name = flag.replace("-", "_")
        if name in defaults:
            config[name] = _coerce(name, raw, defaults[name])
    return config


def load_base(repo: Path, base: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(EngineConfig defaults, presets) of the base commit; empty when it has no engine."""
    source = base_file(repo, base, "engine/config.py")
    spec = base_file(repo, base, "engine/model_spec.toml")
    defaults = engine_defaults(source.decode("utf-8")) if source is not None else {}
    presets = tomllib.loads(spec.decode("utf-8")) if spec is not None else {}
    return defaults, presets
