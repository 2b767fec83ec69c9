"""The op milestones' acceptance cases: shapes drawn from the judge's seed, inputs, and each op's contract
computed in fp32 by the judge's own code.

Shared by the bench job (harness/opbench.py runs a version of the op on these inputs inside the sandbox)
and the judge (which regenerates the same inputs from the seed and recomputes every output and gradient
here, independently of engine/). The contracts are engine/ops/README.md's:

    attention    (q, k, v, *, softmax_scale, cu_seqlens=None, max_seqlen=None) -> out
                                                                   causal GQA, [b, s, h, d]; with
                                                                   cu_seqlens causal within each document
    rmsnorm      (x, weight, *, eps, residual=None, residual_scale=1.0) -> y | (y, s)
    gemm_fc1     (x, w, *, main_grad=None) -> silu(x W_gate^T) * (x W_up^T)
                                                                   w = [W_gate; W_up]; main_grad: w's fp32
                                                                   gradient accumulator (GradSink here)
    gemm_output  (h, w, labels, *, vocab_start, vocab_size, main_grad=None) -> fp32 CE sum over valid labels
                                                                   main_grad: w's fp32 gradient accumulator
    rope         (q, k, cos, sin, *, cu_seqlens=None, max_seqlen=None) -> (q_rotated, k_rotated)
                                                                   rotate-half RoPE of [b, s, h, d] by each
                                                                   token's position (inside its document with
                                                                   cu_seqlens); cos, sin fp32 [max_seq, d]

Inputs are generated on the CPU with a seeded generator (the same bits in every process and on every machine),
scaled so outputs are O(1) like a trained model's. A third of the attention cases (index 1, 4, ...) pack
documents into each row (`args["documents"]`: their lengths in the flattened b x s tokens, rows never shared):
the version gets `cu_seqlens` and `max_seqlen` as --document-mask runs pass them, and must attend within each
document only. rope's cases do the same (as --reset-position-ids runs pass them: positions restart at each
document). rope's tables are the judge's own (HF Llama's arithmetic), with more rows than the sequence, as the
model's are. A version that ignores them, or raises, fails those cases. The drawn cases also come in the variants
a version meets in the model and random data alone would never show (by case index, so any three cases cover
them): the layouts the model passes (q, k, v split from one fused QKV buffer, so non-contiguous; [batch, seq,
hidden] activations), and activations large or small enough that a version without the numerically safe form
fails (softmax and log-sum-exp past exp's fp32 range unless the max is subtracted, rmsnorm's sum of squares past
fp16's range or below eps). gemm_fc1 and gemm_output are called as the model calls them under
gradient-accumulation fusion in a third of the cases (index 0, 3, ...) and at the timed shape: with a
`main_grad`, the judge's GradSink over an fp32 buffer already holding a drawn partial sum. `grad.w` is then that
buffer after the call (dW added to it, by the version through `weight_grad` or, for a version that ignores the
sink, by the bench as the engine's gradient hook would); the judge's reference is its own dW plus the drawn
partial sum.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from harness.spec import SHAPE_KEYS

__all__ = ["OPS", "DTYPES", "SHAPE_KEYS", "MAGNITUDES", "ROPE_THETAS", "Case", "GradSink", "draw_cases", "timing_case",
           "make_inputs", "rope_tables", "redraw", "call_op", "reference", "grad_names", "result_names", "fused_grad"]

OPS = ("attention", "rmsnorm", "gemm_fc1", "gemm_output", "rope")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # a bench's `dtype` names
# The activation scales of the large-magnitude cases (1.0 elsewhere). attention: q, k of std 6 give scores of
# std 36 and row maxima past 88, where exp overflows fp32; gemm_output: logits of std 30, the same past 88;
# rmsnorm: 1e3 puts the sum of squares past fp16's 65504, 1e-3 puts the mean square at eps; gemm_fc1: 8;
# rope: 16 (a rotation: its relative error must not depend on the scale).
MAGNITUDES: dict[str, tuple[float, ...]] = {"attention": (6.0,), "gemm_output": (30.0,), "rmsnorm": (1e3, 1e-3),
                                            "gemm_fc1": (8.0,), "rope": (16.0,)}
_MODEL_LAYOUT = ("attention", "rmsnorm", "gemm_fc1", "rope")  # ops the model calls with other layouts than [n, h]
ROPE_THETAS = (10000.0, 500000.0, 1000000.0)  # MiniCPM4's, Llama 3's, and a larger base
# Ops the model hands a weight's fp32 gradient accumulator (`main_grad`), and which weight.
_FUSED_WGRAD = {"gemm_fc1": "w", "gemm_output": "w"}


@dataclass(frozen=True)
class Case:
    """One call of an op: its dimensions and scalar arguments, and the seed of its inputs."""

    op: str
    dims: dict[str, int] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)  # eps, residual_scale, softmax_scale, residual, theta
    seed: int = 0
    layout: str = "flat"  # "flat": contiguous [n, h] / [b, s, h, d]; "model": as the model passes them
    magnitude: float = 1.0  # scale of the activations
    main_grad: bool = False  # gemm_fc1, gemm_output: the weight's gradient goes to an fp32 accumulator (docstring)

    def label(self) -> str:
        extra = {"layout": self.layout} if self.layout != "flat" else {}
        extra.update({"magnitude": self.magnitude} if self.magnitude != 1.0 else {})
        extra.update({"main_grad": True} if self.main_grad else {})
        return f"{self.op}(" + ", ".join(f"{k}={v}" for k, v in {**self.dims, **self.args, **extra}.items()) + ")"


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
        if op in ("attention", "rope"):
            heads_kv = rng.choice((1, 2, 4))
            head_dim = rng.choice((64, 128))
            dims = {"batch": rng.choice((1, 2)), "seq": _multiple(rng, 32, cap(1024, 64), 16),
                    "heads_q": heads_kv * rng.choice((1, 2, 4, 8)), "heads_kv": heads_kv, "head_dim": head_dim}
            args: dict[str, Any] = ({"softmax_scale": 1.0 / math.sqrt(head_dim)} if op == "attention"
                                    else {"theta": rng.choice(ROPE_THETAS)})
            if i % 3 == 1:  # from a generator of their own: the other cases stay what the seed always drew
                args["documents"] = _documents(random.Random(f"{op}-documents:{seed}:{i}"), dims["batch"],
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
        layout = "model" if i % 2 == 1 and op in _MODEL_LAYOUT else "flat"
        magnitude = rng.choice(MAGNITUDES[op]) if i % 3 == 2 else 1.0
        cases.append(Case(op=op, dims=dims, args=args, seed=rng.randrange(1, 2**31 - 1) ^ i, layout=layout,
                          magnitude=magnitude, main_grad=op in _FUSED_WGRAD and i % 3 == 0))
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
    elif op == "rope":
        args = {"theta": 10000.0}
    return Case(op=op, dims=dims, args=args, seed=seed, main_grad=op in _FUSED_WGRAD)


def _laws(case: Case) -> dict[str, tuple[tuple[int, ...], str, float]]:
    """Each input's (shape, law, scale), in drawing order: "normal" (mean 0, std scale), "gain" (1 + scale x
    normal: a norm weight), "labels" (token ids, 5 % ignored), "positive" (a scalar in [0.5, 1.5))."""
    d, m = case.dims, case.magnitude
    if case.op == "attention":
        b, s, hq, hkv, hd = d["batch"], d["seq"], d["heads_q"], d["heads_kv"], d["head_dim"]
        return {"q": ((b, s, hq, hd), "normal", m), "k": ((b, s, hkv, hd), "normal", m), "v": ((b, s, hkv, hd), "normal", 1.0),
                "dout.0": ((b, s, hq, hd), "normal", 1.0)}
    if case.op == "rmsnorm":
        n, h = d["tokens"], d["hidden"]
        laws = {"x": ((n, h), "normal", m), "weight": ((h,), "gain", 0.1), "dout.0": ((n, h), "normal", 1.0)}
        if case.args.get("residual"):
            laws.update({"residual": ((n, h), "normal", m), "dout.1": ((n, h), "normal", 1.0)})
        return laws
    if case.op == "gemm_fc1":
        n, h, f = d["tokens"], d["hidden"], d["ffn"]
        laws = {"x": ((n, h), "normal", m), "w": ((2 * f, h), "normal", h ** -0.5), "dout.0": ((n, f), "normal", 1.0)}
        if case.main_grad:  # the partial sum already in the accumulator (fp32; drawn last: the others stay as they were)
            laws["main_grad.w"] = ((2 * f, h), "normal", 1.0)
        return laws
    if case.op == "rope":
        b, s, hq, hkv, hd = d["batch"], d["seq"], d["heads_q"], d["heads_kv"], d["head_dim"]
        return {"q": ((b, s, hq, hd), "normal", m), "k": ((b, s, hkv, hd), "normal", m),
                "dout.0": ((b, s, hq, hd), "normal", 1.0), "dout.1": ((b, s, hkv, hd), "normal", 1.0)}
    if case.op == "gemm_output":
        n, h, v = d["tokens"], d["hidden"], d["vocab_local"]
        laws = {"h": ((n, h), "normal", m), "w": ((v, h), "normal", h ** -0.5), "labels": ((n,), "labels", 0.0),
                "dout.0": ((), "positive", 0.0)}
        if case.main_grad:  # as gemm_fc1's (drawn last), of dW's size (a row per label id: ~ n / v rows of h each),
            laws["main_grad.w"] = ((v, h), "normal", (n / v) ** 0.5)  # so that a dW lost under it would show
        return laws
    raise ValueError(f"unknown op {case.op!r}")


def _draw(case: Case, shape: tuple[int, ...], law: str, scale: float, g: torch.Generator, device: str) -> torch.Tensor:
    if law == "normal":
        return torch.randn(*shape, generator=g, device=device) * scale
    if law == "gain":
        return 1.0 + scale * torch.randn(*shape, generator=g, device=device)
    if law == "labels":
        labels = torch.randint(0, case.dims["vocab_size"], shape, generator=g, device=device)
        labels[torch.rand(shape, generator=g, device=device) < 0.05] = -100
        return labels
    return torch.rand(shape, generator=g, device=device) + 0.5  # "positive"


def make_inputs(case: Case, *, dtype: torch.dtype, device: str | torch.device = "cpu",
                generator_device: str = "cpu") -> dict[str, torch.Tensor]:
    """The case's inputs (float ones require grad) and `dout`, the upstream gradient of each output.
    Drawn on `generator_device` (the CPU by default: the same bits in every process) and moved."""
    g = torch.Generator(device=generator_device).manual_seed(case.seed)
    out = {}
    for name, (shape, law, scale) in _laws(case).items():
        t = _draw(case, shape, law, scale, g, generator_device)
        # gemm_output's upstream gradient is the loss scale and an accumulator's partial sum is fp32, as the trainer's.
        fp32 = law == "positive" or name.startswith("main_grad.")
        t = t.to(device) if law == "labels" else t.to(device=device, dtype=torch.float32 if fp32 else dtype)
        if t.is_floating_point() and not name.startswith(("dout.", "main_grad.")):
            t.requires_grad_()
        out[name] = t
    if "documents" in case.args:  # not drawn: the boundaries of the case's documents
        offsets = [0]
        for n in case.args["documents"]:
            offsets.append(offsets[-1] + n)
        out["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device=device)
    if case.op == "rope":  # not drawn: the tables, with rows to spare past the sequence as the model's have
        cos, sin = rope_tables(case.dims["head_dim"], case.args["theta"], case.dims["seq"] + 16)
        out["cos"], out["sin"] = cos.to(device), sin.to(device)
    return out


def rope_tables(head_dim: int, theta: float, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) fp32 [rows, head_dim], rotate-half layout, by HF Llama's default rope arithmetic (fp32 inverse
    frequencies, their outer product with the positions, both halves equal)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(rows, dtype=torch.int64).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def redraw(case: Case, inputs: dict[str, torch.Tensor], g: torch.Generator) -> None:
    """Refill every input but the upstream gradients in place (weights and labels too), with the case's laws,
    from `g` (on the inputs' device): each timed call sees new data at the same addresses, so nothing keyed on
    a tensor's identity or address (a cached transposed weight, say) stays right."""
    with torch.no_grad():
        for name, (shape, law, scale) in _laws(case).items():
            if name.startswith("dout.") or name not in inputs:
                continue
            target = inputs[name]
            target.copy_(_draw(case, shape, law, scale, g, str(target.device)))


def grad_names(case: Case) -> list[str]:
    """The inputs whose gradients are part of the contract, in order."""
    return {"attention": ["q", "k", "v"], "gemm_fc1": ["x", "w"], "gemm_output": ["h", "w"], "rope": ["q", "k"],
            "rmsnorm": ["x", "weight"] + (["residual"] if case.args.get("residual") else [])}[case.op]


def result_names(case: Case) -> list[str]:
    """Names of everything a call yields and the judge compares: outputs `out.i`, then `grad.<input>`."""
    outputs = 2 if (case.op == "rmsnorm" and case.args.get("residual")) or case.op == "rope" else 1
    return [f"out.{i}" for i in range(outputs)] + [f"grad.{n}" for n in grad_names(case)]


def _as_model_passes(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs in the layout of the case: "model" makes attention's q, k, v views of one fused buffer
    (engine/model/layers.py splits the QKV projection: strided, non-contiguous), rope's q and k views of one
    such buffer (v beside them, zeros), and rmsnorm's and gemm_fc1's activations [batch, seq, hidden] (the model's
    [b, s, h]). Gradients flow back to the flat inputs."""
    if case.layout != "model":
        return inputs
    shaped = dict(inputs)
    if case.op in ("attention", "rope"):
        q, k = inputs["q"], inputs["k"]
        v = inputs["v"] if case.op == "attention" else torch.zeros_like(k)
        parts = torch.cat([q, k, v], dim=2).split([q.shape[2], k.shape[2], v.shape[2]], dim=2)
        shaped.update(zip(("q", "k", "v") if case.op == "attention" else ("q", "k"), parts))
    else:
        for name in ("x", "residual"):
            if name in inputs:
                t = inputs[name]
                shaped[name] = t.view(2, t.shape[0] // 2, t.shape[1])
    return shaped


class GradSink:
    """The judge's own fp32 gradient accumulator for a `main_grad` call (the engine's is
    engine/distributed/wgrad.py's MainGrad, which the judge does not import): `weight_grad(dy, x, w)` adds dy^T x
    (leading dimensions summed) to `grad` in fp32 and returns what autograd gets for w, memory never read."""

    def __init__(self, grad: torch.Tensor):
        self.grad = grad
        self.filled = False

    def weight_grad(self, dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a, b = dy.reshape(-1, dy.shape[-1]).t(), x.reshape(-1, x.shape[-1])
        if a.is_cuda and a.dtype != self.grad.dtype:
            torch.addmm(self.grad, a, b, out_dtype=self.grad.dtype, out=self.grad)
        else:
            self.grad.addmm_(a.to(self.grad.dtype), b.to(self.grad.dtype))
        self.filled = True
        return torch.empty_like(w)


def fused_grad(sink: GradSink, grad: torch.Tensor | None) -> torch.Tensor:
    """The accumulator after a call, as the engine ends up with it: a version that ignored the sink returned dW to
    autograd, which the engine's gradient hook then adds (in place here, as there)."""
    if not sink.filled and grad is not None:
        sink.grad.add_(grad)
    return sink.grad


def call_op(fn: Callable[..., Any], case: Case, inputs: dict[str, torch.Tensor],
            sinks: dict[str, GradSink] | None = None) -> list[torch.Tensor]:
    """One forward call of an op version as the model makes it (in the case's layout); its outputs as a list,
    shaped as the flat contract's (what `reference` returns). A `main_grad` case puts its GradSink into `sinks`,
    by the input's name."""
    a = case.args
    inputs = _as_model_passes(case, inputs)
    if case.op == "attention":
        if "documents" in a:
            return [fn(inputs["q"], inputs["k"], inputs["v"], softmax_scale=a["softmax_scale"],
                       cu_seqlens=inputs["cu_seqlens"], max_seqlen=max(a["documents"]))]
        return [fn(inputs["q"], inputs["k"], inputs["v"], softmax_scale=a["softmax_scale"])]
    if case.op == "rmsnorm":
        if a.get("residual"):
            outs = list(fn(inputs["x"], inputs["weight"], eps=a["eps"], residual=inputs["residual"],
                           residual_scale=a["residual_scale"]))
        else:
            outs = [fn(inputs["x"], inputs["weight"], eps=a["eps"])]
        return [o.reshape(-1, o.shape[-1]) if case.layout == "model" else o for o in outs]
    extra: dict[str, Any] = {}
    if case.main_grad:
        name = _FUSED_WGRAD[case.op]
        sink = GradSink(inputs[f"main_grad.{name}"])
        extra["main_grad"] = sink
        if sinks is not None:
            sinks[name] = sink
    if case.op == "gemm_fc1":
        out = fn(inputs["x"], inputs["w"], **extra)
        return [out.reshape(-1, out.shape[-1]) if case.layout == "model" else out]
    if case.op == "gemm_output":
        return [fn(inputs["h"], inputs["w"], inputs["labels"], vocab_start=0, vocab_size=case.dims["vocab_size"],
                   **extra)]
    if case.op == "rope":
        extra = {"cu_seqlens": inputs["cu_seqlens"], "max_seqlen": max(a["documents"])} if "documents" in a else {}
        return list(fn(inputs["q"], inputs["k"], inputs["cos"], inputs["sin"], **extra))
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


def _positions(batch: int, seq: int, documents: tuple[int, ...] | None) -> torch.Tensor:
    """int64 [batch, seq]: each token's index in its row, or inside its document."""
    if documents is None:
        return torch.arange(seq).expand(batch, seq)
    return torch.cat([torch.arange(n) for n in documents]).view(batch, seq)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    c, s = cos[positions][:, :, None, :], sin[positions][:, :, None, :]
    half = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s


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
    elif case.op == "rope":
        positions = _positions(case.dims["batch"], case.dims["seq"], a.get("documents")).to(leaves["q"].device)
        cos, sin = inputs["cos"].float(), inputs["sin"].float()
        outs = [_rope(leaves["q"], cos, sin, positions), _rope(leaves["k"], cos, sin, positions)]
    else:
        outs = [_gemm_output(leaves["h"], leaves["w"], leaves["labels"], vocab_size=case.dims["vocab_size"])]
    douts = [inputs[f"dout.{i}"].float() for i in range(len(outs))]
    torch.autograd.backward(outs, douts)
    results = {f"out.{i}": o.detach() for i, o in enumerate(outs)}
    results.update({f"grad.{n}": leaves[n].grad for n in grad_names(case)})
    if case.main_grad:
        name = _FUSED_WGRAD[case.op]
        results[f"grad.{name}"] = results[f"grad.{name}"] + inputs[f"main_grad.{name}"].float()
    return results
