"""muP learning rates: which parameters train at lr / width_mult, width_mult = hidden_size / dim_model_base.

Why and how: docs/engine/optim.md, section `engine/optim/mup.py`.
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
