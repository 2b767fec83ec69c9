"""Building blocks of the MiniCPM4 decoder, written for tensor parallelism from the start.

Why and how: docs/engine/model.md, section `engine/model/layers.py`.
"""

import math

import torch
from torch import nn

from engine.config import EngineConfig
from engine.distributed.fp8 import Fp8Recipe, keeps_fp8
from engine.errors import ConfigError
from engine.distributed import (ParallelState, TPComm, column_input, column_parallel_linear, copy_to_tp,
                                fused_embedding, fused_linear, main_grad_of, mlp_region, reduce_from_tp, row_output,
                                row_parallel_linear)
from engine.model.documents import DocumentLayout
from engine.model.init import Initializer
from engine.model.tp_grads import GradSum, TPGradNeed
from engine.ops import OpSet
from engine.ops.rope.tables import rope_tables

__all__ = ["RMSNormWeight", "Rotary", "Attention", "MLP", "VocabEmbedding", "DecoderLayer", "kv_head_range", "tp_comm"]


def tp_comm(cfg: EngineConfig, par: ParallelState, ops: OpSet | None = None) -> TPComm:
    """The layer's TPComm; with --fp8 and the run's ops, its recipe carries the fp8_cast and fp8_wgrad versions
    they resolved and --fp8-fast-accum (a layer without FP8 GEMMs passes no ops)."""
    fp8: str = cfg.fp8
    if fp8 != "off" and ops is not None:
        if ops.fp8_cast is None or ops.fp8_wgrad is None:
            raise ConfigError("--fp8", fp8, "build the layer's ops with engine.ops.resolve_ops(cfg, device)",
                              "needs the fp8_cast and fp8_wgrad ops, and these ops were resolved without them")
        fp8 = Fp8Recipe(fp8, ops.fp8_cast, ops.fp8_wgrad, cfg.fp8_fast_accum)
    return TPComm(size=par.tp_size, group=par.tp_group, sequence_parallel=cfg.sequence_parallel and par.tp_size > 1,
                  overlap=cfg.tp_comm_overlap, fwd_chunks=cfg.tp_fwd_chunks, fp8=fp8)


def kv_head_range(num_kv_heads: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """KV heads this TP rank holds. With more TP ranks than KV heads, each head is replicated on
    tp_size / num_kv_heads consecutive ranks (their gradients are then summed over those ranks)."""
    if tp_size <= num_kv_heads:
        per = num_kv_heads // tp_size
        return tp_rank * per, (tp_rank + 1) * per
    head = tp_rank // (tp_size // num_kv_heads)
    return head, head + 1


class RMSNormWeight(nn.Module):
    """The learnable gain of an RMSNorm (replicated on every TP rank); the math is ops.rmsnorm."""

    def __init__(self, size: int, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device=device, dtype=dtype))

    def init_shard(self, init: Initializer, name: str) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def tp_grad_needs(self, par: ParallelState, sequence_parallel: bool) -> list[TPGradNeed]:
        """Replicated: counted once in the grad norm. Under sequence parallelism each rank saw only its block of
        tokens, so its gradient is a partial sum over the TP group."""
        whole = GradSum(self.weight, 0, self.weight.numel(), par.tp_group) if sequence_parallel else None
        return [TPGradNeed(self.weight, replicated=True, sum=whole)]


class Rotary(nn.Module):
    """RoPE's cos / sin tables (engine/ops/rope/tables.py: HF Llama's rotate-half convention, so exported
    weights need no permutation); the rotation itself is ops.rope."""

    def __init__(self, head_dim: int, theta: float, max_seq: int, device: torch.device | str):
        super().__init__()
        self.head_dim, self.theta, self.max_seq = head_dim, theta, max_seq
        self.register_buffer("cos", torch.empty(max_seq, head_dim, device=device), persistent=False)
        self.register_buffer("sin", torch.empty(max_seq, head_dim, device=device), persistent=False)

    def init_shard(self, init: Initializer, name: str) -> None:
        cos, sin = rope_tables(self.head_dim, self.theta, self.max_seq, self.cos.device)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)


