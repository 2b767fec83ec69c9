"""`python -m engine export-hf`: a checkpoint -> HF safetensors + config.json (LlamaForCausalLM).

Every preset exports as a plain Llama: MiniCPM's muP scalings are linear, so they fold exactly into
weights (embedding x scale_emb; O and FC2 x scale_depth / sqrt(L); LM head / (hidden /
dim_model_base)), and transformers loads the result with no custom code. TP shards are gathered:
the checkpoint's layout says how many there are, and the model's own layer code says which rows
or columns each rank held (built on the meta device, so nothing is allocated).
"""

import json
import math
import os
import re
import shutil
from dataclasses import fields
from pathlib import Path

import torch

from engine.atomic_files import check_replaceable, replace_dir, sibling_dir
from engine.checkpoint.store import read_meta, select_checkpoint
from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.model import Transformer
from engine.model.layers import kv_head_range
from engine.ops import resolve_ops

__all__ = ["export_hf", "check_outside", "load_full_weights", "to_llama_state_dict", "llama_config", "config_from_saved"]

_SHARD_BYTES = 5 * 2**30


def config_from_saved(values: dict) -> EngineConfig:
    """A run's resolved config as a checkpoint (or an export) saved it; fields added to EngineConfig since keep
    their defaults, fields removed since are dropped."""
    names = {f.name for f in fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in values.items() if k in names})


def _local_shapes(cfg: EngineConfig, tp_rank: int, tp_size: int) -> dict[str, torch.Size]:
    par = ParallelState(rank=tp_rank, world_size=tp_size, tp_rank=tp_rank, tp_size=tp_size, dp_rank=0, dp_size=1,
                        device=torch.device("meta"))
    with torch.device("meta"):
        model = Transformer(cfg, par, resolve_ops(cfg, torch.device("cpu")), "meta", torch.float32)
    return {name: p.shape for name, p in model.named_parameters()}


def load_full_weights(checkpoint: Path) -> tuple[EngineConfig, dict[str, torch.Tensor]]:
    """The fp32 master weights of a checkpoint, gathered over TP ranks into full engine tensors."""
    import torch.distributed.checkpoint as dcp  # here, not at import: it pulls in DTensor and sympy (engine/checkpoint/store.py)

    meta = read_meta(checkpoint)
    cfg = config_from_saved(meta["config"])
    tp = int(meta["layout"]["tp"])
    shards: list[dict[str, torch.Tensor]] = []
    for r in range(tp):
        shapes = _local_shapes(cfg, r, tp)
        prefix = f"tp{r}/" if tp > 1 else ""
        state = {"optim": {f"{prefix}master/{n}": torch.empty(s.numel()) for n, s in shapes.items()}}
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
        shards.append({n: state["optim"][f"{prefix}master/{n}"].view(s) for n, s in shapes.items()})
    return cfg, _gather_tp(cfg, shards)


