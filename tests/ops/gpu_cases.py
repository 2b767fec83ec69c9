"""Shapes and calls shared by the GPU version tests and the stress tests.

The shapes keep the compile-time sizes of the MiniCPM4 presets (hidden 4096, FFN shard 8192, vocab
shard 36736, head dims 128 and 64 with 16 query heads per KV head as 8B has, 8 as 0.5B has) so the
kernels compiled here are the ones bench/ops.py and training use (the on-disk cache then serves
them), with fewer tokens so each check runs in milliseconds. The `_documents` attention cases pack
synthetic documents into each row (as engine/ops/workloads.synthetic_documents lays them out) and pass `cu_seqlens` /
`max_seqlen` as --document-mask runs do: the FA4 versions' varlen path against the baseline's mask.

No engine import: `make` and `reference` run in the test's process (inputs; the op's contract in plain torch, the
fp32 reference of tests/ops/test_ops_versions_gpu.py), `call` runs where the op runs (the engine's process,
tests/ops/versions_gpu_calls.py, or the stress test's).
"""

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from harness.judge.opcases import rope_tables

__all__ = ["Case", "CASES", "cases_for", "case_named"]


@dataclass(kw_only=True, frozen=True)
class Case:
    op: str
    name: str
    make: Callable[[int, torch.dtype], dict[str, Any]]  # (seed, dtype) -> inputs on cuda (float leaves require grad)
    call: Callable[[Callable[..., Any], dict[str, Any]], list[torch.Tensor]]
    reference: Callable[[dict[str, Any]], list[torch.Tensor]]  # the contract in plain torch, on the inputs given


def _rand(g, *shape, dtype, std=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * std).to(dtype).requires_grad_()


def _documents(batch: int, seq: int, seed: int) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32 on cuda, max_seqlen) of documents packed into `batch` rows of `seq` tokens (rows never
    shared), as --document-mask runs pass them: lengths exponential with mean seq / 4, one cut by each row's end."""
    rng = random.Random(seed)
    offsets = [0]
    for row in range(batch):
        end = (row + 1) * seq
        while offsets[-1] < end:
            offsets.append(min(end, offsets[-1] + 1 + int(rng.expovariate(4.0 / seq))))
    return (torch.tensor(offsets, dtype=torch.int32, device="cuda"),
            max(b - a for a, b in zip(offsets, offsets[1:])))


def _document_ids(x: dict[str, Any], batch: int, seq: int) -> torch.Tensor | None:
    """int64 [batch, seq]: each token's document number, or None without documents."""
    if "cu_seqlens" not in x:
        return None
    cu = x["cu_seqlens"].long()
    return torch.repeat_interleave(torch.arange(len(cu) - 1, device=cu.device), cu.diff()).view(batch, seq)


def _attention(b, s, hq, hkv, d, documents: bool = False) -> Case:
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = {"q": _rand(g, b, s, hq, d, dtype=dtype), "k": _rand(g, b, s, hkv, d, dtype=dtype),
             "v": _rand(g, b, s, hkv, d, dtype=dtype)}
        if documents:
            x["cu_seqlens"], x["max_seqlen"] = _documents(b, s, seed)
        return x

    def call(fn, x):
        extra = {k: x[k] for k in ("cu_seqlens", "max_seqlen") if k in x}
        return [fn(x["q"], x["k"], x["v"], softmax_scale=1.0 / math.sqrt(d), **extra)]

    def reference(x):
        """Causal GQA (query head i reads KV head i // (hq / hkv)), within each document when there are some."""
        q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
        allowed = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()[None, None]
        ids = _document_ids(x, b, s)
        if ids is not None:
            allowed = allowed & (ids[:, None, :, None] == ids[:, None, None, :])
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0 / math.sqrt(d))
        return [out.transpose(1, 2)]

    return Case(op="attention", name=f"gqa{hq}-{hkv}_d{d}" + ("_documents" if documents else ""), make=make, call=call,
                reference=reference)


