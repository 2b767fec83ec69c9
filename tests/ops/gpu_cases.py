"""Shapes and calls shared by the GPU version tests and the stress tests.

The shapes keep the compile-time sizes of the MiniCPM4 presets (hidden 4096, FFN shard 8192, vocab
shard 36736, head dims 128 and 64 with 16 query heads per KV head as 8B has, 8 as 0.5B has) so the
kernels compiled here are the ones bench/ops.py and training use (the on-disk cache then serves
them), with fewer tokens so each check runs in milliseconds. The `_documents` attention cases pack
synthetic documents into each row (engine/ops/workloads.synthetic_documents) and pass `cu_seqlens` /
`max_seqlen` as --document-mask runs do: the FA4 versions' varlen path against the baseline's mask.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.ops.rope.tables import rope_tables
from engine.ops.workloads import rope_qk, synthetic_documents

__all__ = ["Case", "CASES", "cases_for"]


@dataclass(kw_only=True, frozen=True)
class Case:
    op: str
    name: str
    make: Callable[[int, torch.dtype], dict[str, Any]]  # (seed, dtype) -> inputs on cuda
    call: Callable[[Callable[..., Any], dict[str, Any]], list[torch.Tensor]]


def _rand(g, *shape, dtype, std=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * std).to(dtype).requires_grad_()


def _attention(b, s, hq, hkv, d, documents: bool = False) -> Case:
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = {"q": _rand(g, b, s, hq, d, dtype=dtype), "k": _rand(g, b, s, hkv, d, dtype=dtype),
             "v": _rand(g, b, s, hkv, d, dtype=dtype)}
        if documents:
            x["cu_seqlens"], x["max_seqlen"] = synthetic_documents(b, s, seed=seed, device="cuda")
        return x

    def call(fn, x):
        extra = {k: x[k] for k in ("cu_seqlens", "max_seqlen") if k in x}
        return [fn(x["q"], x["k"], x["v"], softmax_scale=1.0 / math.sqrt(d), **extra)]

    return Case(op="attention", name=f"gqa{hq}-{hkv}_d{d}" + ("_documents" if documents else ""), make=make, call=call)


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

    tag = "plain" if residual_scale is None else f"residual{residual_scale:.3f}"
    tag += "" if keep == "both" else f"_{keep}-only"
    return Case(op="rmsnorm", name=f"{m}x{n}_{tag}", make=make, call=call)


def _fc1(m, h, f) -> Case:
    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return {"x": _rand(g, 2, m // 2, h, dtype=dtype), "w": _rand(g, 2 * f, h, dtype=dtype, std=h ** -0.5)}

    def call(fn, x):
        return [fn(x["x"], x["w"])]

    return Case(op="gemm_fc1", name=f"{m}x{h}->{f}", make=make, call=call)


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

    kind = "single-shard" if vocab_start == 0 and vocab_size <= v_local else "shard-of-two"
    kind += "" if std == 1.0 else f"_logit-std{std:g}"
    return Case(op="gemm_output", name=f"{n}x{d}x{v_local}_{kind}", make=make, call=call)


def _rope(b, s, hq, hkv, d, documents: bool = False) -> Case:
    """q and k sliced out of one packed QKV projection [b, s, (hq + 2 hkv) d], as the model calls it (strided,
    only the last dim contiguous); the gradient reaches the projection (its V part zero). documents: positions
    restart in each document (--reset-position-ids)."""
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def make(seed, dtype):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = {"qkv": _rand(g, b, s, (hq + 2 * hkv) * d, dtype=dtype)}
        if documents:
            x["cu_seqlens"], x["max_seqlen"] = synthetic_documents(b, s, seed=seed, device="cuda")
        return x

    def call(fn, x):
        if "cos" not in tables:
            tables["cos"] = rope_tables(d, 10000.0, s, "cuda")
        cos, sin = tables["cos"]
        q, k = rope_qk(x["qkv"], hq, hkv, d)
        extra = {key: x[key] for key in ("cu_seqlens", "max_seqlen") if key in x}
        return list(fn(q, k, cos, sin, **extra))

    return Case(op="rope", name=f"qkv{hq}-{hkv}_d{d}_s{s}" + ("_documents" if documents else ""), make=make, call=call)


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
