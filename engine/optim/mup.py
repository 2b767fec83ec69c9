"""muP learning rates: which parameters train at lr / width_mult, width_mult = hidden_size / dim_model_base.

The recipe is muP for Adam (Tensor Programs V, Yang et al. 2022, Table 3; the `mup` package's
MuAdam), as MiniCPM trains with it (the MiniCPM report's muP "wind tunnel" setup; DESIGN.md section 3):
- hidden matrices, whose fan-in and fan-out both grow with the width (attention QKV and O, MLP FC1
  and FC2): lr / width_mult;
- vector-like parameters, with at most one dimension growing with the width: the embedding (its
  fan-in is the vocabulary) and the RMSNorm gains keep the base lr;
- the LM head (the readout) is vector-like in muP-Adam too: its forward is already divided by
  width_mult (engine/model/transformer.py, as the `mup` package's MuReadout divides its output),
  so its lr stays at the base lr. MiniCPM's small models tie it to the embedding, which trains at
  the base lr; the untied head here gets the same.
With --no-mup (the llama-style presets) every multiplier is 1.

Weight decay is decoupled AdamW as torch applies it: p <- p - lr_group * wd * p, so a group's decay
per step scales with its lr multiplier (hidden matrices decay at lr / width_mult x wd), as MiniCPM's
param groups and MuAdamW do.
"""

from torch import nn

from engine.config import EngineConfig
from engine.model.layers import MLP, Attention

__all__ = ["lr_multipliers", "describe_multipliers"]


def lr_multipliers(model: nn.Module, cfg: EngineConfig) -> dict[str, float]:
    """Parameter name (as model.named_parameters() gives it) -> factor on the scheduled lr."""
    hidden = 1.0 / (cfg.hidden_size / cfg.dim_model_base) if cfg.mup else 1.0
    out = {name: 1.0 for name, _ in model.named_parameters()}
    for prefix, module in model.named_modules():
        if isinstance(module, (Attention, MLP)):
            for name, param in module.named_parameters(prefix=prefix):
                assert param.ndim == 2, f"{name}: a hidden matrix must be 2-D"
                out[name] = hidden
    return out


def describe_multipliers(multipliers: dict[str, float], cfg: EngineConfig) -> str:
    """One header line: each distinct multiplier with the parameters it applies to (layer index folded)."""
    kinds: dict[float, list[str]] = {}
    for name, mult in multipliers.items():
        short = ".".join(part for part in name.split(".") if not part.isdigit() and part != "layers")
        if short not in kinds.setdefault(mult, []):
            kinds[mult].append(short)
    why = (f"muP: hidden matrices at lr / (hidden {cfg.hidden_size} / dim_model_base {cfg.dim_model_base})"
           if cfg.mup else "muP off: every parameter at lr")
    groups = "; ".join(f"x{mult:.6g}: {' '.join(names)}" for mult, names in sorted(kinds.items()))
    return (f"[RUN] optim lr multipliers ({why}) {groups}; weight decay {cfg.weight_decay:g} on 2-D tensors, "
            f"decoupled (lr x multiplier x wd)")
