"""What tensor parallelism asks of the gradients, parameter by parameter.

Two kinds of TP-replicated weights need a gradient sum over TP ranks before the optimizer:
- the K/V rows of QKV when there are more TP ranks than KV heads: `tp / kv_heads` consecutive ranks
  hold the same head, each computing the part of its gradient that flows through its own query
  heads; the true gradient is their sum (over `ParallelState.kv_group`);
- the RMSNorm gains under sequence parallelism: each rank saw only its block of tokens, so its
  gradient is a partial sum over tokens (over the TP group). Without sequence parallelism every TP
  rank computes the same full gradient from the same replicated activations: nothing to do.
Both sums are linear, so micro-batches accumulate locally and the sum runs once per step.

The same facts decide the grad norm (engine/optim/optimizer.py): norm gains are `tp_replicated`
(counted on TP rank 0), replicated K/V rows are `tp_duplicate` on all but the first rank of a
`kv_group` (counted once).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.model.layers import Attention, RMSNormWeight

__all__ = ["GradSum", "apply_tensor_parallel", "global_param_count"]


@dataclass(frozen=True)
class GradSum:
    """Sum the flattened elements [lo, hi) of `param`'s gradient over `group`."""

    param: nn.Parameter
    lo: int
    hi: int
    group: "dist.ProcessGroup | None"


def apply_tensor_parallel(model: nn.Module, cfg: EngineConfig, par: ParallelState) -> list[GradSum]:
    """Mark parameters for the grad norm and return the gradient sums TP needs (empty at TP = 1)."""
    if par.tp_size == 1:
        return []
    sums: list[GradSum] = []
    replicas = par.tp_size // cfg.num_kv_heads if par.tp_size > cfg.num_kv_heads else 1
    for module in model.modules():
        if isinstance(module, RMSNormWeight):
            module.weight.tp_replicated = True
            if cfg.sequence_parallel:
                sums.append(GradSum(module.weight, 0, module.weight.numel(), par.tp_group))
        elif isinstance(module, Attention) and replicas > 1:
            rows_lo, rows_hi = module.kv_rows
            width = module.qkv.shape[1]
            lo, hi = rows_lo * width, rows_hi * width
            sums.append(GradSum(module.qkv, lo, hi, par.kv_group))
            if par.tp_rank % replicas:  # not the first holder of this KV head
                module.qkv.tp_duplicate = (lo, hi)
    return sums


def global_param_count(model: nn.Module, par: ParallelState) -> int:
    """Parameters of the whole model (padded vocabulary included), each TP-replicated one once.
    Call after apply_tensor_parallel; collective over the TP group."""
    local = 0
    for p in model.parameters():
        if par.tp_size > 1 and par.tp_rank != 0 and getattr(p, "tp_replicated", False):
            continue
        dup = getattr(p, "tp_duplicate", None)
        local += p.numel() - (dup[1] - dup[0] if dup is not None else 0)
    if par.tp_size == 1:
        return local
    total = torch.tensor(local, dtype=torch.int64, device=par.device)
    dist.all_reduce(total, group=par.tp_group)
    return int(total.item())
