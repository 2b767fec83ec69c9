"""The only module of the engine that reads environment variables.

Only names listed in ENV_WHITELIST.md are read here (the `ssot` guard checks both facts). Everything
behavioural lives in EngineConfig; the environment carries only what launchers set (ranks,
rendezvous) and the per-op kernel overrides that register.toml documents.
"""

import os
from dataclasses import dataclass

__all__ = ["LaunchEnv", "launch_env", "rendezvous", "op_override", "kernel_cache_dir"]


@dataclass(frozen=True)
class LaunchEnv:
    """Process placement as the launcher (torchrun, srun, or none) describes it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launcher: str  # "torchrun", "srun" or "none"
    slurm_job_id: str


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; unset it or fix the launcher") from err


def launch_env() -> LaunchEnv:
    """Read ranks from torchrun's variables, else from srun's, else a single process."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = _int("WORLD_SIZE", 1)
        return LaunchEnv(
            rank=_int("RANK", 0),
            local_rank=_int("LOCAL_RANK", 0),
            world_size=world,
            local_world_size=_int("LOCAL_WORLD_SIZE", world),
            launcher="torchrun",
            slurm_job_id=job,
        )
    if "SLURM_PROCID" in os.environ and _int("SLURM_NTASKS", 1) > 1:
        world = _int("SLURM_NTASKS", 1)
        return LaunchEnv(
            rank=_int("SLURM_PROCID", 0),
            local_rank=_int("SLURM_LOCALID", 0),
            world_size=world,
            local_world_size=world,
            launcher="srun",
            slurm_job_id=job,
        )
    return LaunchEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, launcher="none", slurm_job_id=job)


def rendezvous() -> tuple[str, str]:
    """MASTER_ADDR / MASTER_PORT as set by the launcher (empty strings when unset)."""
    return os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")


def op_override(op_name: str) -> str:
    """TEMPER_OP_<OP> (e.g. TEMPER_OP_ATTENTION=fa4), or "" when unset."""
    return os.environ.get(f"TEMPER_OP_{op_name.upper()}", "")


def kernel_cache_dir() -> str:
    """Where compiled CuTeDSL kernels are cached; "" means the engine's default."""
    return os.environ.get("TEMPER_KERNEL_CACHE", "")
