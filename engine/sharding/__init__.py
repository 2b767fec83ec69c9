"""The data-parallel side of training: ZeRO-1 (gradient sync by bucket, parameter all-gathers behind the forward,
the sharded optimizer state of checkpoints) or FSDP2 (--fsdp). What TP asks of the gradients is the layers'
(engine/model/tp_grads.py)."""

from engine.sharding.fsdp import ShardedAdamW, fsdp_optimizer_state, load_fsdp_optimizer_state, shard_model
from engine.sharding.grad_sync import GradSync
from engine.sharding.param_gather import ParamGather, use_points
from engine.sharding.zero_state import load_optimizer_state, optimizer_state

__all__ = ["GradSync", "ParamGather", "use_points", "optimizer_state",
           "load_optimizer_state", "ShardedAdamW", "shard_model", "fsdp_optimizer_state", "load_fsdp_optimizer_state"]
