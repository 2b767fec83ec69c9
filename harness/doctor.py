"""`temper doctor [--requires gpu,slurm,llm,multi-node,data] [--json]`: can this machine do what you are about to ask?

Every check runs every time; `--requires` decides which ones must pass (the base ones always do: Python, torch and
the engine, a git checkout, pytest, the sandbox). The others are shown for information. Exit 0 when every required
check passes, 1 when one fails (one line each: what, why, the fix), 2 on bad usage.

The facts come from the parts that use them, never from a second copy: the engine's own report of what it runs on
(`python -m engine env --json`, the same code as every run header, in a process of this checkout's engine), the
judge's view of the machine (harness/judge/hardware.py: nvidia-smi, sinfo), its sandbox probe
(harness/jobs/sandbox.py), the harness settings (API keys, the data folder), the kernel pins of pyproject.toml.
API keys are only ever said to be "set" or "missing".
"""

import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["REQUIREMENTS", "Check", "run_checks", "main"]

REQUIREMENTS = ("gpu", "slurm", "llm", "multi-node", "data")
KERNEL_LIBS = ("nvidia-cutlass-dsl", "quack-kernels", "flash-attn-4")
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found (never a secret)
    fix: str = ""  # what to do when not ok
    needed_by: tuple[str, ...] = ()  # "base" (always required) and/or the --requires names that require it


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str] | None:
    """A short command's result, or None when it cannot start or hangs."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL, **kw)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _pyproject(home: Path) -> dict[str, Any]:
    path = home / "pyproject.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _engine_env(home: Path) -> tuple[dict[str, Any] | None, str]:
    """The engine's own report (`python -m engine env --json`) from this checkout, or None and why not."""
    from harness.settings import child_env, python_path

    env = child_env({"PYTHONPATH": os.pathsep.join([str(home), *python_path()])})
    proc = _run([sys.executable, "-m", "engine", "env", "--json"], cwd=home, env=env)
    if proc is None:
        return None, f"`python -m engine env` did not finish within {_TIMEOUT_S:g} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return None, f"`python -m engine env` failed: {last}"
    return json.loads(proc.stdout), ""


def _python(project: dict[str, Any]) -> Check:
    spec = project.get("project", {}).get("requires-python", ">=3.11")
    need = tuple(int(part) for part in spec.removeprefix(">=").split("."))
    have = sys.version_info[:len(need)]
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("python", have >= need, f"{version} ({spec})",
                 f"use Python {spec.removeprefix('>=')} or newer (pyenv, uv python install, or the system package)",
                 ("base",))


def _torch(engine: dict[str, Any] | None, why: str) -> Check:
    fix = "pip install torch==2.13.0 -e . (CPU), or keep your CUDA build of torch >= 2.4 on a GPU machine"
    if engine is None:
        return Check("torch", False, f"the engine does not start: {why}", fix, ("base",))
    major_minor = tuple(int(p) for p in engine["torch"].split("+")[0].split(".")[:2])
    sha, _, dirty = engine["git"].partition("+")
    return Check("torch", major_minor >= (2, 4), f"torch {engine['torch']}, CUDA {engine['cuda']}, engine at "
                 f"{sha[:12]}{' with local changes' if dirty else ''}", fix, ("base",))


def _gpu(engine: dict[str, Any] | None, smi_gpus: tuple[str, ...]) -> Check:
    needed = ("gpu", "multi-node")
    gpus = engine["gpus"] if engine else []
    smi = f"nvidia-smi sees {len(smi_gpus)}" if smi_gpus else "nvidia-smi sees none"
    if gpus:
        names = ", ".join(f"{gpus.count(n)} x {n}" for n in dict.fromkeys(gpus))
        if not smi_gpus:
            return Check("gpu", False, f"torch sees {names} but nvidia-smi does not (the judge counts GPUs with it)",
                         "put nvidia-smi (the NVIDIA driver utilities) on PATH", needed)
        return Check("gpu", True, f"{names} (CUDA {engine['cuda'] if engine else '?'}); {smi}", needed_by=needed)
    if engine and engine["cuda"] == "none":
        why = f"torch {engine['torch']} is a CPU build"
        fix = "install a CUDA build of torch (any >= 2.4) on a machine with an NVIDIA GPU and its driver"
    else:
        why = "no CUDA device is visible to torch"
        fix = "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
    return Check("gpu", False, f"no GPU: {why}; {smi}", fix, needed)