def _rmsnorm(m, n, residual_scale, keep="both") -> Case:
    """keep="y" / "s": the residual form with only one output used, so its backward gets
    ds_out = None / dy = None (autograd passes None for an unused output)."""
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = {"x": _rand(g, m, n, dtype=dtype),
             "weight": (1 + 0.1 * torch.randn(n, generator=g, device="cuda")).to(dtype).requires_grad_()}
        if residual_scale is not None:
            x["residual"] = _rand(g, m, n, dtype=dtype)
        return x

    def call(fn, x):
        if "residual" in x:
            y, s = fn(x["x"], x["weight"], eps=1e-6, residual=x["residual"], residual_scale=residual_scale)
            return {"both": [y, s], "y": [y], "s": [s]}[keep]
        return [fn(x["x"], x["weight"], eps=1e-6)]

    def reference(x):
        def norm(t):
            return t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * x["weight"]

        if "residual" in x:
            s = x["residual"] + residual_scale * x["x"]
            return {"both": [norm(s), s], "y": [norm(s)], "s": [s]}[keep]
        return [norm(x["x"])]

    tag = "plain" if residual_scale is None else f"residual{residual_scale:.3f}"
    tag += "" if keep == "both" else f"_{keep}-only"
    return Case(op="rmsnorm", name=f"{m}x{n}_{tag}", make=make, call=call, reference=reference)


def _fc1(m, h, f) -> Case:
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return {"x": _rand(g, 2, m // 2, h, dtype=dtype), "w": _rand(g, 2 * f, h, dtype=dtype, std=h ** -0.5)}

    def call(fn, x):
        return [fn(x["x"], x["w"])]

    def reference(x):
        return [F.silu(x["x"] @ x["w"][:f].t()) * (x["x"] @ x["w"][f:].t())]

    return Case(op="gemm_fc1", name=f"{m}x{h}->{f}", make=make, call=call, reference=reference)


def _output(n, d, v_local, vocab_start, vocab_size, std=1.0) -> Case:
    """std: of the hidden states, so the logits' too (w has std d^-1/2)."""
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        labels = torch.randint(0, vocab_size, (n,), generator=g, device="cuda")
        labels[torch.rand(n, generator=g, device="cuda") < 0.1] = -100
        return {"h": _rand(g, n, d, dtype=dtype, std=std), "w": _rand(g, v_local, d, dtype=dtype, std=d ** -0.5),
                "labels": labels}

    def call(fn, x):
        return [fn(x["h"], x["w"], x["labels"], vocab_start=vocab_start, vocab_size=vocab_size)]

    def reference(x):
        """The CE sum of this shard alone (no TP group): log-sum-exp over its real columns (global id < vocab_size),
        minus the target logit where the label lies in the shard; ignored labels (-100) add nothing."""
        logits = x["h"] @ x["w"].t()
        real = torch.arange(v_local, device=logits.device) + vocab_start < vocab_size
        lse = torch.logsumexp(logits.masked_fill(~real, float("-inf")), dim=1)
        local = x["labels"] - vocab_start
        owned = (x["labels"] != -100) & (local >= 0) & (local < v_local)
        target = logits.gather(1, torch.where(owned, local, 0)[:, None])[:, 0]
        return [torch.where(x["labels"] != -100, lse - torch.where(owned, target, 0.0), 0.0).sum()]

    kind = "single-shard" if vocab_start == 0 and vocab_size <= v_local else "shard-of-two"
    kind += "" if std == 1.0 else f"_logit-std{std:g}"
    return Case(op="gemm_output", name=f"{n}x{d}x{v_local}_{kind}", make=make, call=call, reference=reference)


def _rope(b, s, hq, hkv, d, documents: bool = False) -> Case:
    """q and k sliced out of one packed QKV projection [b, s, (hq + 2 hkv) d], as the model calls it (strided,
    only the last dim contiguous); the gradient reaches the projection (its V part zero). documents: positions
    restart in each document (--reset-position-ids). The cos / sin tables (fp32 [s, d], theta 10000) are the
    judge's (harness/judge/opcases.py, HF Llama's arithmetic), so a version is checked on right tables."""
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = {"qkv": _rand(g, b, s, (hq + 2 * hkv) * d, dtype=dtype)}
        if documents:
            x["cu_seqlens"], x["max_seqlen"] = _documents(b, s, seed)
        x["cos"], x["sin"] = (t.cuda() for t in rope_tables(d, 10000.0, s))
        return x

    def qk(qkv):  # strided views of the packed projection, as engine/model/layers.py hands them to ops.rope
        return qkv[..., :hq * d].view(b, s, hq, d), qkv[..., hq * d:(hq + hkv) * d].view(b, s, hkv, d)

    def call(fn, x):
        extra = {key: x[key] for key in ("cu_seqlens", "max_seqlen") if key in x}
        return list(fn(*qk(x["qkv"]), x["cos"], x["sin"], **extra))

    def reference(x):
        """Rotate-half RoPE by each token's position (its index in the row, or in its document)."""
        ids = _document_ids(x, b, s)
        positions = torch.arange(s, device=x["qkv"].device).expand(b, s)
        if ids is not None:  # the token's flat index minus its document's first
            positions = torch.arange(b * s, device=ids.device).view(b, s) - x["cu_seqlens"].long()[ids]
        cos, sin = x["cos"].float()[positions][:, :, None], x["sin"].float()[positions][:, :, None]

        def rotate(t):
            return t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), dim=-1) * sin

        return [rotate(t) for t in qk(x["qkv"])]

    return Case(op="rope", name=f"qkv{hq}-{hkv}_d{d}_s{s}" + ("_documents" if documents else ""), make=make, call=call,
                reference=reference)


