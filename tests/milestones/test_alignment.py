"""Acceptance tests of milestones/alignment.toml: the engine's model against independent references.

- llama-tiny: the engine's logits and summed loss equal HF transformers' LlamaForCausalLM loaded with the
  engine's own export mapping (engine/checkpoint/hf_export.py: to_llama_state_dict + llama_config).
- tiny (MiniCPM muP): the engine's logits equal a plain-PyTorch MiniCPM forward written out below, with
  every scaling explicit (embedding x scale_emb, residual branches x scale_depth / sqrt(L), LM-head input
  / (hidden / dim_model_base)): not the export's folding, so a scaling both got wrong cannot hide.

The engine runs in a child process (tests/milestones/alignment_calls.py through harness.judge.candidate) and
hands back data; this process never imports it (the judge's import barrier), so every comparison below is made
by code the candidate cannot reach. The architecture of each preset is read here from the protected
engine/model_spec.toml, not from the engine. The weights are drawn here, with large query/key weights: at the
presets' init std attention is nearly uniform and a wrong RoPE layout would move the logits by less than the
tolerance. Tolerance: relative 1e-5 (Frobenius) in fp32; the implementations differ only in the order of
floating-point reductions (fused QKV, SDPA vs eager attention), observed <= 1e-6.
"""

import math
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from harness.judge.candidate import Candidate

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SEQ = 128
TOL = 1e-5
CALLS = "tests.milestones.alignment_calls"


@pytest.fixture(scope="module")
def engine():
    with Candidate(REPO) as child:
        yield child


def preset(name: str) -> SimpleNamespace:
    """The preset's architecture from the protected engine/model_spec.toml; muP scalings 1 when `mup` is off."""
    table = tomllib.loads((REPO / "engine" / "model_spec.toml").read_text(encoding="utf-8"))[name]
    cfg = SimpleNamespace(**table)
    if not table.get("mup", False):
        cfg.scale_emb, cfg.scale_depth, cfg.dim_model_base = 1.0, math.sqrt(cfg.num_layers), cfg.hidden_size
    return cfg


def draw_weights(cfg, shapes: dict, seed: int) -> dict[str, torch.Tensor]:
    """Weights for every parameter the engine reports, drawn here."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            weights[name] = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif name.endswith("attn.qkv"):  # sharp attention, so positions (RoPE) matter
            weights[name] = 0.6 * torch.randn(shape, generator=gen) / math.sqrt(cfg.hidden_size)
        else:
            weights[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    return weights


def run_engine(engine, name: str, seed: int, batch_seed: int):
    """(cfg, weights, tokens, labels, the engine's answer) for preset `name`."""
    cfg = preset(name)
    weights = draw_weights(cfg, engine.call(f"{CALLS}:parameter_shapes", name, SEQ), seed)
    tokens, labels = batch(cfg, batch_seed)
    return cfg, weights, tokens, labels, engine.call(f"{CALLS}:forward", name, SEQ, weights, tokens, labels)


def hf_llama(cfg, llama_config: dict, state: dict):
    """HF LlamaForCausalLM from the engine's exported config and weights, after checking that config against the
    preset (so a wrong export config cannot make both sides agree)."""
    for key, want in (("hidden_size", cfg.hidden_size), ("intermediate_size", cfg.ffn_hidden_size),
                      ("num_attention_heads", cfg.num_heads), ("num_key_value_heads", cfg.num_kv_heads),
                      ("head_dim", cfg.head_dim), ("num_hidden_layers", cfg.num_layers), ("vocab_size", cfg.vocab_size)):
        assert llama_config.get(key) == want, f"the export's {key} is {llama_config.get(key)!r}, the preset's {want!r}"
    for key, want in (("rms_norm_eps", cfg.rms_norm_eps), ("rope_theta", cfg.rope_theta)):
        assert llama_config.get(key) == pytest.approx(want, rel=1e-12), f"the export's {key} is {llama_config.get(key)!r}"
    conf = {k: v for k, v in llama_config.items() if k not in ("architectures", "temper", "torch_dtype")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf, attn_implementation="eager")).float().eval()
    hf.load_state_dict(state, strict=True)
    return hf


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def batch(cfg, seed=1):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=gen)
    labels = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=gen)
    labels[0, :7] = -100
    return tokens, labels


def test_llama_tiny_logits_and_loss_match_hf_llama_from_the_export(engine):
    cfg, weights, tokens, labels, out = run_engine(engine, "llama-tiny", seed=0, batch_seed=1)
    hf = hf_llama(cfg, out["llama_config"], out["export"])
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits.float()
    ref_loss = F.cross_entropy(ref.reshape(-1, cfg.vocab_size), labels.reshape(-1), ignore_index=-100, reduction="sum")
    ours = out["logits"]
    assert ours.shape == ref.shape
    assert rel(ours, ref) < TOL, f"logits differ from HF LlamaForCausalLM by {rel(ours, ref):.2e} (relative)"
    assert abs(out["loss"] - ref_loss.item()) / ref_loss.item() < TOL


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


def test_tiny_minicpm_logits_match_plain_torch_with_the_mup_scalings_written_out(engine):
    cfg, w, tokens, labels, out = run_engine(engine, "tiny", seed=0, batch_seed=2)
    assert cfg.mup and cfg.scale_emb != 1 and cfg.scale_depth != 1 and cfg.hidden_size != cfg.dim_model_base
    with torch.no_grad():
        ref = minicpm_logits(cfg, w, tokens)
    ours = out["logits"]
    ref_loss = F.cross_entropy(ref.reshape(-1, cfg.vocab_size), labels.reshape(-1), ignore_index=-100, reduction="sum")
    assert ours.shape == ref.shape
    assert rel(ours, ref) < TOL, f"logits differ from the plain MiniCPM reference by {rel(ours, ref):.2e} (relative)"
    assert abs(out["loss"] - ref_loss.item()) / ref_loss.item() < TOL


def test_the_plain_reference_is_hf_llama_when_the_scalings_are_one(engine):
    """Guards the reference itself: with every scaling 1 it must equal HF Llama on the same weights."""
    cfg, w, tokens, _, out = run_engine(engine, "llama-tiny", seed=3, batch_seed=4)
    hf = hf_llama(cfg, out["llama_config"], out["export"])
    with torch.no_grad():
        assert rel(minicpm_logits(cfg, w, tokens), hf(input_ids=tokens).logits.float()) < TOL
