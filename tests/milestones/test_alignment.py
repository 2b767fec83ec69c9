"""Acceptance tests of milestones/alignment.toml: the engine's model against independent references.

- llama-tiny: the engine's logits and summed loss equal HF transformers' LlamaForCausalLM loaded with the
  engine's own export mapping (engine/export_hf.py: to_llama_state_dict + llama_config).
- tiny (MiniCPM muP): the engine's logits equal a plain-PyTorch MiniCPM forward written out below, with
  every scaling explicit (embedding x scale_emb, residual branches x scale_depth / sqrt(L), LM-head input
  / (hidden / dim_model_base)): not the export's folding, so a scaling both got wrong cannot hide.

The weights are drawn here, not by the engine's initialiser, with large query/key weights: at the
presets' init std attention is nearly uniform and a wrong RoPE layout would move the logits by less
than the tolerance. Tolerance: relative 1e-5 (Frobenius) in fp32; the implementations differ only in
the order of floating-point reductions (fused QKV, SDPA vs eager attention), observed <= 1e-6.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.export_hf import llama_config, to_llama_state_dict
from engine.model import build_model
from engine.ops import resolve_ops

transformers = pytest.importorskip("transformers")

CPU = torch.device("cpu")
SEQ = 128
TOL = 1e-5


def engine_model(preset: str, seed: int = 0):
    cfg = resolve(build_config({"preset": preset, "seq_length": SEQ, "device": "cpu", "compute_dtype": "fp32"}))
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("attn.qkv"):  # sharp attention, so positions (RoPE) matter
                p.copy_(0.6 * torch.randn(p.shape, generator=gen) / math.sqrt(cfg.hidden_size))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    return cfg, model.eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def batch(cfg, seed=1):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=gen)
    labels = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=gen)
    labels[0, :7] = -100
    return tokens, labels


def test_llama_tiny_logits_and_loss_match_hf_llama_from_the_export():
    cfg, model = engine_model("llama-tiny")
    conf = {k: v for k, v in llama_config(cfg, "float32").items() if k not in ("architectures", "temper", "torch_dtype")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf, attn_implementation="eager")).float().eval()
    hf.load_state_dict(to_llama_state_dict(cfg, {n: p.detach() for n, p in model.named_parameters()}), strict=True)
    tokens, labels = batch(cfg)
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits.float()
        ref_loss = F.cross_entropy(ref.reshape(-1, cfg.vocab_size), labels.reshape(-1), ignore_index=-100, reduction="sum")
        ours = model.logits(tokens)
        loss = model(tokens, labels)
    assert ours.shape == ref.shape
    assert rel(ours, ref) < TOL, f"logits differ from HF LlamaForCausalLM by {rel(ours, ref):.2e} (relative)"
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < TOL


# ---------------------------------------------------------------- MiniCPM, written out in plain torch


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """x [b, h, s, d]; rotate-half RoPE (HF Llama / MiniCPM), frequencies theta^(-2i/d)."""
    d, s = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def minicpm_logits(cfg, w, tokens):
    b, s = tokens.shape
    d, hq, hk, L = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
    x = w["embed.weight"][tokens] * cfg.scale_emb  # MiniCPM: embedding output x scale_emb
    depth = cfg.scale_depth / math.sqrt(L)  # MiniCPM: every residual branch x scale_depth / sqrt(L)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(L):
        p = f"layers.{i}"
        h = rms_norm(x, w[f"{p}.attn_norm.weight"], cfg.rms_norm_eps)
        q, k, v = (h @ w[f"{p}.attn.qkv"].t()).split([hq * d, hk * d, hk * d], -1)
        q = rope(q.view(b, s, hq, d).transpose(1, 2), cfg.rope_theta)
        k = rope(k.view(b, s, hk, d).transpose(1, 2), cfg.rope_theta).repeat_interleave(hq // hk, 1)
        v = v.view(b, s, hk, d).transpose(1, 2).repeat_interleave(hq // hk, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, hq * d) @ w[f"{p}.attn.o"].t()
        x = x + depth * o
        h = rms_norm(x, w[f"{p}.mlp_norm.weight"], cfg.rms_norm_eps)
        gate, up = w[f"{p}.mlp.fc1"].chunk(2)
        x = x + depth * ((F.silu(h @ gate.t()) * (h @ up.t())) @ w[f"{p}.mlp.fc2"].t())
    h = rms_norm(x, w["final_norm.weight"], cfg.rms_norm_eps)
    h = h / (cfg.hidden_size / cfg.dim_model_base)  # MiniCPM: LM-head input / (hidden / dim_model_base)
    return h @ w["lm_head"][: cfg.vocab_size].t()


def test_tiny_minicpm_logits_match_plain_torch_with_the_mup_scalings_written_out():
    cfg, model = engine_model("tiny")
    assert cfg.mup and cfg.scale_emb != 1 and cfg.scale_depth != 1 and cfg.hidden_size != cfg.dim_model_base
    w = {n: p.detach() for n, p in model.named_parameters()}
    tokens, labels = batch(cfg, seed=2)
    with torch.no_grad():
        ref = minicpm_logits(cfg, w, tokens)
        ours = model.logits(tokens)
        loss = model(tokens, labels)
    ref_loss = F.cross_entropy(ref.reshape(-1, cfg.vocab_size), labels.reshape(-1), ignore_index=-100, reduction="sum")
    assert rel(ours, ref) < TOL, f"logits differ from the plain MiniCPM reference by {rel(ours, ref):.2e} (relative)"
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < TOL


def test_the_plain_reference_is_hf_llama_when_the_scalings_are_one():
    """Guards the reference itself: with every scaling 1 it must equal HF Llama on the same weights."""
    cfg, model = engine_model("llama-tiny", seed=3)
    w = {n: p.detach() for n, p in model.named_parameters()}
    one = type("C", (), {**{f: getattr(cfg, f) for f in ("head_dim", "num_heads", "num_kv_heads", "num_layers",
                                                         "rms_norm_eps", "rope_theta", "hidden_size", "vocab_size")},
                         "scale_emb": 1.0, "scale_depth": math.sqrt(cfg.num_layers), "dim_model_base": cfg.hidden_size})
    conf = {k: v for k, v in llama_config(cfg, "float32").items() if k not in ("architectures", "temper", "torch_dtype")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf, attn_implementation="eager")).float().eval()
    hf.load_state_dict(to_llama_state_dict(cfg, w), strict=True)
    tokens, _ = batch(cfg, seed=4)
    with torch.no_grad():
        assert rel(minicpm_logits(one, w, tokens), hf(input_ids=tokens).logits.float()) < TOL