def _kernels(engine: dict[str, Any] | None, project: dict[str, Any]) -> Check:
    pins = {}
    for req in project.get("project", {}).get("optional-dependencies", {}).get("gpu", []):
        name, _, version = req.partition("==")
        pins[name.strip()] = version.strip()
    libs = engine["libs"] if engine else {}
    parts, missing = [], []
    for name in KERNEL_LIBS:
        have = libs.get(name, "absent")
        if have == "absent":
            missing.append(name)
        pin = pins.get(name, "")
        parts.append(f"{name} {have}" + (f" (pinned {pin})" if pin and have not in ("absent", pin) else ""))
    return Check("kernels", not missing, ", ".join(parts),
                 f"pip install -e '.[gpu]' (the pinned CuTeDSL libraries: {', '.join(missing)} missing), or run plain "
                 "torch with --op-attention baseline --op-rmsnorm baseline --op-gemm-fc1 baseline --op-gemm-output baseline --op-rope baseline",
                 ("gpu",))


def _nccl(engine: dict[str, Any] | None) -> Check:
    version = engine["nccl"] if engine else "none"
    return Check("nccl", version != "none", f"NCCL {version}" if version != "none" else "no NCCL (a CPU build of torch, or no GPU)",
                 "multi-node and multi-GPU runs need a CUDA build of torch with NCCL (the PyPI CUDA wheels have it)",
                 ("multi-node",))


def _slurm(answers: bool, home: Path) -> tuple[Check, int]:
    """The SLURM check and the number of nodes in partitions that are up."""
    fix = "run on a SLURM login node (sinfo and sbatch on PATH, slurmctld answering)"
    local = home.parent / "shared" / "slurm" / "start-local-slurm"  # a test cluster script, where this machine has one
    if local.is_file():
        fix += f"; for a single-node test cluster on this machine: {local}"
    tools = [t for t in ("sinfo", "sbatch") if shutil.which(t) is None]
    if tools:
        return Check("slurm", False, f"{' and '.join(tools)} not on PATH", fix, ("slurm", "multi-node")), 0
    if not answers:
        return Check("slurm", False, "sinfo and sbatch are here but no controller answers (sinfo -h fails)", fix,
                     ("slurm", "multi-node")), 0
    proc = _run(["sinfo", "-h", "-o", "%P|%a|%D|%T"])
    rows = [line.split("|") for line in (proc.stdout.splitlines() if proc and proc.returncode == 0 else []) if line.count("|") == 3]
    nodes = sum(int(d) for _, a, d, _ in rows if a == "up" and d.isdigit())
    said = "; ".join(f"partition {p} {a}, {d} node(s) {t}" for p, a, d, t in rows) or "no partitions listed"
    return Check("slurm", True, said, needed_by=("slurm", "multi-node")), nodes


def _account() -> Check:
    user = pwd.getpwuid(os.getuid()).pw_name
    if shutil.which("sacctmgr") is None:
        return Check("account", True, f"user {user}; sacctmgr not on PATH (sbatch uses the cluster's default account)")
    proc = _run(["sacctmgr", "-nP", "show", "assoc", f"where user={user}", "format=Account"])
    if proc is None or proc.returncode != 0:
        return Check("account", True, f"user {user}; accounting is not configured (sbatch uses the default account)")
    accounts = sorted({line.strip() for line in proc.stdout.splitlines() if line.strip()})
    return Check("account", bool(accounts), f"user {user}: account(s) {', '.join(accounts)}" if accounts else
                 f"user {user} has no SLURM account association", "ask the cluster's admins for an account (sacctmgr)")


def _nodes(count: int, home: Path) -> Check:
    # The sbatch scripts live in a Temper checkout, not in the installed package: name one only where it exists.
    script = home / "scripts" / "slurm" / "pretrain.sbatch"
    how = (f"sbatch --nodes=N {script} on a cluster, or torchrun --nnodes N on each host" if script.is_file() else
           "torchrun --nnodes N -m engine pretrain on each host (or from your own sbatch script)") + " (docs/parallelism.md)"
    return Check("nodes", count >= 2, f"{count} node(s) in SLURM partitions that are up",
                 f"multi-node runs need >= 2 nodes: {how}", ("multi-node",))