CASES = [
    _attention(1, 2048, 16, 1, 128),  # MiniCPM4-8B at TP 2 (32/2 at TP 1 has the same 16:1 grouping)
    _attention(2, 1024, 16, 2, 64),  # MiniCPM4-0.5B
    _rmsnorm(2048, 4096, 1.4 / math.sqrt(32)),
    _rmsnorm(2048, 4096, 1.0),
    _rmsnorm(2048, 4096, None),
    _rmsnorm(2048, 4096, 0.22, keep="y"),  # backward with ds_out = None
    _rmsnorm(2048, 4096, 0.22, keep="s"),  # backward with dy = None: no weight gradient
    _rmsnorm(2048, 1024, 0.22),  # MiniCPM4-0.5B hidden size
    _rmsnorm(2048, 1024, None),
    _rmsnorm(512, 1000, 0.5),  # a hidden size that is no multiple of the kernels' row tile (predicated)
    _fc1(1024, 4096, 8192),
    _output(2048, 4096, 36736, 0, 36736 - 24),  # one shard of the whole vocabulary, 24 padding columns
    _output(2048, 4096, 73472, 0, 73448),  # MiniCPM4-8B at TP 1: the whole padded vocabulary on one rank
    _output(2048, 4096, 36736, 36736, 73448),  # rank 1 of 2: half the labels live on the other shard
    # logits of std 30, the op judge's large-magnitude case: bf16 logits (0.06 apart at 30) put the
    # quack version's gradients 2e-2 from fp32, four times the baseline's error
    _output(2048, 4096, 73472, 0, 73448, std=30.0),
    _output(2048, 4096, 36736, 36736, 73448, std=30.0),  # the vocab-parallel path
    # --document-mask: FA4's varlen kernels (the stress test takes each op's first case, above)
    _attention(2, 2048, 16, 1, 128, documents=True),
    _attention(2, 1024, 16, 2, 64, documents=True),
    _rope(1, 4096, 32, 2, 128),  # MiniCPM4-8B at TP 1 (the table's whole length: positions up to 4095)
    _rope(2, 2048, 16, 1, 128),  # TP 2
    _rope(2, 1024, 16, 2, 64),  # MiniCPM4-0.5B
    _rope(2, 2048, 32, 2, 128, documents=True),  # positions restart in each document (quack's varlen path)
]


def cases_for(op: str) -> list[Case]:
    return [c for c in CASES if c.op == op]


def case_named(op: str, name: str) -> Case:
    return next(c for c in CASES if c.op == op and c.name == name)
