"""An independent Muon training loop for the engine's model family, written from the recipe, not from the engine.

Model: the judge's plain fp32 forward (harness/judge/reference.py: no engine code) over a dict of leaf tensors
at the TP 1 layout. Optimizer, restated here from the recipe (Keller Jordan's Muon with Moonlight's scale):
- the hidden matrices, split into their logical matrices (Q, K, V rows of attn.qkv; gate, up rows of mlp.fc1;
  attn.o; mlp.fc2), each: buf = m buf + (1 - m) g; u = (1 - m) g + m buf (Nesterov) or buf; O = the quintic
  Newton-Schulz iteration of u in fp64 here; W = W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) O;
- every other tensor: torch.optim.AdamW with the muP groups of tests/engine/adamw_reference.py;
- muP: lr x (dim_model_base / hidden_size) for every hidden matrix, Muon's and AdamW's decay alike;
- clip_grad_norm_ over all tensors, then the warmup + cosine schedule in closed form.
Data: the engine's own loader (data order is not under test here), one micro-batch holding the global batch.
"""

import math

import torch
import torch.nn.functional as F

from engine.config import EngineConfig, to_dict
from engine.data.loader import BatchLoader
from engine.data.sources import build_data
from harness.judge import reference
from tests.engine.adamw_reference import HIDDEN_MATRICES, cosine, mup_multiplier, param_groups

__all__ = ["KELLER", "quintic_ns", "logical_rows", "train_muon_reference"]

KELLER = (3.4445, -4.7750, 2.0315)


def quintic_ns(g: torch.Tensor, steps: int) -> torch.Tensor:
    """X <- a X + b (X X^T) X + c (X X^T)^2 X from X = g / ||g||, on the orientation with fewer rows; fp64."""
    a, b, c = KELLER
    x = g.double() / (g.double().norm() + 1e-7)
    flip = x.shape[0] > x.shape[1]
    if flip:
        x = x.t()
    for _ in range(steps):
        xxt = x @ x.t()
        x = a * x + b * (xxt @ x) + c * (xxt @ xxt @ x)
    return (x.t() if flip else x).float()


def logical_rows(name: str, shape: torch.Size, cfg: EngineConfig) -> list[int]:
    """Row counts of the logical matrices stacked in a hidden matrix of the TP 1 layout."""
    if name.endswith(".attn.qkv"):
        return [cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
    if name.endswith(".mlp.fc1"):
        return [cfg.ffn_hidden_size, cfg.ffn_hidden_size]
    return [shape[0]]


def train_muon_reference(initial: dict[str, torch.Tensor], cfg: EngineConfig, steps: int, *, nesterov: bool = True,
                         split: bool = True) -> tuple[dict[str, torch.Tensor], list[float]]:
    """`steps` steps from `initial` (TP 1 layout); the final weights and each step's loss. `split` False
    orthogonalises the fused QKV / FC1 as one matrix (a negative control)."""
    assert cfg.lr_schedule == "cosine", "the closed form here is warmup + cosine"
    params = {n: t.detach().clone().float().requires_grad_(True) for n, t in initial.items()}
    hidden = {n: p for n, p in params.items() if n.endswith(HIDDEN_MATRICES)}
    others = {n: p for n, p in params.items() if n not in hidden}
    adam = torch.optim.AdamW(param_groups(others, cfg), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             eps=cfg.adam_eps, foreach=True)
    bufs = {n: torch.zeros_like(p) for n, p in hidden.items()}
    m = cfg.muon_momentum
    data = build_data(cfg, cache_dir=cfg.data_cache_dir or "unused", dp_rank=0, dp_size=1)
    loader = BatchLoader(data.train, micro_batch_size=cfg.global_batch_size, grad_accum_steps=1, dp_rank=0,
                         dp_size=1, seed=cfg.seed)
    config = to_dict(cfg)
    losses = []
    for step in range(steps):
        ((x, y),) = loader.next_step()
        for p in params.values():
            p.grad = None
        out = reference.logits(params, config, x)
        valid = int((y != -100).sum())
        loss_sum = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-100, reduction="sum")
        (loss_sum / valid).backward()
        losses.append(loss_sum.item() / valid)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        lr = cosine(step, peak=cfg.lr, floor=cfg.lr * cfg.min_lr_ratio, warmup=cfg.warmup_steps, total=cfg.num_steps)
        for group in adam.param_groups:
            group["lr"] = lr * group["mult"]
        adam.step()
        with torch.no_grad():
            for name, w in hidden.items():
                g = w.grad
                bufs[name] = m * bufs[name] + (1 - m) * g
                u = (1 - m) * g + m * bufs[name] if nesterov else bufs[name]
                rows = logical_rows(name, w.shape, cfg) if split else [w.shape[0]]
                update = torch.cat([quintic_ns(block, cfg.muon_ns_steps) * cfg.muon_update_rms
                                    * math.sqrt(max(block.shape)) for block in torch.split(u, rows)])
                step_lr = lr * mup_multiplier(name, cfg)
                w.mul_(1 - step_lr * cfg.weight_decay)
                w.sub_(step_lr * update)
    return {n: p.detach() for n, p in params.items()}, losses
