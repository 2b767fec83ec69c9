"""An independent training loop for the engine's model family, to hold the engine's optimizer to.

Model: the judge's plain fp32 forward (harness/judge/claims/reference.py: no engine code) over a dict of
leaf tensors. Optimizer: torch.optim.AdamW (foreach) with explicit param groups, muP as the recipe
states it (restated here from the config fields, not from the engine): hidden matrices (attn.qkv,
attn.o, mlp.fc1, mlp.fc2) at lr / (hidden_size / dim_model_base), embedding, LM head and norm gains
at lr; weight decay on 2-D tensors. Then clip_grad_norm_ and a closed-form warmup + cosine schedule.
Data: the engine's own loader (data order is not under test here), one micro-batch holding the
whole global batch.
"""

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from engine.config import EngineConfig, to_dict
from engine.data.loader import BatchLoader
from engine.data.sources import build_data
from engine.distributed import ParallelState
from engine.model import build_model
from engine.ops import resolve_ops
from harness.judge.claims import reference

__all__ = ["HIDDEN_MATRICES", "cosine", "mup_multiplier", "param_groups", "initial_weights", "clipped_steps",
           "train_reference", "adamw", "adamw_step", "reference_logits"]

HIDDEN_MATRICES = (".attn.qkv", ".attn.o", ".mlp.fc1", ".mlp.fc2")


def cosine(step: int, *, peak: float, floor: float, warmup: int, total: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - 1 - warmup)  # lr at step `warmup`, floor at the last step
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def mup_multiplier(name: str, cfg: EngineConfig) -> float:
    if cfg.mup and name.endswith(HIDDEN_MATRICES):
        return cfg.dim_model_base / cfg.hidden_size
    return 1.0


def param_groups(named: dict[str, torch.Tensor], cfg: EngineConfig, *, mup_lr: bool = True) -> list[dict[str, Any]]:
    """One group per (multiplier, decay); `mult` is the group's factor on the scheduled lr."""
    groups: dict[tuple[float, bool], list[torch.Tensor]] = {}
    for name, p in named.items():
        mult = mup_multiplier(name, cfg) if mup_lr else 1.0
        groups.setdefault((mult, p.ndim >= 2), []).append(p)
    return [{"params": ps, "mult": mult, "weight_decay": cfg.weight_decay if decay else 0.0}
            for (mult, decay), ps in groups.items()]


def initial_weights(cfg: EngineConfig) -> dict[str, torch.Tensor]:
    """The engine's step-0 weights at TP 1 (initialisation is layout-independent, engine/model/init.py)."""
    cpu = torch.device("cpu")
    model = build_model(cfg, ParallelState.single(cpu), resolve_ops(cfg, cpu), torch.float32)
    return {n: p.detach() for n, p in model.named_parameters()}


def reference_logits(weights: dict[str, torch.Tensor], cfg: EngineConfig, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference.logits(weights, to_dict(cfg), tokens)


def clipped_steps(params: dict[str, torch.Tensor], cfg: EngineConfig, steps: int) -> Iterator[tuple[float, float]]:
    """The loop every reference optimizer shares: per step, the loss and gradients of the global batch on
    `params` (leaf tensors, updated in place by the caller), clip_grad_norm_ over all of them, then yields
    (the loss, the step's scheduled lr) for the caller to apply its update. cfg: the resolved config."""
    assert cfg.lr_schedule == "cosine", "the closed form here is warmup + cosine"
    config = to_dict(cfg)
    data = build_data(cfg, cache_dir=cfg.data_cache_dir or "unused", dp_rank=0, dp_size=1)
    loader = BatchLoader(data.train, micro_batch_size=cfg.global_batch_size, grad_accum_steps=1, dp_rank=0,
                         dp_size=1, seed=cfg.seed)
    for step in range(steps):
        ((x, y),) = loader.next_step()
        for p in params.values():
            p.grad = None
        out = reference.logits(params, config, x)
        valid = int((y != -100).sum())
        loss_sum = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum")
        (loss_sum / valid).backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        yield loss_sum.item() / valid, cosine(step, peak=cfg.lr, floor=cfg.lr * cfg.min_lr_ratio,
                                              warmup=cfg.warmup_steps, total=cfg.num_steps)


def train_reference(initial: dict[str, torch.Tensor], cfg: EngineConfig, steps: int, *,
                    mup_lr: bool = True) -> tuple[dict[str, torch.Tensor], list[float]]:
    """`steps` steps of the plain loop from `initial` (the engine's step-0 weights, TP 1 layout);
    returns the final weights and each step's loss. cfg: the resolved config (global batch, schedule)."""
    params = {n: t.detach().clone().float().requires_grad_(True) for n, t in initial.items()}
    opt = adamw(params, cfg, mup_lr=mup_lr)
    losses = []
    for loss, lr in clipped_steps(params, cfg, steps):
        losses.append(loss)
        adamw_step(opt, lr)
    return {n: p.detach() for n, p in params.items()}, losses


def adamw(named: dict[str, torch.Tensor], cfg: EngineConfig, *, mup_lr: bool = True) -> torch.optim.AdamW:
    """torch.optim.AdamW (foreach) over `named` with the groups of `param_groups`."""
    return torch.optim.AdamW(param_groups(named, cfg, mup_lr=mup_lr), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_eps, foreach=True)


def adamw_step(opt: torch.optim.AdamW, lr: float) -> None:
    """One step at the scheduled `lr` times each group's multiplier."""
    for group in opt.param_groups:
        group["lr"] = lr * group["mult"]
    opt.step()
