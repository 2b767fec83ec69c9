"""The self-describing header every run prints first: code, versions, hardware, layout, config.

Enough to reproduce or question a run from its log alone (git commit, library versions, GPU model,
resolved config, and which kernel version of every op ran).
"""

import json
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

__all__ = ["git_commit", "library_versions", "nccl_version", "device_name", "environment", "header_lines"]

_KERNEL_LIBS = ("nvidia-cutlass-dsl", "quack-kernels", "flash-attn-4", "transformers", "datasets", "tokenizers",
                "sentencepiece")


def git_commit() -> str:
    """HEAD of the checkout the engine runs from, with '+dirty' when it has local changes."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({type(err).__name__})"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def library_versions() -> dict[str, str]:
    """Installed versions from package metadata (nothing is imported)."""
    out = {}
    for name in _KERNEL_LIBS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def nccl_version() -> str:
    """The NCCL this torch was built with ("2.21.5"), or "none" (a CPU build, or no NCCL backend)."""
    if not (torch.cuda.is_available() and torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return "none"
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def environment() -> dict[str, Any]:
    """What this process runs on: the facts of the header's first lines, as data (`python -m engine env --json`,
    read by `temper doctor`)."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"git": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda or "none", "gpus": gpus, "nccl": nccl_version(), "host": socket.gethostname(),
            "libs": library_versions()}


def header_lines(*, device: torch.device, launcher: str, world: int, tp: int, dp: int, op_versions: dict[str, str],
                 data: str, params: int, matmul_params: int, flops_per_token: float, config: dict[str, Any],
                 hosts: tuple[str, ...] = ()) -> list[str]:
    """`hosts`: one name per node (ParallelState.hosts); empty for a single process (the first line names its host)."""
    env = environment()
    nodes = max(1, len(hosts))
    where = f" nodes={nodes} per_node={world // nodes}" + (f" hosts={','.join(hosts)}" if hosts else "")
    libs = " ".join(f"{k}={v}" for k, v in env["libs"].items())
    ops = " ".join(f"{k}={v}" for k, v in sorted(op_versions.items()))
    return [
        f"[RUN] temper engine git={env['git']} python={env['python']} torch={env['torch']} "
        f"cuda={env['cuda']} device={device_name(device)} host={env['host']}",
        f"[RUN] argv={' '.join(sys.argv)}",
        f"[RUN] layout launcher={launcher} world={world} tp={tp} dp={dp}{where}",
        f"[RUN] ops {ops}",
        f"[RUN] libs {libs}",
        f"[RUN] data {data}",
        f"[RUN] model params={params} matmul_params={matmul_params} flops_per_token={flops_per_token:.6e} "
        f"(MFU count: engine/flops.py, 6 x matmul params + 6 x L x h x s)",
        "[CONFIG] " + json.dumps(config, sort_keys=True),
    ]
