"""The op milestones' acceptance cases: shapes drawn from the judge's seed, inputs, and each op's contract
computed in fp32 by the judge's own code.

Shared by the bench job (harness/opbench.py runs a version of the op on these inputs inside the sandbox)
and the judge (which regenerates the same inputs from the seed and recomputes every output and gradient
here, independently of engine/). The contracts are engine/ops/README.md's:

    attention    (q, k, v, *, softmax_scale, cu_seqlens=None, max_seqlen=None) -> out
                                                                   causal GQA, [b, s, h, d]; with
                                                                   cu_seqlens causal within each document
    rmsnorm      (x, weight, *, eps, residual=None, residual_scale=1.0) -> y | (y, s)
    gemm_fc1     (x, w) -> silu(x W_gate^T) * (x W_up^T)           w = [W_gate; W_up]
    gemm_output  (h, w, labels, *, vocab_start, vocab_size) -> fp32 CE sum over valid labels

Inputs are generated on the CPU with a seeded generator (the same bits in every process and on every
machine), scaled so outputs are O(1) like a trained model's. A third of the attention cases (index 1, 4,
...) pack documents into each row (`args["documents"]`: their lengths in the flattened b x s tokens,
rows never shared): the version gets `cu_seqlens` and `max_seqlen` as --document-mask runs pass them,
and must attend within each document only. A version that ignores them, or raises, fails those cases.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["OPS", "DTYPES", "SHAPE_KEYS", "Case", "draw_cases", "timing_case", "make_inputs", "call_op", "reference",
           "grad_names", "result_names"]

OPS = ("attention", "rmsnorm", "gemm_fc1", "gemm_output")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # a bench's `dtype` names
# The dimensions a milestone names for its timed shape (a bench gate's `shape` table).
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("batch", "seq", "heads_q", "heads_kv", "head_dim"),
    "rmsnorm": ("tokens", "hidden"),
    "gemm_fc1": ("tokens", "hidden", "ffn"),
    "gemm_output": ("tokens", "hidden", "vocab_local", "vocab_size"),
}


@dataclass(frozen=True)
class Case:
    """One call of an op: its dimensions and scalar arguments, and the seed of its inputs."""

    op: str
    dims: dict[str, int] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)  # eps, residual_scale, softmax_scale, residual
    seed: int = 0

    def label(self) -> str:
        return f"{self.op}(" + ", ".join(f"{k}={v}" for k, v in {**self.dims, **self.args}.items()) + ")"


def _multiple(rng: random.Random, low: int, high: int, step: int) -> int:
    return step * rng.randint(max(1, math.ceil(low / step)), max(1, high // step))


def draw_cases(op: str, seed: int, count: int, *, scale: float = 1.0) -> list[Case]:
    """`count` cases of `op` with shapes drawn from `seed`: every judging sees new ones. `scale` (0, 1]
    shrinks the upper bounds (a CPU-sized programme); alignment stays what the contracts promise
    (multiples of 8 in hidden, FFN and the vocabulary shard; head dims 64 and 128)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    rng = random.Random(f"{op}:{seed}")
    cap = lambda n, floor: max(floor, int(n * scale))  # noqa: E731
    cases = []
    for i in range(count):
        if op == "attention":
            heads_kv = rng.choice((1, 2, 4))
            head_dim = rng.choice((64, 128))
            dims = {"batch": rng.choice((1, 2)), "seq": _multiple(rng, 32, cap(1024, 64), 16),
                    "heads_q": heads_kv * rng.choice((1, 2, 4, 8)), "heads_kv": heads_kv, "head_dim": head_dim}
            args: dict[str, Any] = {"softmax_scale": 1.0 / math.sqrt(head_dim)}
            if i % 3 == 1:  # from a generator of their own: the other cases stay what the seed always drew
                args["documents"] = _documents(random.Random(f"attention-documents:{seed}:{i}"), dims["batch"],
                                               dims["seq"])
        elif op == "rmsnorm":
            dims = {"tokens": _multiple(rng, 16, cap(4096, 64), 8), "hidden": _multiple(rng, 128, cap(8192, 256), 64)}
            args = {"eps": rng.choice((1e-6, 1e-5)), "residual": rng.random() < 0.75,
                    "residual_scale": round(rng.uniform(0.1, 1.5), 4)}
        elif op == "gemm_fc1":
            dims = {"tokens": _multiple(rng, 16, cap(2048, 64), 16), "hidden": _multiple(rng, 128, cap(4096, 256), 64),
                    "ffn": _multiple(rng, 128, cap(4096, 256), 64)}
            args = {}
        else:
            vocab_local = _multiple(rng, 512, cap(16384, 1024), 128)
            dims = {"tokens": _multiple(rng, 16, cap(2048, 64), 8), "hidden": _multiple(rng, 128, cap(2048, 256), 64),
                    "vocab_local": vocab_local, "vocab_size": vocab_local - rng.randint(0, 127)}
            args = {}
        cases.append(Case(op=op, dims=dims, args=args, seed=rng.randrange(1, 2**31 - 1) ^ i))
    return cases


