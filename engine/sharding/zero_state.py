"""Optimizer state in a checkpoint, in a form DCP can reshard across data-parallel sizes.

Why and how: docs/engine/sharding.md, section `engine/sharding/zero_state.py`.
"""

from typing import Any, Callable

import torch
# guard: allow public-surface -- DCP reshards irregular 1-D pieces only as ShardedTensor, which torch keeps in _shard
from torch.distributed._shard import sharded_tensor as st

from engine.distributed import ParallelState
from engine.optim import MixedPrecisionAdamW, Muon
from engine.optim.buffers import FlatBuffers

__all__ = ["optimizer_state", "load_optimizer_state", "KINDS", "sharded_piece", "state_prefix"]

KINDS = ("master", "exp_avg", "exp_avg_sq")


def state_prefix(par: ParallelState) -> str:
    return f"tp{par.tp_rank}/" if par.tp_size > 1 else ""


def _pieces(buffers: FlatBuffers, par: ParallelState) -> dict[str, list[tuple[int, int, int]]]:
    """Parameter name -> [(global rank, lo, hi)] pieces of the flattened parameter, over this TP rank's DP group."""
    out: dict[str, list[tuple[int, int, int]]] = {e.name: [] for e in buffers.entries}
    for d in range(par.dp_size):
        rank = d * par.tp_size + par.tp_rank
        for b, (lo, hi) in zip(buffers.buckets, buffers.shard_ranges(d)):
            for e in b.entries:
                a, z = max(lo, e.start), min(hi, e.end)
                if a < z:
                    out[e.name].append((rank, a - e.start, z - e.start))
    return out


def sharded_piece(local: torch.Tensor, numel: int, pieces: list[tuple[int, int, int]], rank: int) -> "st.ShardedTensor":
    """The flattened global tensor of `numel` elements cut into `pieces` (global rank, lo, hi), this rank's being `local`
    (also --fsdp's, engine/sharding/fsdp.py)."""
    device = str(local.device)
    metas = [st.ShardMetadata(shard_offsets=[lo], shard_sizes=[hi - lo], placement=f"rank:{r}/{device}")
             for r, lo, hi in pieces]
    mine = [st.Shard(local, m) for (r, _, _), m in zip(pieces, metas) if r == rank]
    meta = st.ShardedTensorMetadata(shards_metadata=metas, size=torch.Size([numel]),
                                    tensor_properties=st.TensorProperties(dtype=local.dtype))
    # every rank knows every piece (shard_ranges is a pure function of the layout): no collective needed
    return st.ShardedTensor._init_from_local_shards_and_global_metadata(mine, meta)  # guard: allow public-surface -- see the import


def optimizer_state(optimizer: MixedPrecisionAdamW, par: ParallelState,
                    stage: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
                    muon: Muon | None = None) -> dict[str, Any]:
    """This rank's masters and moments (and Muon's masters and momentum), keyed for DCP: the tensors
    themselves, so a load is in place, or `stage(key, tensor)` of each (an asynchronous save's host copy,
    which training cannot change)."""
    prefix = state_prefix(par)
    copy = stage or (lambda key, t: t)
    out: dict[str, Any] = {}
    if muon is not None:
        out.update({prefix + k: copy(prefix + k, v) for k, v in muon.state_tensors().items()})
    if par.dp_size == 1:
        return out | {prefix + k: copy(prefix + k, v) for k, v in optimizer.state_tensors().items()}
    pieces = _pieces(optimizer.buffers, par)
    for s in optimizer.segments:
        exp_avg, exp_avg_sq = optimizer.moments(s)
        for kind, tensor in zip(KINDS, (s.master, exp_avg, exp_avg_sq)):
            key = f"{prefix}{kind}/{s.entry.name}"
            out[key] = sharded_piece(copy(key, tensor), s.entry.numel, pieces[s.entry.name], par.rank)
    return out


def load_optimizer_state(optimizer: MixedPrecisionAdamW, state: dict[str, Any], par: ParallelState,
                         adam_step: int, muon: Muon | None = None) -> None:
    """Install what DCP loaded into `state` (a dict built by optimizer_state). With DP > 1 each rank
    rewrites only its own slices of the parameters (Muon's matrices: shared by their owners here): gather
    them afterwards. Collective over the DP group with Muon."""
    prefix = state_prefix(par)
    if muon is not None:
        muon.load_state_tensors({k[len(prefix):]: v for k, v in state.items() if k[len(prefix):] in muon.state_tensors()})
    if par.dp_size == 1:
        optimizer.load_state_tensors({k[len(prefix):]: v for k, v in state.items()}, adam_step)
        return
    for s in optimizer.segments:
        values = [state[f"{prefix}{kind}/{s.entry.name}"].local_shards()[0].tensor for kind in KINDS]
        optimizer.load_segment(s, *values, adam_step)