def _llm() -> Check:
    from harness.agents.cli_agents import ClaudeCodeAgent, CodexAgent
    from harness.settings import api_key

    parts, usable = [], []
    for provider, sdk in (("anthropic", "anthropic"), ("openai", "openai")):
        key = bool(api_key(provider))
        installed = importlib.util.find_spec(sdk) is not None
        parts.append(f"{provider.upper()}_API_KEY {'set' if key else 'missing'}, SDK {'installed' if installed else 'missing'}")
        if key and installed:
            usable.append(f"{provider}:MODEL")
    for agent in (ClaudeCodeAgent, CodexAgent):
        found = shutil.which(agent.executable) is not None
        parts.append(f"{agent.executable} CLI {'found' if found else 'not found'}")
        if found:
            usable.append(agent.name)
    detail = "; ".join(parts) + (f" -> usable: {', '.join(usable)}" if usable else "")
    return Check("llm", bool(usable), detail,
                 "export ANTHROPIC_API_KEY (or OPENAI_API_KEY) and pip install -e '.[llm]'; or install a coding-assistant "
                 f"CLI for --agent cli:claude-code ({ClaudeCodeAgent.install_hint}) or cli:codex ({CodexAgent.install_hint})",
                 ("llm",))


def _data(home: Path) -> Check:
    from harness.settings import data_dir

    root = data_dir(home)
    wanted = ("corpus", "tokenizers/minicpm4")
    present = [w for w in wanted if (root / w).is_dir()]
    if len(present) == len(wanted):
        return Check("data", True, f"{root} ({', '.join(present)})", needed_by=("data",))
    missing = [w for w in wanted if w not in present]
    where = f"{root} lacks {', '.join(missing)}" if root.is_dir() else f"{root} does not exist"
    return Check("data", False, f"{where} (the shared data folder the long-horizon and production milestones read)",
                 "set TEMPER_DATA to a folder holding corpus/ (parquet shards) and tokenizers/minicpm4/", ("data",))


def _git(home: Path) -> Check:
    from harness.session import UsageError, repo_head

    try:
        head = repo_head(home)
    except UsageError as err:
        return Check("git", False, str(err), "run temper from a git checkout of Temper, or set TEMPER_HOME to one",
                     ("base",))
    return Check("git", True, f"checkout {home} at {head[:12]}", needed_by=("base",))


def _pytest() -> Check:
    found = importlib.util.find_spec("pytest") is not None
    return Check("pytest", found, "installed (the judge's pytest gate runs it)" if found else "not installed",
                 "pip install -e . (pytest is a dependency of the judge)", ("base",))


def _sandbox() -> Check:
    from harness.jobs.sandbox import UNAVAILABLE_HINT, bwrap_binary, probe

    why = probe()
    if why is None:
        return Check("sandbox", True, f"bubblewrap {bwrap_binary()} starts", needed_by=("base",))
    return Check("sandbox", False, f"the judge cannot sandbox candidate code: {why}", UNAVAILABLE_HINT, ("base",))


def run_checks(home: Path) -> list[Check]:
    """Every check, in the order `temper doctor` prints them."""
    from harness.judge.hardware import probe_machine

    project = _pyproject(home)
    engine, why = _engine_env(home)
    machine = probe_machine()
    slurm, nodes = _slurm(machine.slurm, home)
    return [_python(project), _torch(engine, why), _git(home), _pytest(), _sandbox(), _gpu(engine, machine.gpus),
            _kernels(engine, project), _nccl(engine), slurm, _account(), _nodes(nodes, home), _llm(), _data(home)]


def _required(check: Check, requires: set[str]) -> bool:
    return "base" in check.needed_by or bool(requires & set(check.needed_by))


def main(requires_text: str, as_json: bool) -> int:
    from harness.settings import temper_home

    requires = {r.strip() for r in requires_text.split(",") if r.strip()}
    unknown = sorted(requires - set(REQUIREMENTS))
    if unknown:
        print(f"temper doctor: --requires {requires_text!r}: unknown {', '.join(map(repr, unknown))}; "
              f"choose from {','.join(REQUIREMENTS)}", file=sys.stderr)
        return 2
    checks = run_checks(temper_home())
    failed = [c for c in checks if not c.ok and _required(c, requires)]
    if as_json:
        print(json.dumps({"ok": not failed, "requires": sorted(requires), "checks": [
            {**asdict(c), "needed_by": list(c.needed_by), "required": _required(c, requires)} for c in checks]}, indent=2))
        return 1 if failed else 0
    print(f"temper doctor: required: the base checks{''.join(', ' + r for r in sorted(requires))} "
          f"(--requires {','.join(REQUIREMENTS)}); the others are for information")
    width = max(len(c.name) for c in checks)
    for c in checks:
        status = "ok" if c.ok else "FAIL" if _required(c, requires) else "-"
        print(f"  {status:<4}  {c.name:<{width}}  {c.detail}")
    for c in failed:
        print(f"{c.name}: {c.detail}. Fix: {c.fix}", file=sys.stderr)
    print(f"{len(failed)} required check(s) failed" if failed else "every required check passed")
    return 1 if failed else 0