def _documents(rng: random.Random, batch: int, seq: int) -> tuple[int, ...]:
    """Lengths of the documents packed into `batch` rows of `seq` tokens: 1 to 6 per row, one-token ones
    included, each row split on its own."""
    lengths: list[int] = []
    for _ in range(batch):
        cuts = set(rng.sample(range(1, seq), rng.randint(0, 5)))
        if rng.random() < 0.5:
            cuts.add(seq - 1)  # a one-token document at the row's end
        edges = [0, *sorted(cuts), seq]
        lengths += [b - a for a, b in zip(edges, edges[1:])]
    return tuple(lengths)


def timing_case(op: str, shape: dict[str, int], seed: int) -> Case:
    """The milestone's timed shape (e.g. one TP rank of MiniCPM4-8B), with the contract's usual arguments."""
    missing = [k for k in SHAPE_KEYS[op] if k not in shape]
    if missing:
        raise ValueError(f"shape of a {op} bench needs {', '.join(missing)}")
    dims = {k: int(shape[k]) for k in SHAPE_KEYS[op]}
    args: dict[str, Any] = {}
    if op == "attention":
        args = {"softmax_scale": 1.0 / math.sqrt(dims["head_dim"])}
    elif op == "rmsnorm":
        args = {"eps": 1e-6, "residual": True, "residual_scale": 0.2}
    return Case(op=op, dims=dims, args=args, seed=seed)


