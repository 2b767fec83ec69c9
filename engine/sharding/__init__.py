"""Applying TP and DP to a model and its optimizer: gradient sums and reduce-scatters, parameter
all-gathers overlapped with the forward, and checkpointable ZeRO-1 optimizer state; or FSDP2 (--fsdp)."""

from engine.sharding.fsdp import ShardedAdamW, fsdp_optimizer_state, load_fsdp_optimizer_state, shard_model
from engine.sharding.grad_sync import GradSync
from engine.sharding.param_gather import ParamGather, use_points
from engine.sharding.zero_state import load_optimizer_state, optimizer_state

__all__ = ["GradSync", "ParamGather", "use_points", "optimizer_state",
           "load_optimizer_state", "ShardedAdamW", "shard_model", "fsdp_optimizer_state", "load_fsdp_optimizer_state"]
