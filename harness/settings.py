"""The only module of the harness that reads environment variables (names in ENV_WHITELIST.md).

API keys are read here on demand and handed to SDK clients in memory; they are never stored in a
record, a log or a config file.
"""

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["temper_home", "runs_dir", "data_dir", "api_key", "base_url", "no_color", "child_env", "python_path",
           "torch_caches_while"]

_KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
_URLS = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}
_REPLACED: dict[str, str | None] = {}  # while torch_caches_while runs: the values it replaced (None: unset)


def temper_home() -> Path:
    """Folder holding milestones/, prompts/ and runs/: TEMPER_HOME, else the checkout this file is in."""
    home = os.environ.get("TEMPER_HOME", "")
    return Path(home).resolve() if home else Path(__file__).resolve().parent.parent


def runs_dir() -> Path:
    override = os.environ.get("TEMPER_RUNS_DIR", "")
    return Path(override).resolve() if override else temper_home() / "runs"


def data_dir(home: Path) -> Path:
    """The shared data folder jobs read (`{data}` in a job's argv): TEMPER_DATA, else ../shared/data beside
    the judge's home. The judge resolves it, so candidate code never chooses what data it is judged on."""
    override = os.environ.get("TEMPER_DATA", "")
    return Path(override).resolve() if override else (Path(home).resolve().parent / "shared" / "data")


def api_key(provider: str) -> str:
    """The provider's API key from the environment, or "" when unset."""
    if provider == "anthropic":
        return os.environ.get("ANTHROPIC_API_KEY", "")
    if provider == "openai":
        return os.environ.get("OPENAI_API_KEY", "")
    raise ValueError(f"unknown provider {provider!r}; expected one of {sorted(_KEYS)}")


def base_url(provider: str) -> str:
    if provider == "anthropic":
        return os.environ.get("ANTHROPIC_BASE_URL", "")
    if provider == "openai":
        return os.environ.get("OPENAI_BASE_URL", "")
    raise ValueError(f"unknown provider {provider!r}; expected one of {sorted(_URLS)}")


def no_color() -> bool:
    return bool(os.environ.get("NO_COLOR", ""))


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return name in _KEYS.values() or upper.endswith(("_API_KEY", "_TOKEN")) or "SECRET" in upper


def python_path() -> list[str]:
    """This process's PYTHONPATH entries: libraries the user put there (e.g. kernel wheels unpacked outside
    site-packages) must reach the jobs the judge starts, after the judged checkout."""
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def child_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a job the harness launches: this process's environment plus `overrides`.

    Secrets are left out (the provider API keys and any *_API_KEY, *_TOKEN or *_SECRET* variable):
    jobs and the agent's shell run code an agent wrote, and a key printed into a log would reach
    disk. An override may still set one deliberately.
    """
    # guard: allow ssot -- child processes (jobs, the agent's shell) inherit the environment minus secrets
    env = {name: value for name, value in os.environ.items() if not _is_secret(name)}
    for name, value in _REPLACED.items():  # the user's own values, not the judge's caches (torch_caches_while)
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env.update(overrides or {})
    return env


@contextlib.contextmanager
def torch_caches_while(triton: str, inductor: str) -> Iterator[None]:
    """This process's TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR while the block runs, restored after: torch reads
    them lazily in this process (the judge's own, while it judges). Its children get the replaced values back
    (child_env): the judge's caches are its own."""
    saved_triton, saved_inductor = os.environ.get("TRITON_CACHE_DIR"), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    _REPLACED.update({"TRITON_CACHE_DIR": saved_triton, "TORCHINDUCTOR_CACHE_DIR": saved_inductor})
    os.environ["TRITON_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"] = triton, inductor
    try:
        yield
    finally:
        _REPLACED.clear()
        if saved_triton is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved_triton
        if saved_inductor is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_inductor
