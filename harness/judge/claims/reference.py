"""The judge's own fp32 forward pass of the engine's model family (MiniCPM4 / Llama), plain PyTorch.

Part of the judge: nothing here imports the engine. It reads the engine's parameter names and
fused layouts (as harness/judge/claims/checkpoint_reader.py returns them, whole tensors in the TP = 1 layout):

    embed.weight          [padded vocab, hidden]      rows >= vocab_size are padding (never used)
    layers.{i}.attn_norm.weight, layers.{i}.mlp_norm.weight, final_norm.weight   [hidden]
    layers.{i}.attn.qkv   [(H + 2 KV) * d, hidden]    rows [q heads | k heads | v heads]
    layers.{i}.attn.o     [hidden, H * d]
    layers.{i}.mlp.fc1    [2 * ffn, hidden]           rows [gate | up]
    layers.{i}.mlp.fc2    [hidden, ffn]
    lm_head               [padded vocab, hidden]      untied

and computes, all in fp32 (or fp64 if the caller passes fp64 tensors):
    x = embed[tokens] * scale_emb
    per layer:  x += s * Attn(RMSNorm(x)),  x += s * SwiGLU(RMSNorm(x)),  s = scale_depth / sqrt(L)
    logits = (RMSNorm(x) / (hidden / dim_model_base)) @ lm_head[:vocab].T
with RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * gain, RoPE in HF's rotate-half layout (base
rope_theta, positions 0..S-1), GQA with query head j reading KV head j // (H / KV), causal softmax
attention scaled by 1 / sqrt(d), SwiGLU = silu(gate) * up. With `mup` false every scaling is 1:
this is HF's LlamaForCausalLM exactly.

Packed documents (config `document_mask`, `reset_position_ids`; the engine's --document-mask): a
row's documents are its runs of tokens ending at an EOS (`eos_id`, which the caller takes from the
judge's own tokenization), the first token of a row starting one. Written here as the judge reads
it: document number = running count of document starts along the row; a query sees a key when both
numbers match and the key is not later (an explicit boolean mask); with `reset_position_ids`, RoPE
position = distance from the document's first token. A config with `document_mask` and no `eos_id`
raises: the reference never quietly attends across documents.
"""

import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["REQUIRED_FIELDS", "DOCUMENT_FIELDS", "IGNORE_INDEX", "Scalings", "scalings", "judged_config", "logits", "loss",
           "loss_sum", "row_loss_sums", "loss_and_grads"]

REQUIRED_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                   "ffn_hidden_size", "rms_norm_eps", "rope_theta", "mup")
_MUP_FIELDS = ("scale_emb", "scale_depth", "dim_model_base")
DOCUMENT_FIELDS = ("document_mask", "reset_position_ids")  # absent = off, as engines before them trained
IGNORE_INDEX = -100
# Above this many parameters loss_and_grads recomputes each layer in backward and takes one row per pass:
# an 8B model's fp32 activations for 4096 tokens would not fit beside its weights and gradients otherwise.
_LARGE_MODEL = 200_000_000


class Scalings:
    def __init__(self, emb: float, residual: float, logit_divisor: float):
        self.emb, self.residual, self.logit_divisor = emb, residual, logit_divisor


def _check(config: Mapping[str, Any]) -> None:
    need = list(REQUIRED_FIELDS) + (list(_MUP_FIELDS) if config.get("mup") else [])
    missing = [k for k in need if k not in config]
    if missing:
        raise KeyError(f"reference forward: config lacks {missing}")


def judged_config(expected: Mapping[str, Any], meta_config: Mapping[str, Any]) -> dict[str, Any]:
    """The config the judge reads a job's weights with: the model and muP fields of the EXPECTED config (what
    the milestone asked for), meta.json's where the expected config lacks one, and packed documents exactly as
    the expected config says (absent = off), never as the job's meta.json does."""
    cfg = dict(meta_config)
    cfg.update({k: expected[k] for k in (*REQUIRED_FIELDS, *_MUP_FIELDS) if k in expected})
    cfg.update({k: bool(expected.get(k, False)) for k in DOCUMENT_FIELDS})
    return cfg


