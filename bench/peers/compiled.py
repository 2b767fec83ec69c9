"""Peer `torch-compile`: the MiniCPM4 decoder as a user would write it in plain PyTorch, compiled.

Llama-style (nanoGPT / torchtitan tone): fused QKV and fused [gate; up] linears, nn.RMSNorm, rotate-half
RoPE, SDPA causal attention with GQA, SwiGLU, an LM head over the padded vocabulary with torch
cross-entropy over the true one, and MiniCPM's muP scalings (embedding x scale_emb, residual branches x
scale_depth / sqrt(L), LM-head input / (hidden / dim_model_base)): the engine's model, so with the engine's
weights it gives the engine's loss (tests/bench/test_mfu.py). Trained with torch.optim.AdamW(fused=True),
clip_grad_norm_ and the engine's loss normalisation (sum over tokens / tokens per step).

Variants (bench/mfu.py runs each in its own process):
- `bf16`: bf16 weights, gradients and Adam moments; no fp32 master copy (less memory, less precision).
- `amp`:  fp32 weights + bf16 autocast: the engine's precision (fp32 master, bf16 matmuls).
- `fp32`: everything fp32 (the CPU reference check).

Peer `torchao-fp8` is the same loop with its decoder linears (QKV, O, FC1, FC2; not the LM head: the engine's --fp8
scope) swapped for torchao's float8 training linears (`convert_to_float8_training`, recipe `tensorwise` or
`rowwise`: dynamic scaling, E4M3 forward, the recipe's gradient format) on the `bf16` variant's weights, before
torch.compile: the "torchao float8 + torch.compile loop" a user gets for free, which issue 32's FP8 is held to.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import EngineConfig

__all__ = ["PeerDecoder", "VARIANTS", "FP8_RECIPES", "load_engine_weights", "matmul_weights", "to_float8", "build_step"]

VARIANTS = ("bf16", "amp", "fp32")
FP8_RECIPES = ("tensorwise", "rowwise")  # torchao's recipe names (torchao.float8.Float8LinearRecipeName)


def rope_tables(head_dim: int, theta: float, seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(seq, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, s, d], rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: EngineConfig, residual_scale: float):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.residual_scale = residual_scale
        self.attn_norm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.wqkv = nn.Linear(h, (cfg.num_heads + 2 * cfg.num_kv_heads) * d, bias=False)
        self.wo = nn.Linear(cfg.num_heads * d, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.w_gate_up = nn.Linear(h, 2 * cfg.ffn_hidden_size, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        qkv = self.wqkv(self.attn_norm(x)).view(b, s, self.heads + 2 * self.kv_heads, d).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(d), enable_gqa=True)
        x = x + self.residual_scale * self.wo(out.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.w_gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.residual_scale * self.w_down(F.silu(gate) * up)


class PeerDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.vocab_size = cfg.vocab_size
        self.emb_scale = cfg.scale_emb if cfg.mup else 1.0
        self.logit_divisor = cfg.hidden_size / cfg.dim_model_base if cfg.mup else 1.0
        residual_scale = cfg.scale_depth / math.sqrt(cfg.num_layers) if cfg.mup else 1.0
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, residual_scale) for _ in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.seq_length, self.lm_head.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Sum of cross-entropy over the labels that are not -100 (as engine.model.Transformer.forward)."""
        x = self.embed(tokens) * self.emb_scale
        s = tokens.shape[1]
        for layer in self.layers:
            x = layer(x, self.cos[:s], self.sin[:s])
        logits = self.lm_head(self.norm(x) / self.logit_divisor)[..., : self.vocab_size]
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")


def matmul_weights(model: PeerDecoder) -> list[torch.Tensor]:
    """The hidden matmul weights (everything the FLOP count counts but the LM head)."""
    return [p for layer in model.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down) for p in m.parameters()]


@torch.no_grad()
def load_engine_weights(model: PeerDecoder, engine_state: dict[str, torch.Tensor]) -> None:
    """Copy an engine model's parameters (TP 1 names, engine/model) into the peer: fused QKV rows are
    [q; k; v] and FC1 rows [gate; up] in both."""
    mapping = {"embed.weight": "embed.weight", "final_norm.weight": "norm.weight", "lm_head": "lm_head.weight"}
    for i in range(len(model.layers)):
        for ours, theirs in (("attn_norm.weight", "attn_norm.weight"), ("attn.qkv", "wqkv.weight"),
                             ("attn.o", "wo.weight"), ("mlp_norm.weight", "mlp_norm.weight"),
                             ("mlp.fc1", "w_gate_up.weight"), ("mlp.fc2", "w_down.weight")):
            mapping[f"layers.{i}.{ours}"] = f"layers.{i}.{theirs}"
    params = dict(model.named_parameters())
    if set(mapping) != set(engine_state):
        raise ValueError(f"engine parameters {sorted(set(engine_state) ^ set(mapping))} do not map onto the peer")
    for src, dst in mapping.items():
        params[dst].copy_(engine_state[src])


def to_float8(model: PeerDecoder, recipe: str) -> None:
    """Swap the decoder's linears for torchao's float8 training linears (in place; the weights stay the same
    Parameters). The LM head stays bf16, as under the engine's --fp8."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"torchao-fp8 variant {recipe!r}: use one of {', '.join(FP8_RECIPES)}")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:
        raise ImportError(f"the torchao-fp8 peer needs torchao (pip install torchao; on the GPU image the staged "
                          f"wheel, ../shared/gpu/README.md): {err}") from err
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda module, fqn: fqn.startswith("layers."))


def build_step(cfg: EngineConfig, variant: str, device: torch.device, *, compile_model: bool = True, seed: int = 0,
               fp8: str = ""):
    """(model, step): step() runs one optimizer step over the engine's cadence (GAS micro-batches) and
    returns its mean loss per token. fp8: a torchao float8 recipe for the decoder's linears (to_float8), or ""."""
    from bench.peers.common import check_matmul_params, linear_params, synthetic_batches

    if variant not in VARIANTS:
        raise ValueError(f"torch-compile variant {variant!r}: use one of {', '.join(VARIANTS)}")
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if variant == "bf16" else torch.float32
    with torch.device(device):
        model = PeerDecoder(cfg).to(dtype)
    check_matmul_params(cfg, linear_params(matmul_weights(model), model.lm_head.weight, cfg.vocab_size), "torch-compile")
    model.cos, model.sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.seq_length, device)  # fp32 tables
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=cfg.init_std / math.sqrt(cfg.hidden_size / cfg.dim_model_base))
    if fp8:
        to_float8(model, fp8)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, fused=True)
    forward = torch.compile(model) if compile_model else model
    batches = synthetic_batches(cfg, device, seed)
    tokens_per_step = sum(int((y != -100).sum()) for _, y in batches)
    autocast = variant == "amp"

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for x, y in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = forward(x, y)
            (loss / tokens_per_step).backward()
            total += loss.detach()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        return (total / tokens_per_step).item()

    return model, step
