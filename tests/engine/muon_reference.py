"""An independent Muon training loop for the engine's model family, written from the recipe, not from the engine.

Model: the judge's plain fp32 forward (harness/judge/claims/reference.py: no engine code) over a dict of leaf tensors
at the TP 1 layout. Optimizer, restated here from the recipe (Keller Jordan's Muon with Moonlight's scale):
- the hidden matrices, split into their logical matrices (Q, K, V rows of attn.qkv; gate, up rows of mlp.fc1;
  attn.o; mlp.fc2), each: buf = m buf + (1 - m) g; u = (1 - m) g + m buf (Nesterov) or buf; O = the quintic
  Newton-Schulz iteration of u in fp64 here; W = W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) O;
- every other tensor: torch.optim.AdamW with the muP groups of tests/engine/adamw_reference.py;
- muP: lr x (dim_model_base / hidden_size) for every hidden matrix, Muon's and AdamW's decay alike;
- the loop AdamW's reference runs (adamw_reference.clipped_steps): the judge's forward on the engine's own
  batches, clip_grad_norm_ over all tensors, the warmup + cosine schedule in closed form.
"""

import math

import torch

from engine.config import EngineConfig
from tests.engine.adamw_reference import HIDDEN_MATRICES, adamw, adamw_step, clipped_steps, mup_multiplier

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
    params = {n: t.detach().clone().float().requires_grad_(True) for n, t in initial.items()}
    hidden = {n: p for n, p in params.items() if n.endswith(HIDDEN_MATRICES)}
    others = {n: p for n, p in params.items() if n not in hidden}
    adam = adamw(others, cfg)
    bufs = {n: torch.zeros_like(p) for n, p in hidden.items()}
    m = cfg.muon_momentum
    losses = []
    for loss, lr in clipped_steps(params, cfg, steps):
        losses.append(loss)
        adamw_step(adam, lr)
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