def scalings(config: Mapping[str, Any]) -> Scalings:
    _check(config)
    if not config["mup"]:
        return Scalings(1.0, 1.0, 1.0)
    return Scalings(float(config["scale_emb"]), float(config["scale_depth"]) / math.sqrt(int(config["num_layers"])),
                    int(config["hidden_size"]) / int(config["dim_model_base"]))


def _rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * gain


def _rope_tables(pos: torch.Tensor, d: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., d] at integer positions `pos` (HF Llama's default rope: fp32 inverse frequencies,
    outer product with positions, [f, f])."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=pos.device).float() / d))
    freqs = pos.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _documents(config: Mapping[str, Any], inputs: torch.Tensor,
               eos_id: int | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(attention mask [b, 1, s, s] or None for plain causal, RoPE positions [b, s] or [s])."""
    b, s = inputs.shape
    plain = torch.arange(s, device=inputs.device)
    if not config.get("document_mask", False):
        if config.get("reset_position_ids", False):
            raise ValueError("reference forward: reset_position_ids without document_mask is not a configuration the "
                             "engine runs")
        return None, plain
    if eos_id is None:
        raise ValueError("reference forward: the config has document_mask on; pass the EOS id of the tokens' tokenizer")
    after_eos = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=inputs.device), inputs[:, :-1] == eos_id], dim=1)
    doc = torch.cumsum(after_eos.long(), dim=1)  # document number of each token in its row
    allowed = (doc[:, :, None] == doc[:, None, :]) & (plain[None, :, None] >= plain[None, None, :])
    if not config.get("reset_position_ids", False):
        return allowed[:, None], plain
    first = torch.stack([torch.searchsorted(doc[r], doc[r]) for r in range(b)])  # index of each document's first token
    return allowed[:, None], plain[None, :] - first


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, s, d]; cos/sin [s, d] or [b, 1, s, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _matmul_t(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w.t()


def _hidden(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], inputs: torch.Tensor,
            eos_id: int | None = None, recompute: bool = False, linear: Callable = _matmul_t) -> torch.Tensor:
    sc = scalings(config)
    h, d = int(config["hidden_size"]), int(config["head_dim"])
    nh, nkv, L = int(config["num_heads"]), int(config["num_kv_heads"]), int(config["num_layers"])
    eps = float(config["rms_norm_eps"])
    emb = params["embed.weight"]
    dtype = emb.dtype
    b, s = inputs.shape
    x = F.embedding(inputs, emb) * sc.emb
    mask, positions = _documents(config, inputs, eos_id)
    cos, sin = _rope_tables(positions, d, float(config["rope_theta"]), dtype)
    if positions.dim() == 2:  # per-row positions: broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    group = nh // nkv

    def layer(x: torch.Tensor, i: int) -> torch.Tensor:
        p = f"layers.{i}"
        y = _rmsnorm(x, params[f"{p}.attn_norm.weight"], eps)
        q, k, v = linear(y, params[f"{p}.attn.qkv"]).split([nh * d, nkv * d, nkv * d], dim=-1)
        q = _rotate(q.view(b, s, nh, d).transpose(1, 2), cos, sin)
        k = _rotate(k.view(b, s, nkv, d).transpose(1, 2), cos, sin)
        v = v.view(b, s, nkv, d).transpose(1, 2)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        if mask is None:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(d))
        else:
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(d))
        x = x + sc.residual * linear(att.transpose(1, 2).reshape(b, s, nh * d), params[f"{p}.attn.o"])
        y = _rmsnorm(x, params[f"{p}.mlp_norm.weight"], eps)
        gate, up = linear(y, params[f"{p}.mlp.fc1"]).chunk(2, dim=-1)
        return x + sc.residual * linear(F.silu(gate) * up, params[f"{p}.mlp.fc2"])

    for i in range(L):
        x = checkpoint(layer, x, i, use_reentrant=False) if recompute else layer(x, i)
    assert x.shape[-1] == h
    return _rmsnorm(x, params["final_norm.weight"], eps) / sc.logit_divisor


def logits(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], inputs: torch.Tensor, *,
           eos_id: int | None = None) -> torch.Tensor:
    """inputs [B, S] token ids -> logits [B, S, vocab_size] (padding columns dropped). `eos_id`: needed
    when the config has document_mask on. Differentiable (tests train this forward as an independent
    model); the judge's losses run under no_grad."""
    hidden = _hidden(params, config, inputs, eos_id)
    return hidden @ params["lm_head"][: int(config["vocab_size"])].t()


@torch.no_grad()
def row_loss_sums(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], tokens: torch.Tensor, *,
                  eos_id: int | None = None) -> torch.Tensor:
    """tokens [B, S + 1] -> [B] fp64: each row's summed next-token cross-entropy in nats (S predicted tokens a
    row). Rows are kept apart so a caller can see how much one sequence's loss scatters from another's."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    out = logits(params, config, inputs, eos_id=eos_id)
    ce = F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1), reduction="none")
    return ce.double().reshape(labels.shape).sum(dim=1)


def loss_sum(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], tokens: torch.Tensor, *,
             eos_id: int | None = None) -> tuple[float, int]:
    """tokens [B, S + 1] -> (summed next-token cross-entropy in nats, number of predicted tokens),
    accumulated in fp64 so batches can be combined exactly."""
    return float(row_loss_sums(params, config, tokens, eos_id=eos_id).sum()), int(tokens[:, 1:].numel())


def loss(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], tokens: torch.Tensor, *,
         eos_id: int | None = None) -> float:
    """tokens [B, S + 1] -> mean next-token cross-entropy (nats per token) of the fp32 reference."""
    total, count = loss_sum(params, config, tokens, eos_id=eos_id)
    return total / count


def loss_and_grads(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], inputs: torch.Tensor,
                   labels: torch.Tensor, rows_per_pass: int = 0, *, eos_id: int | None = None,
                   backward: bool = True, linear: Callable | None = None) -> tuple[float, int, dict[str, torch.Tensor]]:
    """inputs, labels [B, S] -> (mean next-token cross-entropy over the labels that are not -100, their count,
    its gradient for every parameter). The engine's loss of one optimizer step: the sum over the whole global
    batch divided by the global count of valid labels. Computed in the parameters' dtype, `rows_per_pass` rows
    at a time (0: all at once, or one for a large model, which also recomputes each layer in backward); every
    row starts a document, so passes of rows see the documents of the whole batch. `eos_id`: needed when the
    config has document_mask on. `backward` False: the loss alone (no gradients: an empty dict). `linear(x, w)`: the
    decoder's QKV, O, FC1 and FC2 products x w^T (None: exact; harness/judge/claims/fp8_reference.py has an FP8 one)."""
    _check(config)
    vocab = int(config["vocab_size"])
    leaves = {k: v.detach().requires_grad_(backward) for k, v in params.items()}
    large = sum(v.numel() for v in leaves.values()) > _LARGE_MODEL
    rows = rows_per_pass or (1 if large else inputs.shape[0])
    count = int((labels != IGNORE_INDEX).sum())
    if count == 0:
        raise ValueError("the batch has no label that carries a loss")
    total = 0.0
    with torch.set_grad_enabled(backward):
        for i in range(0, inputs.shape[0], rows):
            out = _hidden(leaves, config, inputs[i:i + rows], eos_id, recompute=large and backward, linear=linear or _matmul_t) \
                @ leaves["lm_head"][:vocab].t()
            ce = F.cross_entropy(out.reshape(-1, vocab), labels[i:i + rows].reshape(-1), ignore_index=IGNORE_INDEX,
                                 reduction="sum")
            if backward:
                (ce / count).backward()
            total += float(ce.detach().double())
    if not backward:
        return total / count, count, {}
    grads = {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in leaves.items()}
    return total / count, count, grads
