"""One rank's op shapes for a model config, random inputs for them, and one call of each op.

Why and how: docs/engine/ops.md, section `engine/ops/workloads.py`.
"""

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig
from engine.ops.rope.tables import rope_tables

__all__ = ["OpShapes", "op_shapes", "make_inputs", "grad_leaves", "call_op", "op_flops", "op_bytes",
           "rank_callable", "synthetic_documents", "rope_qk"]


@dataclass(kw_only=True, frozen=True)
class OpShapes:
    """Per-rank shapes of the hot ops for one micro-batch."""

    batch: int
    seq: int
    hidden: int
    heads_q: int
    heads_kv: int
    head_dim: int
    ffn_local: int
    vocab_local: int
    vocab_size: int
    vocab_start: int
    tp: int
    eps: float
    residual_scale: float
    documents: bool = False  # attention within packed documents (--document-mask)
    rope_theta: float = 10000.0
    reset_positions: bool = False  # RoPE positions restart per document (--reset-position-ids)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def op_shapes(cfg: EngineConfig, tp: int | None = None, tp_rank: int = 0) -> OpShapes:
    """Shapes one TP rank sees (tp defaults to cfg.tp); vocab padded to vocab_pad_multiple x tp."""
    tp = cfg.tp if tp is None else tp
    multiple = cfg.vocab_pad_multiple * tp
    padded = math.ceil(cfg.vocab_size / multiple) * multiple
    vocab_local = padded // tp
    residual_scale = cfg.scale_depth / math.sqrt(cfg.num_layers) if cfg.mup else 1.0
    return OpShapes(batch=cfg.micro_batch_size, seq=cfg.seq_length, hidden=cfg.hidden_size,
                    heads_q=cfg.num_heads // tp, heads_kv=max(1, cfg.num_kv_heads // tp), head_dim=cfg.head_dim,
                    ffn_local=cfg.ffn_hidden_size // tp, vocab_local=vocab_local, vocab_size=cfg.vocab_size,
                    vocab_start=tp_rank * vocab_local, tp=tp, eps=cfg.rms_norm_eps, residual_scale=residual_scale,
                    documents=cfg.document_mask, rope_theta=cfg.rope_theta,
                    reset_positions=cfg.document_mask and cfg.reset_position_ids)


def synthetic_documents(batch: int, seq: int, *, seed: int, device: torch.device | str) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32 on `device`, max_seqlen) of documents packed into `batch` rows of `seq` tokens, as
    engine/model/documents.py lays them out. Lengths are exponential with mean seq / 4 (a few documents
    per window, some short, one cut by each row's end), drawn on the host from `seed`."""
    g = torch.Generator().manual_seed(seed)
    offsets, longest = [0], 1
    for row in range(batch):
        start, end = row * seq, (row + 1) * seq
        while start < end:
            n = min(end - start, 1 + int(torch.empty(()).exponential_(4.0 / seq, generator=g)))
            start += n
            offsets.append(start)
            longest = max(longest, n)
    return torch.tensor(offsets, dtype=torch.int32, device=device), longest


def make_inputs(op: str, s: OpShapes, *, device: torch.device | str, dtype: torch.dtype, seed: int,
                residual: bool = True) -> dict[str, Any]:
    """Fresh random inputs for one call of `op`; float tensors that the op differentiates require grad."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int, std: float = 1.0) -> torch.Tensor:
        t = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
        return (t * std).to(dtype).requires_grad_()

    if op == "attention":
        inputs = {"q": rand(s.batch, s.seq, s.heads_q, s.head_dim), "k": rand(s.batch, s.seq, s.heads_kv, s.head_dim),
                  "v": rand(s.batch, s.seq, s.heads_kv, s.head_dim)}
        if s.documents:
            inputs["cu_seqlens"], inputs["max_seqlen"] = synthetic_documents(s.batch, s.seq, seed=seed, device=device)
        return inputs
    if op == "rmsnorm":
        weight = (1.0 + 0.1 * torch.randn(s.hidden, generator=g, device=device)).to(dtype).requires_grad_()
        inputs = {"x": rand(s.tokens, s.hidden), "weight": weight}
        if residual:
            inputs["residual"] = rand(s.tokens, s.hidden)
        return inputs
    if op == "gemm_fc1":
        return {"x": rand(s.tokens, s.hidden), "w": rand(2 * s.ffn_local, s.hidden, std=s.hidden ** -0.5)}
    if op == "rope":
        cos, sin = rope_tables(s.head_dim, s.rope_theta, s.seq, device)
        inputs = {"qkv": rand(s.batch, s.seq, (s.heads_q + 2 * s.heads_kv) * s.head_dim), "cos": cos, "sin": sin}
        if s.reset_positions:
            inputs["cu_seqlens"], inputs["max_seqlen"] = synthetic_documents(s.batch, s.seq, seed=seed, device=device)
        return inputs
    if op == "gemm_output":
        labels = torch.randint(0, s.vocab_size, (s.tokens,), generator=g, device=device)
        labels[torch.rand(s.tokens, generator=g, device=device) < 0.05] = -100  # some ignored positions
        return {"h": rand(s.tokens, s.hidden), "w": rand(s.vocab_local, s.hidden, std=s.hidden ** -0.5),
                "labels": labels}
    raise ValueError(f"unknown op {op!r}")


def grad_leaves(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The inputs that receive gradients, by name."""
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad}


