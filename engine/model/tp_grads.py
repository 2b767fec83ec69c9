"""What tensor parallelism asks of each parameter's gradient, as the layers that own them declare it.

A layer with TP-replicated weights answers `tp_grad_needs(par, sequence_parallel)`; `TPGrads.of(model)`
collects the answers into the one typed record the optimizers, the gradient sync and the parameter count
read. docs/engine/tensor-parallel.md says which weights need what, and why.
"""

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from engine.distributed import ParallelState

__all__ = ["GradSum", "TPGradNeed", "DeclaresTPGrads", "TPGrads", "global_param_count"]


@dataclass(frozen=True)
class GradSum:
    """Sum the flattened elements [lo, hi) of `param`'s gradient over `group`."""

    param: nn.Parameter
    lo: int
    hi: int
    group: "dist.ProcessGroup | None"


@dataclass(frozen=True)
class TPGradNeed:
    """One parameter's needs: `replicated` (the same on every TP rank: the grad norm counts it on TP rank 0 only),
    `sum` (a gradient range that is a partial sum over a group), `duplicate` (a flattened range another rank of its
    group also holds: this rank leaves it out of the grad norm)."""

    param: nn.Parameter
    replicated: bool = False
    sum: GradSum | None = None
    duplicate: tuple[int, int] | None = None


@runtime_checkable
class DeclaresTPGrads(Protocol):
    """A layer whose parameters need more than a plain gradient under TP (engine/model/layers.py)."""

    def tp_grad_needs(self, par: ParallelState, sequence_parallel: bool) -> list[TPGradNeed]: ...


@dataclass
class TPGrads:
    """Every TP need of a model's parameters (empty at TP 1), keyed by parameter identity."""

    tp_rank: int = 0
    needs: dict[int, TPGradNeed] = field(default_factory=dict)

    @classmethod
    def of(cls, model: nn.Module, par: ParallelState, sequence_parallel: bool) -> "TPGrads":
        """Ask every module that declares `tp_grad_needs`. Call on the model as trained (after --fsdp's sharding)."""
        grads = cls(tp_rank=par.tp_rank)
        if par.tp_size == 1:
            return grads
        for module in model.modules():
            if not isinstance(module, DeclaresTPGrads):
                continue
            for need in module.tp_grad_needs(par, sequence_parallel):
                assert id(need.param) not in grads.needs, "one parameter declared twice"
                grads.needs[id(need.param)] = need
        return grads

    @property
    def sums(self) -> list[GradSum]:
        return [n.sum for n in self.needs.values() if n.sum is not None]

    def counted(self, param: torch.Tensor, lo: int, hi: int) -> list[slice]:
        """The parts of `param`'s flattened elements [lo, hi) this rank counts in the grad norm, as slices of that
        range: every element of the model counts on exactly one TP rank."""
        need = self.needs.get(id(param))
        if need is None:
            return [slice(0, hi - lo)]
        if need.replicated and self.tp_rank != 0:
            return []
        if need.duplicate is None:
            return [slice(0, hi - lo)]
        a, b = (min(max(x - lo, 0), hi - lo) for x in need.duplicate)  # the duplicate part, clipped
        return [part for part in (slice(0, a), slice(b, hi - lo)) if part.stop > part.start]


def global_param_count(model: nn.Module, tp_grads: TPGrads, par: ParallelState) -> int:
    """Parameters of the whole model (padded vocabulary included), each TP-replicated one once; collective over TP."""
    local = sum(s.stop - s.start for p in model.parameters() for s in tp_grads.counted(p, 0, p.numel()))
    if par.tp_size == 1:
        return local
    total = torch.tensor(local, dtype=torch.int64, device=par.device)
    dist.all_reduce(total, group=par.tp_group)
    return int(total.item())
