"""Muon for the hidden matrices (--optimizer muon): momentum, orthogonalised by Newton-Schulz iterations.

Per logical matrix W (A x B) and step, with g its clipped fp32 gradient (Keller Jordan's Muon, as in
modded-nanogpt; the scale is Moonlight's):
    buf <- m buf + (1 - m) g                          fp32 momentum, m = --muon-momentum
    u   <- (1 - m) g + m buf   (--muon-nesterov)      else u = buf
    O   <- NS_k(u)                                    ~ U V^T of u = U S V^T, k = --muon-ns-steps
    W   <- W (1 - lr_t wd) - lr_t rms sqrt(max(A, B)) O,    lr_t = lr(step) x the tensor's muP multiplier
NS_k is the quintic Newton-Schulz iteration X <- a X + (b X X^T + c (X X^T)^2) X on X = u / ||u||_F with
Keller Jordan's coefficients (a, b, c) = (3.4445, -4.7750, 2.0315), run on the wide orientation (A <= B).
It maps every singular value s of X to p^k(s), p(s) = a s + b s^3 + c s^5: small ones are pushed up fast and
all of them end in a band around 1 ([0.68, 1.21] after 5 steps for s >= 0.03, not exactly 1: the coefficients buy speed with
that slack; tests/engine/test_muon.py checks the band). It runs in the compute dtype: bf16 on GPU (as
modded-nanogpt; NS is stable in bf16), fp32 on CPU, where bf16 matmuls are slow emulation.

Which matrices: the logical matrices of attention and MLP, each on its own: Q, K, V (row blocks of the fused
QKV parameter), O, gate and up (row blocks of the fused FC1), down (FC2). Fusion is a layout choice; NS of the
concatenation would couple the spectra of Q, K and V (modded-nanogpt also orthogonalises its fused QKV per
matrix). The embedding (a lookup table), the norm gains (vectors) and the LM head (the readout) train with
AdamW (engine/optim/optimizer.py), as Muon prescribes.

Scale, and how it meets muP: Moonlight's rms x sqrt(max(A, B)) (Liu et al. 2025, "Muon is Scalable for LLM
Training") with rms = --muon-update-rms = 0.2. An A x B matrix with orthonormal rows or columns has RMS
1 / sqrt(max(A, B)), so the update's RMS is `rms` whatever the shape, about what AdamW's updates have. Why this
and not Keller Jordan's max(1, A / B)^0.5: with the update RMS pinned to AdamW's, AdamW's hyperparameters carry
over unchanged (--lr, --weight-decay, the schedule) and so do muP's per-tensor multipliers
(engine/optim/mup.py): muP-Adam trains the hidden matrices at lr / width_mult because each element's update
has a width-independent size, which is what this scale gives Muon too. So a Muon matrix's lr and decoupled
decay are exactly the ones AdamW would give it (lr x multiplier, the `[RUN] optim lr multipliers` line).

Parallelism:
- TP: a rank holds a block of each logical matrix (rows of Q/K/V/gate/up, columns of O/down). The update is
  that of the FULL logical matrix: the TP group all-gathers the momentum-updated shards, assembles each
  matrix (a KV head replicated on tp / kv_heads ranks is taken once), runs NS (each TP rank the same,
  redundantly: one all-gather and no scatter back) and keeps its own block.
- ZeRO-1 (DP > 1): whole matrices are assigned to DP ranks (largest first, to the least loaded; the same on
  every rank), never flat ranges, since NS needs the whole matrix. The owner alone keeps the fp32 master and
  momentum (8 bytes per parameter) and steps it. Per step this costs an all-gather of the gradient buckets
  that hold Muon matrices (the reduce-scatter left each rank only its range; the gradients are clipped
  first, so every rank's range arrives clipped) and one broadcast per DP rank of its matrices' new values in
  the model dtype; the bucketed parameter all-gather that follows then carries consistent values.
Checkpoint (engine/sharding/zero_state.py): `master/<name>` (AdamW's key: export-hf reads it) and
`muon_momentum/<name>`, full tensors written by the owner; keyed by name, so a run resumes on any DP size.
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
    """~ U V^T of g = U S V^T (singular values into a band around 1, see the module docstring), in fp32;
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
