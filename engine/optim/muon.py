"""Muon for the hidden matrices (--optimizer muon): momentum, orthogonalised by Newton-Schulz iterations.

Why and how: docs/engine/optim.md, section `engine/optim/muon.py`.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.distributed.collectives import all_gather_flat, all_gather_new
from engine.model.layers import MLP, Attention
from engine.optim.buffers import FlatBuffers

__all__ = ["QUINTIC", "newton_schulz", "MatrixPart", "muon_parts", "assign_owners", "Muon"]

QUINTIC = (3.4445, -4.7750, 2.0315)


def newton_schulz(g: torch.Tensor, steps: int, dtype: torch.dtype) -> torch.Tensor:
    """~ U V^T of g = U S V^T (singular values into a band around 1, docs/engine/optim.md), in fp32;
    the iterations run in `dtype`."""
    a, b, c = QUINTIC
    g = g.float()
    x = (g / (g.norm() + 1e-7)).to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:  # X X^T is then the smaller Gram matrix
        x = x.mT
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return (x.mT if tall else x).float()


@dataclass(frozen=True)
class MatrixPart:
    """One logical matrix inside a (TP-sharded) parameter: `rows` of the local shard, split over TP along
    `tp_dim` (0: rows, 1: columns), each block held by `replicas` consecutive TP ranks."""

    label: str
    rows: slice
    tp_dim: int
    replicas: int = 1


def muon_parts(model: nn.Module, cfg: EngineConfig, par: ParallelState) -> dict[str, list[MatrixPart]]:
    """Parameter name -> its logical matrices, for every hidden matrix (the ones muP calls hidden)."""
    kv_replicas = par.tp_size // cfg.num_kv_heads if par.tp_size > cfg.num_kv_heads else 1
    out: dict[str, list[MatrixPart]] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, Attention):
            q, kv = module.q_heads * module.head_dim, module.kv_heads * module.head_dim
            out[f"{prefix}.qkv"] = [MatrixPart("q", slice(0, q), 0), MatrixPart("k", slice(q, q + kv), 0, kv_replicas),
                                    MatrixPart("v", slice(q + kv, q + 2 * kv), 0, kv_replicas)]
            out[f"{prefix}.o"] = [MatrixPart("o", slice(None), 1)]
        elif isinstance(module, MLP):
            out[f"{prefix}.fc1"] = [MatrixPart("gate", slice(0, module.local), 0),
                                    MatrixPart("up", slice(module.local, 2 * module.local), 0)]
            out[f"{prefix}.fc2"] = [MatrixPart("down", slice(None), 1)]
    return out


def assign_owners(sizes: Mapping[str, int], dp_size: int) -> dict[str, int]:
    """Name -> owning DP rank: largest first, each to the least loaded rank (ties: the lower rank).
    A pure function of the names and sizes, so every rank computes the same answer without talking."""
    load = [0] * dp_size
    owner: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(dp_size), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += sizes[name]
    return owner


class Muon:
    def __init__(self, buffers: FlatBuffers, cfg: EngineConfig, par: ParallelState, lr_multipliers: Mapping[str, float],
                 parts: Mapping[str, list[MatrixPart]], ns_dtype: torch.dtype):
        self.buffers, self.cfg, self.par, self.parts, self.ns_dtype = buffers, cfg, par, dict(parts), ns_dtype
        self.entries = {e.name: e for e in buffers.entries if e.name in parts}
        assert len(self.entries) == len(parts), "a Muon matrix is not in the flat buffers"
        self.multipliers = {name: float(lr_multipliers[name]) for name in parts}
        self.owner = assign_owners({n: e.numel for n, e in self.entries.items()}, par.dp_size)
        self.mine = [n for n in parts if self.owner[n] == par.dp_rank]  # model order: the same on every TP rank
        self.master = {n: self._param(n).detach().float().clone() for n in self.mine}
        self.momentum = {n: torch.zeros_like(self.master[n]) for n in self.mine}
        self._grad_buckets = [b for b in buffers.buckets if any(e.name in parts for e in b.entries)]

    def _param(self, name: str) -> torch.Tensor:
        e = self.entries[name]
        return self.buffers.params[e.start:e.end].view_as(e.param)

    def describe(self) -> str:
        """One header line: what Muon steps, how, and this rank's share."""
        labels = sorted({p.label for ps in self.parts.values() for p in ps})
        owned = sum(self.entries[n].numel for n in self.mine)
        return (f"[RUN] optim muon: {sum(len(p) for p in self.parts.values())} matrices ({'/'.join(labels)}), "
                f"momentum {self.cfg.muon_momentum:g}{' nesterov' if self.cfg.muon_nesterov else ''}, "
                f"{self.cfg.muon_ns_steps} Newton-Schulz steps in {str(self.ns_dtype).removeprefix('torch.')}, update x "
                f"{self.cfg.muon_update_rms:g} sqrt(max(rows, cols)) at the AdamW lr and multipliers; AdamW: the other "
                f"tensors; ZeRO-1: whole matrices per DP rank ({len(self.mine)} parameters, {owned} elements here)")

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """After the gradients are complete and clipped (MixedPrecisionAdamW.clip): collective over every rank."""
        if self.par.dp_size > 1:  # this rank's owned matrices need their whole (clipped) gradient
            for b in self._grad_buckets:
                all_gather_flat(self.buffers.grads[b.start:b.end], self.par.dp_rank, self.par.dp_group, self.par.dp_size)
        m, wd = self.cfg.muon_momentum, self.cfg.weight_decay
        for name in self.mine:
            e = self.entries[name]
            grad = self.buffers.grad_view(e)
            buf = self.momentum[name]
            buf.lerp_(grad, 1.0 - m)
            update = self._orthogonal(name, grad.lerp(buf, m) if self.cfg.muon_nesterov else buf)
            lr_t = lr * self.multipliers[name]
            master = self.master[name]
            master.mul_(1.0 - lr_t * wd)
            master.add_(update, alpha=-lr_t)
            self._param(name).copy_(master)
        self._share()

    def _orthogonal(self, name: str, u: torch.Tensor) -> torch.Tensor:
        """The scaled orthogonalised update of this rank's shard `u`, computed on the full logical matrices."""
        tp = self.par.tp_size
        shards = u.unsqueeze(0) if tp == 1 else all_gather_new(u.unsqueeze(0), self.par.tp_group, tp)[0]
        out = torch.empty_like(u)
        for part in self.parts[name]:
            blocks = [shards[k][part.rows] for k in range(0, tp, part.replicas)]
            full = torch.cat(blocks, dim=part.tp_dim)
            ortho = newton_schulz(full, self.cfg.muon_ns_steps, self.ns_dtype)
            ortho *= self.cfg.muon_update_rms * math.sqrt(max(full.shape))
            out[part.rows] = ortho.chunk(len(blocks), dim=part.tp_dim)[self.par.tp_rank // part.replicas]
        return out

    def _share(self) -> None:
        """Each DP rank broadcasts its matrices' new values (model dtype) to the other DP ranks of its TP rank."""
        if self.par.dp_size == 1:
            return
        for d in range(self.par.dp_size):
            names = [n for n in self.parts if self.owner[n] == d]
            if not names:
                continue
            if d == self.par.dp_rank:
                flat = torch.cat([self._param(n).reshape(-1) for n in names])
            else:
                flat = torch.empty(sum(self.entries[n].numel for n in names), dtype=self.buffers.params.dtype,
                                   device=self.buffers.params.device)
            dist.broadcast(flat, src=d * self.par.tp_size + self.par.tp_rank, group=self.par.dp_group)
            if d != self.par.dp_rank:
                for n, values in zip(names, torch.split(flat, [self.entries[n].numel for n in names])):
                    self._param(n).copy_(values.view_as(self.entries[n].param))

    # --- checkpoint state: this rank's owned matrices, flattened (as AdamW's masters are) -------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for n in self.mine:
            out[f"master/{n}"] = self.master[n].view(-1)
            out[f"muon_momentum/{n}"] = self.momentum[n].view(-1)
        return out

    @torch.no_grad()
    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore masters and momentum (as state_tensors keys them), rewrite the parameters, share them over DP.
        Collective over the DP group."""
        for n in self.mine:
            self.master[n].view(-1).copy_(tensors[f"master/{n}"])
            self.momentum[n].view(-1).copy_(tensors[f"muon_momentum/{n}"])
            self._param(n).copy_(self.master[n])
        self._share()