def make_inputs(case: Case, *, dtype: torch.dtype, device: str | torch.device = "cpu",
                generator_device: str = "cpu") -> dict[str, torch.Tensor]:
    """The case's inputs (float ones require grad) and `dout`, the upstream gradient of each output.
    Drawn on `generator_device` (the CPU by default: the same bits in every process) and moved."""
    g = torch.Generator(device=generator_device).manual_seed(case.seed)
    d = case.dims

    def rand(*shape: int, std: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=generator_device) * std).to(device=device, dtype=dtype)

    if case.op == "attention":
        b, s, hq, hkv, hd = d["batch"], d["seq"], d["heads_q"], d["heads_kv"], d["head_dim"]
        out = {"q": rand(b, s, hq, hd), "k": rand(b, s, hkv, hd), "v": rand(b, s, hkv, hd), "dout.0": rand(b, s, hq, hd)}
        if "documents" in case.args:
            offsets = [0]
            for n in case.args["documents"]:
                offsets.append(offsets[-1] + n)
            out["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device=device)
    elif case.op == "rmsnorm":
        n, h = d["tokens"], d["hidden"]
        out = {"x": rand(n, h), "weight": (1.0 + 0.1 * torch.randn(h, generator=g, device=generator_device)).to(device=device, dtype=dtype),
               "dout.0": rand(n, h)}
        if case.args.get("residual"):
            out["residual"] = rand(n, h)
            out["dout.1"] = rand(n, h)
    elif case.op == "gemm_fc1":
        n, h, f = d["tokens"], d["hidden"], d["ffn"]
        out = {"x": rand(n, h), "w": rand(2 * f, h, std=h ** -0.5), "dout.0": rand(n, f)}
    elif case.op == "gemm_output":
        n, h, v = d["tokens"], d["hidden"], d["vocab_local"]
        labels = torch.randint(0, d["vocab_size"], (n,), generator=g, device=generator_device)
        labels[torch.rand(n, generator=g, device=generator_device) < 0.05] = -100
        out = {"h": rand(n, h), "w": rand(v, h, std=h ** -0.5), "labels": labels.to(device),
               "dout.0": (torch.rand((), generator=g, device=generator_device) + 0.5).to(device=device, dtype=torch.float32)}
    else:
        raise ValueError(f"unknown op {case.op!r}")
    for name, tensor in out.items():
        if tensor.is_floating_point() and not name.startswith("dout."):
            tensor.requires_grad_()
    return out


def grad_names(case: Case) -> list[str]:
    """The inputs whose gradients are part of the contract, in order."""
    return {"attention": ["q", "k", "v"], "gemm_fc1": ["x", "w"], "gemm_output": ["h", "w"],
            "rmsnorm": ["x", "weight"] + (["residual"] if case.args.get("residual") else [])}[case.op]


def result_names(case: Case) -> list[str]:
    """Names of everything a call yields and the judge compares: outputs `out.i`, then `grad.<input>`."""
    outputs = 2 if case.op == "rmsnorm" and case.args.get("residual") else 1
    return [f"out.{i}" for i in range(outputs)] + [f"grad.{n}" for n in grad_names(case)]


def call_op(fn: Callable[..., Any], case: Case, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """One forward call of an op version as the model makes it; its outputs as a list."""
    a = case.args
    if case.op == "attention":
        if "documents" in a:
            return [fn(inputs["q"], inputs["k"], inputs["v"], softmax_scale=a["softmax_scale"],
                       cu_seqlens=inputs["cu_seqlens"], max_seqlen=max(a["documents"]))]
        return [fn(inputs["q"], inputs["k"], inputs["v"], softmax_scale=a["softmax_scale"])]
    if case.op == "rmsnorm":
        if a.get("residual"):
            return list(fn(inputs["x"], inputs["weight"], eps=a["eps"], residual=inputs["residual"],
                           residual_scale=a["residual_scale"]))
        return [fn(inputs["x"], inputs["weight"], eps=a["eps"])]
    if case.op == "gemm_fc1":
        return [fn(inputs["x"], inputs["w"])]
    if case.op == "gemm_output":
        return [fn(inputs["h"], inputs["w"], inputs["labels"], vocab_start=0, vocab_size=case.dims["vocab_size"])]
    raise ValueError(f"unknown op {case.op!r}")


# ---------------------------------------------------------------- the contracts in fp32 (the judge's own math)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
               documents: tuple[int, ...] | None = None) -> torch.Tensor:
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)  # query head i reads KV head i // group
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    b, s = q.shape[:2]
    allowed = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()[None, None]
    if documents is not None:  # document number of every token, row by row: keys of other documents are out
        number = torch.repeat_interleave(torch.arange(len(documents)), torch.tensor(documents)).view(b, s)
        allowed = allowed & (number[:, None, :, None] == number[:, None, None, :]).to(q.device)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _gemm_fc1(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    f = w.shape[0] // 2
    return F.silu(x @ w[:f].t()) * (x @ w[f:].t())


def _gemm_output(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_size: int) -> torch.Tensor:
    logits = (h @ w.t())[:, :vocab_size]  # padded columns never compete
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


def reference(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every result of `result_names(case)` computed in fp32 by the contract, with autograd."""
    leaves = {k: v.detach().float().requires_grad_() if v.is_floating_point() and not k.startswith("dout.") else v
              for k, v in inputs.items()}
    a = case.args
    if case.op == "attention":
        outs = [_attention(leaves["q"], leaves["k"], leaves["v"], softmax_scale=a["softmax_scale"],
                           documents=a.get("documents"))]
    elif case.op == "rmsnorm":
        if a.get("residual"):
            s = leaves["residual"] + a["residual_scale"] * leaves["x"]
            outs = [_rmsnorm(s, leaves["weight"], eps=a["eps"]), s]
        else:
            outs = [_rmsnorm(leaves["x"], leaves["weight"], eps=a["eps"])]
    elif case.op == "gemm_fc1":
        outs = [_gemm_fc1(leaves["x"], leaves["w"])]
    else:
        outs = [_gemm_output(leaves["h"], leaves["w"], leaves["labels"], vocab_size=case.dims["vocab_size"])]
    douts = [inputs[f"dout.{i}"].float() for i in range(len(outs))]
    torch.autograd.backward(outs, douts)
    results = {f"out.{i}": o.detach() for i, o in enumerate(outs)}
    results.update({f"grad.{n}": leaves[n].grad for n in grad_names(case)})
    return results
