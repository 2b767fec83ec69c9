"""The only module of the engine that reads environment variables.

Only names listed in ENV_WHITELIST.md are read here (the `ssot` guard checks both facts). Everything
behavioural lives in EngineConfig; the environment carries only what launchers set (ranks,
rendezvous) and the per-op kernel overrides that register.toml documents.
"""

import os
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["LaunchEnv", "launch_env", "rendezvous", "op_override", "kernel_cache_dir", "pin_cublas_workspace",
           "OVERRIDABLE_OPS"]

# The ops engine/ops/*/register.toml registers, each with the one variable that overrides its version.
# Data, not a lookup of the registers: this module is the engine's lowest layer and imports nothing
# of it. tests/ops/test_env_ops.py checks this table against the registers; the `ssot` guard checks
# every value against ENV_WHITELIST.md. A read-only mapping, so no other module can add a name.
_OP_VARIABLES = MappingProxyType({
    "attention": "TEMPER_OP_ATTENTION",
    "rmsnorm": "TEMPER_OP_RMSNORM",
    "gemm_fc1": "TEMPER_OP_GEMM_FC1",
    "gemm_output": "TEMPER_OP_GEMM_OUTPUT",
    "rope": "TEMPER_OP_ROPE",
    "fp8_cast": "TEMPER_OP_FP8_CAST",
    "fp8_wgrad": "TEMPER_OP_FP8_WGRAD",
})
OVERRIDABLE_OPS = frozenset(_OP_VARIABLES)


@dataclass(frozen=True)
class LaunchEnv:
    """Process placement as the launcher (torchrun, srun, or none) describes it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launcher: str  # "torchrun", "srun" or "none"
    slurm_job_id: str
    num_nodes: int = 1  # torchrun's --nnodes (GROUP_WORLD_SIZE), srun's step node count
    node_rank: int = 0  # this host's place among them (GROUP_RANK, SLURM_NODEID)


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer; unset it or fix the launcher") from err


def launch_env() -> LaunchEnv:
    """Read ranks from torchrun's variables, else from srun's, else a single process.

    Taken as the launcher gives them; engine/distributed/nodes.py checks that they describe the same
    number of processes on every node, ranks numbered node by node."""
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
            num_nodes=_int("GROUP_WORLD_SIZE", 1),
            node_rank=_int("GROUP_RANK", 0),
        )
    if "SLURM_PROCID" in os.environ and _int("SLURM_NTASKS", 1) > 1:
        world = _int("SLURM_NTASKS", 1)
        nodes = _int("SLURM_STEP_NUM_NODES", 1)
        return LaunchEnv(
            rank=_int("SLURM_PROCID", 0),
            local_rank=_int("SLURM_LOCALID", 0),
            world_size=world,
            local_world_size=world // nodes if nodes > 0 else world,  # uneven splits: nodes.py refuses them
            launcher="srun",
            slurm_job_id=job,
            num_nodes=nodes,
            node_rank=_int("SLURM_NODEID", 0),
        )
    return LaunchEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, launcher="none", slurm_job_id=job)


def rendezvous() -> tuple[str, str]:
    """MASTER_ADDR / MASTER_PORT as set by the launcher (empty strings when unset)."""
    return os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")


def op_override(op_name: str) -> str:
    """TEMPER_OP_<OP> (e.g. TEMPER_OP_ATTENTION=fa4), or "" when unset.

    Only the ops the engine registers have an override; any other name raises, so this accessor
    cannot be used to read an arbitrary TEMPER_OP_* variable.
    """
    if op_name not in _OP_VARIABLES:
        raise ValueError(f"engine/env.py op_override({op_name!r}): not an op the engine registers "
                         f"(known: {', '.join(sorted(_OP_VARIABLES))}); pass one of those, or add the new op's "
                         "row to _OP_VARIABLES in engine/env.py together with its engine/ops/<op>/register.toml")
    return os.environ.get(_OP_VARIABLES[op_name], "")


def kernel_cache_dir() -> str:
    """Where compiled CuTeDSL kernels are cached; "" means the engine's default."""
    return os.environ.get("TEMPER_KERNEL_CACHE", "")


# cuBLAS may pick a different reduction split per call unless its workspace is fixed; with one of these
# settings its GEMMs are bitwise reproducible (cuBLAS docs, "Results reproducibility"; torch's
# use_deterministic_algorithms refuses CUDA matmuls without it).
_CUBLAS_REPRODUCIBLE = (":4096:8", ":16:8")


def pin_cublas_workspace() -> str:
    """Set CUBLAS_WORKSPACE_CONFIG to ':4096:8' unless it already holds a reproducible value, and return it.

    torch creates its cuBLAS handles lazily and reads the variable then, so this must run before the
    process's first CUDA matmul. A value set by the user that is not reproducible raises (never overridden
    silently)."""
    current = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    if current in _CUBLAS_REPRODUCIBLE:
        return current
    if current:
        raise ValueError(f"CUBLAS_WORKSPACE_CONFIG={current!r} makes cuBLAS results depend on the run: unset it, "
                         f"set it to {_CUBLAS_REPRODUCIBLE[0]!r}, or pass --no-deterministic")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = _CUBLAS_REPRODUCIBLE[0]
    return _CUBLAS_REPRODUCIBLE[0]
