"""AdamW with fp32 master weights and fp32 moments over the flat buffers.

Why and how: docs/engine/optim.md, section `engine/optim/optimizer.py`.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.model.tp_grads import TPGrads
from engine.optim.buffers import Entry, FlatBuffers

__all__ = ["Segment", "MixedPrecisionAdamW", "make_adamw", "adam_step_tensor", "global_norm", "clip_coefficient"]


def make_adamw(tensors: list[tuple[str, int, torch.Tensor]], cfg: EngineConfig, lr_multipliers: Mapping[str, float],
               device: torch.device) -> torch.optim.AdamW:
    """torch's AdamW over (parameter name, the parameter's ndim, tensor to step), one param group per (lr multiplier,
    decay): decay for ndim >= 2. `step` sets each group's lr to lr x its "lr_mult". Fused on CUDA, foreach on CPU."""
    groups: dict[tuple[float, bool], list[torch.Tensor]] = {}
    for name, ndim, tensor in tensors:
        groups.setdefault((float(lr_multipliers[name]), ndim >= 2), []).append(tensor)
    param_groups = [{"params": params, "lr_mult": mult, "weight_decay": cfg.weight_decay if decay else 0.0}
                    for (mult, decay), params in sorted(groups.items(), key=lambda kv: (-kv[0][1], kv[0][0]))]
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, **impl)


@torch.no_grad()
def global_norm(views: list[torch.Tensor], par: ParallelState) -> float:
    """L2 norm of the gradient parts `views` of every rank (disjoint over DP and TP, each element counted on one
    rank): one norm kernel per view, squares summed in fp64, then over DP and TP. CUDA reduces fp32 in a tree; CPU's
    fp32 norm accumulates serially (1e-4 off over 5M elements), so there it runs in fp64."""
    acc = torch.float32 if par.device.type == "cuda" else torch.float64
    squares = torch.zeros((), dtype=torch.float64, device=par.device)
    for view in views:
        squares += torch.linalg.vector_norm(view, dtype=acc).double().square()
    if par.dp_size > 1:
        dist.all_reduce(squares, group=par.dp_group)
    if par.tp_size > 1:
        dist.all_reduce(squares, group=par.tp_group)
    return math.sqrt(squares.item())


def clip_coefficient(cfg: EngineConfig, norm: float) -> float | None:
    """The factor that brings the gradients' global norm to cfg.grad_clip (as clip_grad_norm_), None for none."""
    if cfg.grad_clip <= 0 or not math.isfinite(norm):
        return None
    coef = cfg.grad_clip / (norm + 1e-6)
    return coef if coef < 1.0 else None


def adam_step_tensor(adam_step: int, device: torch.device) -> torch.Tensor:
    """AdamW's step counter as fused (CUDA: on the device) and foreach (CPU) AdamW keep it: a float32 scalar."""
    return torch.tensor(float(adam_step), dtype=torch.float32, device=device if device.type == "cuda" else "cpu")


@dataclass
class Segment:
    entry: Entry
    lo: int  # absolute range [lo, hi) in the flat buffers
    hi: int
    grad: torch.Tensor  # fp32 view of buffers.grads[lo:hi]
    master: torch.Tensor | None  # fp32, 1-D, hi - lo elements; None: another optimizer (Muon) steps this parameter

    @property
    def param_range(self) -> tuple[int, int]:
        """The same range as offsets into the flattened parameter."""
        return self.lo - self.entry.start, self.hi - self.entry.start