def call_op(op: str, fn: Callable[..., Any], inputs: dict[str, Any], s: OpShapes) -> list[torch.Tensor]:
    """One forward call as the model makes it; returns the op's outputs as a list."""
    if op == "attention":
        documents = {k: inputs[k] for k in ("cu_seqlens", "max_seqlen") if k in inputs}
        return [fn(inputs["q"], inputs["k"], inputs["v"], softmax_scale=1.0 / math.sqrt(s.head_dim), **documents)]
    if op == "rmsnorm":
        if "residual" in inputs:
            out, summed = fn(inputs["x"], inputs["weight"], eps=s.eps, residual=inputs["residual"],
                             residual_scale=s.residual_scale)
            return [out, summed]
        return [fn(inputs["x"], inputs["weight"], eps=s.eps)]
    if op == "gemm_fc1":
        return [fn(inputs["x"], inputs["w"])]
    if op == "gemm_output":
        return [fn(inputs["h"], inputs["w"], inputs["labels"], vocab_start=s.vocab_start, vocab_size=s.vocab_size)]
    if op == "rope":
        q, k = rope_qk(inputs["qkv"], s.heads_q, s.heads_kv, s.head_dim)
        documents = {key: inputs[key] for key in ("cu_seqlens", "max_seqlen") if key in inputs}
        return list(fn(q, k, inputs["cos"], inputs["sin"], **documents))
    raise ValueError(f"unknown op {op!r}")


def rope_qk(qkv: torch.Tensor, heads_q: int, heads_kv: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, s, hq, d] and k [b, s, hkv, d] as strided views of a packed QKV projection [b, s, (hq + 2 hkv) d]: the
    layout engine/model/layers.py hands ops.rope."""
    b, s, d = qkv.shape[0], qkv.shape[1], head_dim
    q = qkv[..., :heads_q * d].view(b, s, heads_q, d)
    k = qkv[..., heads_q * d:(heads_q + heads_kv) * d].view(b, s, heads_kv, d)
    return q, k


def rank_callable(op: str, fn: Callable[..., Any], s: OpShapes) -> Callable[..., Any]:
    """What one rank of a TP > 1 run executes, callable in one process without a process group.

    gemm_output versions with a vocab-parallel path expose `gemm_output_vocab_parallel_local`
    (that path minus its collectives); everything else is the op itself.
    """
    if op == "gemm_output" and s.tp > 1:
        # guard: allow isolation -- the version's own module, which the registry imported
        local = getattr(sys.modules.get(fn.__module__), "gemm_output_vocab_parallel_local", None)
        if local is not None:
            return local
    return fn


def op_flops(op: str, s: OpShapes, *, backward: bool) -> float:
    """Model FLOPs of one call (forward, or forward + backward); rmsnorm and rope count 0 (bandwidth-bound).

    GEMMs: 2 m n k forward, twice that backward. Causal attention: 2 matmuls of b hq s^2 d / 2
    multiply-adds forward (4 b hq s^2 d / 2 FLOPs), backward 2.5x forward (FlashAttention's count).
    Attention within documents is counted as the whole window's causal attention (as MFU counts it):
    its rate is an equivalent dense one.
    """
    if op == "attention":
        fwd = 2.0 * s.batch * s.heads_q * s.seq * s.seq * s.head_dim
        return fwd * (3.5 if backward else 1.0)
    if op == "gemm_fc1":
        fwd = 2.0 * s.tokens * s.hidden * 2 * s.ffn_local
    elif op == "gemm_output":
        fwd = 2.0 * s.tokens * s.hidden * s.vocab_local
    else:
        return 0.0
    return fwd * (3.0 if backward else 1.0)


def op_bytes(op: str, s: OpShapes, *, backward: bool, itemsize: int = 2) -> float:
    """Fewest bytes rmsnorm and rope must move (each input read once, each output written once)."""
    if op == "rope":  # read q and k, write them rotated; backward the same for their gradients
        n = s.tokens * (s.heads_q + s.heads_kv) * s.head_dim * itemsize
        return 2 * n * (2 if backward else 1)
    if op != "rmsnorm":
        return 0.0
    n = s.tokens * s.hidden * itemsize
    fwd = 4 * n  # read x, residual; write out, s
    return fwd + (4 * n if backward else 0)  # read dout, ds_out, s; write dx (d residual aliases)