class Attention(nn.Module):
    """GQA self-attention: column-parallel fused QKV, causal attention op, row-parallel O."""

    fp8_linear_weights = ("qkv", "o")  # the weights its linears run in FP8 with --fp8 (--fsdp-fp8-all-gather)

    def __init__(self, cfg: EngineConfig, par: ParallelState, ops: OpSet, device, dtype):
        super().__init__()
        self.par, self.ops, self.tp = par, ops, tp_comm(cfg, par, ops)
        self.head_dim = cfg.head_dim
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.q_heads = cfg.num_heads // par.tp_size
        self.kv_lo, self.kv_hi = kv_head_range(cfg.num_kv_heads, par.tp_rank, par.tp_size)
        self.kv_heads = self.kv_hi - self.kv_lo
        self.hidden = cfg.hidden_size
        rows = (self.q_heads + 2 * self.kv_heads) * cfg.head_dim
        self.qkv = nn.Parameter(torch.empty(rows, cfg.hidden_size, device=device, dtype=dtype))
        self.o = nn.Parameter(torch.empty(cfg.hidden_size, self.q_heads * cfg.head_dim, device=device, dtype=dtype))
        self.softmax_scale = 1.0 / math.sqrt(cfg.head_dim)

    def init_shard(self, init: Initializer, name: str) -> None:
        d, r = self.head_dim, self.par.tp_rank
        q_rows = slice(r * self.q_heads * d, (r + 1) * self.q_heads * d)
        kv_rows = slice(self.kv_lo * d, self.kv_hi * d)
        with torch.no_grad():
            q = init.matrix(f"{name}.wq", (self.num_heads * d, self.hidden))[q_rows]
            k = init.matrix(f"{name}.wk", (self.num_kv_heads * d, self.hidden))[kv_rows]
            v = init.matrix(f"{name}.wv", (self.num_kv_heads * d, self.hidden))[kv_rows]
            self.qkv.copy_(torch.cat([q, k, v]))
            o = init.residual_out(f"{name}.wo", (self.hidden, self.num_heads * d))
            self.o.copy_(o[:, q_rows])

    @property
    def kv_rows(self) -> tuple[int, int]:
        """Rows of `qkv` holding K and V (replicated over `tp / num_kv_heads` ranks when TP > KV heads)."""
        q = self.q_heads * self.head_dim
        return q, q + 2 * self.kv_heads * self.head_dim

    def tp_grad_needs(self, par: ParallelState, sequence_parallel: bool) -> list[TPGradNeed]:
        """With more TP ranks than KV heads, `tp / kv_heads` consecutive ranks hold the same K/V rows, each computing
        the part of their gradient that flows through its own query heads: the true gradient is the sum over
        `kv_group`, and only the group's first rank counts those rows in the grad norm."""
        replicas = par.tp_size // self.num_kv_heads if par.tp_size > self.num_kv_heads else 1
        if replicas == 1:
            return []
        width = self.qkv.shape[1]
        lo, hi = (row * width for row in self.kv_rows)
        duplicate = (lo, hi) if par.tp_rank % replicas else None
        return [TPGradNeed(self.qkv, sum=GradSum(self.qkv, lo, hi, par.kv_group), duplicate=duplicate)]

    def forward(self, x: torch.Tensor, rotary: Rotary, seq_len: int,
                documents: DocumentLayout | None = None) -> torch.Tensor:
        if self.tp.size == 1:
            b, s, _ = x.shape
            x = copy_to_tp(x, self.par.tp_group, self.par.tp_size)
            qkv = fused_linear(x, self.qkv, self.tp.fp8)
        else:
            qkv = column_parallel_linear(x, self.qkv, self.tp)
            qkv = qkv.view(-1, seq_len, qkv.shape[-1])  # SP: [n, rows] -> [b, s, rows]
            b, s = qkv.shape[:2]
        d = self.head_dim
        q, k, v = qkv.split([self.q_heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        # Positions restart per document only with --reset-position-ids.
        restart = {"cu_seqlens": documents.cu_seqlens, "max_seqlen": documents.max_seqlen} \
            if documents is not None and documents.reset_positions else {}
        q, k = self.ops.rope(q.view(b, s, self.q_heads, d), k.view(b, s, self.kv_heads, d), rotary.cos, rotary.sin,
                             **restart)
        v = v.view(b, s, self.kv_heads, d)
        if documents is None:  # versions without document support keep working for plain causal runs
            out = self.ops.attention(q, k, v, softmax_scale=self.softmax_scale)
        else:
            out = self.ops.attention(q, k, v, softmax_scale=self.softmax_scale, cu_seqlens=documents.cu_seqlens,
                                     max_seqlen=documents.max_seqlen)
        out = out.reshape(b, s, self.q_heads * d)
        if self.tp.size == 1:
            return reduce_from_tp(fused_linear(out, self.o, self.tp.fp8), self.par.tp_group, self.par.tp_size)
        return row_parallel_linear(out, self.o, self.tp)


class MLP(nn.Module):
    """SwiGLU: column-parallel fused [gate; up] FC1 (ops.gemm_fc1), row-parallel FC2."""

    fp8_linear_weights = ("fc1", "fc2")  # (see Attention)

    def __init__(self, cfg: EngineConfig, par: ParallelState, ops: OpSet, device, dtype):
        super().__init__()
        self.par, self.ops, self.tp = par, ops, tp_comm(cfg, par, ops)
        self.ffn, self.hidden = cfg.ffn_hidden_size, cfg.hidden_size
        self.local = cfg.ffn_hidden_size // par.tp_size
        self.fc1 = nn.Parameter(torch.empty(2 * self.local, cfg.hidden_size, device=device, dtype=dtype))
        self.fc2 = nn.Parameter(torch.empty(cfg.hidden_size, self.local, device=device, dtype=dtype))

    def init_shard(self, init: Initializer, name: str) -> None:
        rows = slice(self.par.tp_rank * self.local, (self.par.tp_rank + 1) * self.local)
        with torch.no_grad():
            gate = init.matrix(f"{name}.w_gate", (self.ffn, self.hidden))[rows]
            up = init.matrix(f"{name}.w_up", (self.ffn, self.hidden))[rows]
            self.fc1.copy_(torch.cat([gate, up]))
            self.fc2.copy_(init.residual_out(f"{name}.w_down", (self.hidden, self.ffn))[:, rows])

    def _fc1(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, h's amax or None): the op, with fc1's fp32 gradient accumulator when gradient-accumulation fusion is
        on; --fp8 passes its recipe (only then: versions without an FP8 path are refused at start,
        engine/ops/dispatch.py), and tensorwise asks for h's amax too: FC2's input is h, whose one-scale cast then
        skips its reduction where the op took it (engine/ops/gemm_fc1/register.toml)."""
        main = main_grad_of(self.fc1)
        if keeps_fp8(self.tp.fp8):
            return self.ops.gemm_fc1(x, self.fc1, main_grad=main, fp8=self.tp.fp8, amax=True)
        if self.tp.fp8 != "off":
            return self.ops.gemm_fc1(x, self.fc1, main_grad=main, fp8=self.tp.fp8), None
        return self.ops.gemm_fc1(x, self.fc1, main_grad=main), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            x = copy_to_tp(x, self.par.tp_group, self.par.tp_size)
            h, amax = self._fc1(x)
            out = fused_linear(h, self.fc2, self.tp.fp8, x_amax=amax)
            return reduce_from_tp(out, self.par.tp_group, self.par.tp_size)
        if self.tp.overlap:  # FC1's input-gradient collective overlaps FC2's weight-gradient GEMM
            x, fc2, hand_over = mlp_region(x, self.fc2, self.tp)
            h, amax = self._fc1(x)
            return row_parallel_linear(h, fc2, self.tp, sink=hand_over, x_amax=amax)
        h, amax = self._fc1(column_input(x, self.tp))
        return row_parallel_linear(h, self.fc2, self.tp, x_amax=amax)


class VocabEmbedding(nn.Module):
    """Vocab-parallel embedding over the padded vocabulary: each rank looks up its rows, zeroes the
    tokens it does not own, and the partial embeddings are summed across TP."""

    def __init__(self, cfg: EngineConfig, par: ParallelState, device, dtype):
        super().__init__()
        self.par, self.tp = par, tp_comm(cfg, par)
        self.padded = cfg.padded_vocab_size
        self.local = self.padded // par.tp_size
        self.start = par.tp_rank * self.local
        self.hidden = cfg.hidden_size
        self.weight = nn.Parameter(torch.empty(self.local, cfg.hidden_size, device=device, dtype=dtype))

    def init_shard(self, init: Initializer, name: str) -> None:
        with torch.no_grad():
            full = init.embedding(name, (self.padded, self.hidden))
            self.weight.copy_(full[self.start:self.start + self.local])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.par.tp_size == 1:
            return fused_embedding(tokens, self.weight)
        local = tokens - self.start
        outside = (local < 0) | (local >= self.local)
        out = fused_embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return row_output(out, self.tp)


class DecoderLayer(nn.Module):
    """Pre-norm block. The residual stream and the last branch output travel separately so the
    norm can fuse `residual += scale * branch` (MiniCPM's depth scaling) into one kernel."""

    def __init__(self, cfg: EngineConfig, par: ParallelState, ops: OpSet, device, dtype):
        super().__init__()
        self.ops, self.eps = ops, cfg.rms_norm_eps
        self.residual_scale = cfg.scale_depth / math.sqrt(cfg.num_layers) if cfg.mup else 1.0
        self.attn_norm = RMSNormWeight(cfg.hidden_size, device, dtype)
        self.attn = Attention(cfg, par, ops, device, dtype)
        self.mlp_norm = RMSNormWeight(cfg.hidden_size, device, dtype)
        self.mlp = MLP(cfg, par, ops, device, dtype)

    def forward(self, residual: torch.Tensor, branch: torch.Tensor | None, rotary: Rotary, seq_len: int,
                documents: DocumentLayout | None = None):
        if branch is None:  # first layer: the residual stream is the embedding output
            hidden = self.ops.rmsnorm(residual, self.attn_norm.weight, eps=self.eps)
        else:
            hidden, residual = self.ops.rmsnorm(branch, self.attn_norm.weight, eps=self.eps,
                                                residual=residual, residual_scale=self.residual_scale)
        branch = self.attn(hidden, rotary, seq_len, documents)
        hidden, residual = self.ops.rmsnorm(branch, self.mlp_norm.weight, eps=self.eps,
                                            residual=residual, residual_scale=self.residual_scale)
        return residual, self.mlp(hidden)