class MixedPrecisionAdamW:
    def __init__(self, buffers: FlatBuffers, cfg: EngineConfig, par: ParallelState, lr_multipliers: Mapping[str, float],
                 tp_grads: TPGrads, others: frozenset[str] = frozenset()):
        """`lr_multipliers`: parameter name -> factor on the scheduled lr (every trainable parameter).
        `tp_grads`: which gradient elements this rank counts in the grad norm (the model's `tp_grads()`).
        `others`: parameters another optimizer steps (--optimizer muon). Their gradients still count in
        `grad_norm` and are clipped by `clip` here (this rank's ZeRO-1 range of them), so the norm and the
        clipping are those of the whole model whichever optimizer applies the update; AdamW keeps no
        master or moments for them."""
        self.buffers, self.cfg, self.par, self.tp_grads = buffers, cfg, par, tp_grads
        missing = [e.name for e in buffers.entries if e.name not in lr_multipliers]
        assert not missing, f"no lr multiplier for {missing}"
        self.grad_segments: list[Segment] = []  # every parameter's part of this rank's ranges: norm and clipping
        for lo, hi in buffers.shard_ranges(par.dp_rank):
            for e in buffers.entries:
                a, b = max(lo, e.start), min(hi, e.end)
                if a < b:
                    master = None
                    if e.name not in others:
                        master = buffers.params[a:b].detach().float().clone()
                        master.grad = buffers.grads[a:b]
                    self.grad_segments.append(Segment(e, a, b, buffers.grads[a:b], master))
        self.segments = [s for s in self.grad_segments if s.master is not None]  # the ones AdamW steps
        self.norm_views = self._counted_views()
        self.adam = make_adamw([(s.entry.name, s.entry.param.ndim, s.master) for s in self.segments], cfg,
                               lr_multipliers, par.device)

    def _counted_views(self) -> list[torch.Tensor]:
        """The parts of this rank's gradients that count towards the global norm (see grad_norm), adjacent parts
        merged, so that at TP 1 they are the shard ranges of the flat buffer themselves."""
        ranges: list[list[int]] = []
        for s in self.grad_segments:
            for part in self.tp_grads.counted(s.entry.param, *s.param_range):
                lo, hi = s.lo + part.start, s.lo + part.stop
                if ranges and ranges[-1][1] == lo:
                    ranges[-1][1] = hi
                else:
                    ranges.append([lo, hi])
        return [self.buffers.grads[lo:hi] for lo, hi in ranges]

    @torch.no_grad()
    def grad_norm(self) -> float:
        """Global L2 norm of the fp32 gradients this rank's optimizer owns, summed over DP ranks
        (their shards are disjoint) and TP ranks (their shards are disjoint; a TP-replicated
        parameter is counted on TP rank 0 only). One norm kernel per contiguous counted range (one at
        TP 1): no squared temporaries. CUDA reduces fp32 in a tree; CPU's fp32 norm accumulates serially
        (1e-4 off over 5M elements), so there it runs in fp64 (which casts a copy first: 7 ms of an 8B
        step on a GPU, nothing on CPU's scales). The squares are summed in fp64."""
        return global_norm(self.norm_views, self.par)

    @torch.no_grad()
    def clip(self, norm: float) -> None:
        """Scale gradients so their global norm is at most cfg.grad_clip (as clip_grad_norm_ does)."""
        coef = clip_coefficient(self.cfg, norm)
        if coef is not None:
            for s in self.grad_segments:
                s.grad.mul_(coef)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        for group in self.adam.param_groups:
            group["lr"] = lr * group["lr_mult"]
        self.adam.step()
        for s in self.segments:
            self.buffers.params[s.lo:s.hi].copy_(s.master)

    # --- checkpoint state: masters and moments keyed by parameter name (flattened) ---------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors to checkpoint. With one whole segment per parameter the keys are plain names."""
        out: dict[str, torch.Tensor] = {}
        for s in self.segments:
            lo, hi = s.param_range
            assert (lo, hi) == (0, s.entry.numel), "sharded segments need the distributed checkpoint layout"
            state = self.adam.state.get(s.master, {})
            out[f"master/{s.entry.name}"] = s.master
            out[f"exp_avg/{s.entry.name}"] = state.get("exp_avg", torch.zeros_like(s.master))
            out[f"exp_avg_sq/{s.entry.name}"] = state.get("exp_avg_sq", torch.zeros_like(s.master))
        return out

    def adam_step(self) -> int:
        for s in self.segments:
            state = self.adam.state.get(s.master)
            if state and "step" in state:
                return int(state["step"].item())
        return 0

    def moments(self, s: Segment) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp_avg, exp_avg_sq) of a segment; zeros before the first step."""
        state = self.adam.state.get(s.master, {})
        return state.get("exp_avg", torch.zeros_like(s.master)), state.get("exp_avg_sq", torch.zeros_like(s.master))

    @torch.no_grad()
    def load_state_tensors(self, tensors: dict[str, torch.Tensor], adam_step: int) -> None:
        """Restore masters and moments (tensors as returned by state_tensors, loaded in place or
        fresh), set the Adam step, and rewrite the model parameters from the masters."""
        for s in self.segments:
            name = s.entry.name
            self.load_segment(s, tensors[f"master/{name}"], tensors[f"exp_avg/{name}"], tensors[f"exp_avg_sq/{name}"],
                              adam_step)

    @torch.no_grad()
    def load_segment(self, s: Segment, master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                     adam_step: int) -> None:
        """Restore one segment's master and moments and rewrite its slice of the model parameters.
        (With DP > 1 the other slices come from their owners: gather the parameters afterwards.)"""
        s.master.copy_(master)
        if adam_step > 0:
            state = self.adam.state[s.master]
            state["exp_avg"] = exp_avg.clone()
            state["exp_avg_sq"] = exp_avg_sq.clone()
            state["step"] = adam_step_tensor(adam_step, s.master.device)
        self.buffers.params[s.lo:s.hi].copy_(s.master)