def _gather_tp(cfg: EngineConfig, shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    tp = len(shards)
    if tp == 1:
        return shards[0]
    d, hq = cfg.head_dim, cfg.num_heads // tp
    full: dict[str, torch.Tensor] = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        if name.endswith(".attn.qkv"):
            qs, ks, vs, seen = [], [], [], set()
            for r, part in enumerate(parts):
                lo, hi = kv_head_range(cfg.num_kv_heads, r, tp)
                q, k, v = part.split([hq * d, (hi - lo) * d, (hi - lo) * d])
                qs.append(q)
                if (lo, hi) not in seen:  # replicated KV heads are taken once
                    seen.add((lo, hi))
                    ks.append(k)
                    vs.append(v)
            full[name] = torch.cat(qs + ks + vs)
        elif name.endswith(".mlp.fc1"):
            halves = [p.chunk(2) for p in parts]
            full[name] = torch.cat([g for g, _ in halves] + [u for _, u in halves])
        elif name.endswith((".attn.o", ".mlp.fc2")):
            full[name] = torch.cat(parts, dim=1)
        elif name in ("embed.weight", "lm_head"):
            full[name] = torch.cat(parts, dim=0)
        else:  # norm gains are replicated
            full[name] = parts[0]
    return full


def to_llama_state_dict(cfg: EngineConfig, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Engine names -> HF Llama names, muP scalings folded in, vocabulary padding dropped."""
    v, d = cfg.vocab_size, cfg.head_dim
    emb_scale = cfg.scale_emb if cfg.mup else 1.0
    residual = cfg.scale_depth / math.sqrt(cfg.num_layers) if cfg.mup else 1.0
    logit_div = cfg.hidden_size / cfg.dim_model_base if cfg.mup else 1.0
    out = {
        "model.embed_tokens.weight": w["embed.weight"][:v] * emb_scale,
        "model.norm.weight": w["final_norm.weight"],
        "lm_head.weight": w["lm_head"][:v] / logit_div,
    }
    for i in range(cfg.num_layers):
        p, hf = f"layers.{i}", f"model.layers.{i}"
        q, k, vv = w[f"{p}.attn.qkv"].split([cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d])
        gate, up = w[f"{p}.mlp.fc1"].chunk(2)
        out.update({
            f"{hf}.input_layernorm.weight": w[f"{p}.attn_norm.weight"],
            f"{hf}.self_attn.q_proj.weight": q,
            f"{hf}.self_attn.k_proj.weight": k,
            f"{hf}.self_attn.v_proj.weight": vv,
            f"{hf}.self_attn.o_proj.weight": w[f"{p}.attn.o"] * residual,
            f"{hf}.post_attention_layernorm.weight": w[f"{p}.mlp_norm.weight"],
            f"{hf}.mlp.gate_proj.weight": gate,
            f"{hf}.mlp.up_proj.weight": up,
            f"{hf}.mlp.down_proj.weight": w[f"{p}.mlp.fc2"] * residual,
        })
    return {k: t.contiguous() for k, t in out.items()}


def llama_config(cfg: EngineConfig, dtype: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.ffn_hidden_size,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.seq_length, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "initializer_range": cfg.init_std, "torch_dtype": dtype,
        "temper": {"preset": cfg.preset, "mup_folded": cfg.mup},
    }


_WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}  # the CLI's --dtype choices


_EXPORT_FILE = re.compile(r"config\.json|model\.safetensors(\.index\.json)?|model-\d{5}-of-\d{5}\.safetensors")


def _is_export(folder: Path) -> bool:
    """An earlier export-hf output: its config.json and weights, and nothing export-hf did not write."""
    names = [p.name for p in folder.iterdir()]
    return "config.json" in names and all(_EXPORT_FILE.fullmatch(n) for n in names)


def export_hf(checkpoint: str, out: str, dtype: str = "bfloat16") -> Path:
    """Write out/model*.safetensors (+ index when sharded) and out/config.json, atomically."""
    if dtype not in _WEIGHT_DTYPES:
        raise ConfigError("--dtype", dtype, f"use one of: {', '.join(_WEIGHT_DTYPES)}", "is not a weight dtype export-hf writes")
    path, _ = select_checkpoint(checkpoint, Path(checkpoint), flag="--checkpoint")  # verified against its checksums
    target = Path(out)
    check_outside(target, path)
    check_replaceable(target, "--out", _is_export, "HF export")
    cfg, weights = load_full_weights(path)
    tensors = {k: t.to(_WEIGHT_DTYPES[dtype]) for k, t in to_llama_state_dict(cfg, weights).items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling_dir(target, "tmp")
    tmp.mkdir()
    try:
        files = _write_export(tmp, cfg, tensors, dtype)
        replace_dir(tmp, target)
    finally:
        if tmp.exists():  # a failed write leaves nothing behind
            shutil.rmtree(tmp)
    print(f"[EXPORT] {path} -> {target} ({files} file(s), {dtype})")
    return target


def check_outside(target: Path, checkpoint: Path) -> None:
    """An export's --out must not be inside the checkpoint folder (its manifest lists every file there)."""
    if target.resolve().is_relative_to(checkpoint.resolve()):
        raise ConfigError("--out", str(target), "choose a path outside the checkpoint", f"is inside the checkpoint {checkpoint}")


def _write_export(tmp: Path, cfg: EngineConfig, tensors: dict[str, torch.Tensor], dtype: str) -> int:
    """model.safetensors (or 5 GiB shards + their index) and config.json into `tmp`, fsynced; the number of
    safetensors files."""
    from safetensors.torch import save_file  # lazy: only export needs safetensors

    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if groups[-1] and size + nbytes > _SHARD_BYTES:
            groups.append({})
            size = 0
        groups[-1][name] = t
        size += nbytes
    if len(groups) == 1:
        save_file(groups[0], str(tmp / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, group in enumerate(groups):
            fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            save_file(group, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in group})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (tmp / "config.json").write_text(json.dumps(llama_config(cfg, dtype), indent=2))
    mode = (tmp / "config.json").stat().st_mode & 0o777  # what open() gives a new file under the umask
    for f in tmp.iterdir():  # safetensors does not fsync what it writes, and creates its files 0600
        os.chmod(f, mode)
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    return len(groups)
