"""`python -m engine plan`: which TP x DP-mode x mbs x GAS x recompute layout to train a preset with on N GPUs.

Why and how: docs/engine/training.md, section `engine/plan.py`.
"""

import dataclasses
import json
import math
from dataclasses import dataclass

from engine.config import EngineConfig, build_config, resolve
from engine.errors import ConfigError
from engine.flops import PEAK_TFLOPS, flops_per_token
from engine.model.layers import kv_head_range

__all__ = ["Layout", "plan", "memory_bytes", "mfu_estimate", "plan_lines", "HEADROOM"]

HEADROOM = 0.05  # a layout fits when its predicted peak is at most (1 - HEADROOM) x the card's memory
GIB = 2**30
TPS = (1, 2, 4, 8)
MBS = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")

# measured MFU, 4 x H200, MiniCPM4-8B, mbs 2, seq 4096 (bench/results/mfu_8b_4gpu_fsdp_h200x4.json)
_MEASURED = {("zero1", 1): 0.588, ("zero1", 2): 0.531, ("fsdp", 1): 0.497, ("fsdp", 2): 0.461}
_SELECTIVE = {1: 0.85, 2: 0.75}


@dataclass(frozen=True)
class Layout:
    tp: int
    dp: int
    mode: str  # zero1 or fsdp
    mbs: int
    gas: int
    recompute: str
    peak_gib: float
    step_s: float
    mfu: float
    measured: bool  # the MFU estimate is a measured point, not an extrapolation
    fits: bool


def _local_params(cfg: EngineConfig, tp: int) -> tuple[int, int, int]:
    """(this TP rank's parameters, one layer's, the root's) at TP `tp`."""
    h, d = cfg.hidden_size, cfg.head_dim
    lo, hi = kv_head_range(cfg.num_kv_heads, 0, tp)
    qkv = (cfg.num_heads // tp + 2 * (hi - lo)) * d
    layer = qkv * h + h * (cfg.num_heads // tp) * d + 3 * (cfg.ffn_hidden_size // tp) * h + 2 * h
    root = 2 * (cfg.padded_vocab_size // tp) * h + h
    return cfg.num_layers * layer + root, layer, root


def memory_bytes(cfg: EngineConfig, tp: int, dp: int, mode: str, recompute: str) -> float:
    """Predicted peak bytes per GPU (the model: docs/engine/training.md, engine/plan.py)."""
    p, layer, root = _local_params(cfg, tp)
    if mode == "fsdp":
        state = 16 * p / dp + 2 * (root - cfg.hidden_size) + 3 * 2 * layer
    else:
        state = 6 * p + 12 * p / dp
    h, f = cfg.hidden_size, cfg.ffn_hidden_size // tp
    lo, hi = kv_head_range(cfg.num_kv_heads, 0, tp)
    q = cfg.num_heads // tp * cfg.head_dim
    qkv = q + 2 * (hi - lo) * cfg.head_dim
    tokens = cfg.micro_batch_size * cfg.seq_length
    none = 2 * tokens * (5 * h + 2 * qkv + q + 3 * f)
    per_layer = {"none": none, "selective": 2 * tokens * (4 * h + qkv), "full": 2 * tokens * 2 * h}[recompute]
    return state + cfg.num_layers * per_layer + (none if recompute == "full" else 0)


def mfu_estimate(tp: int, mode: str, mbs: int, recompute: str) -> tuple[float, bool]:
    """(MFU, whether it is a measured point) for a layout (docs/engine/training.md says where the numbers come from)."""
    base_tp = min(tp, 2)
    value = _MEASURED[(mode, base_tp)] * 0.9 ** max(0, int(math.log2(tp)) - 1)
    measured = tp <= 2 and mbs == 2 and recompute != "full"
    if recompute == "selective":
        value *= _SELECTIVE[base_tp]
    elif recompute == "full":
        value *= 0.75
    if mbs == 1:
        value *= 0.94
    return value, measured


def plan(preset: str, gpus: int, gpu_mem_gib: float, seq_length: int = 0, global_batch: int = 0,
         peak_tflops: float = PEAK_TFLOPS["H100"]) -> list[Layout]:
    """Every layout `resolve` accepts, fastest first. seq_length 0: the preset's; global_batch 0: 4 samples per GPU."""
    if gpus < 1:
        raise ConfigError("--gpus", gpus, "use a positive number of GPUs", "is out of range")
    if not gpu_mem_gib > 0:
        raise ConfigError("--gpu-mem-gib", gpu_mem_gib, "use the card's memory in GiB, e.g. 80 or 141", "is out of range")
    base = build_config({"preset": preset, **({"seq_length": seq_length} if seq_length else {})})
    batch = global_batch or 4 * gpus
    out: list[Layout] = []
    for tp in TPS:
        for mode in ("zero1", "fsdp"):
            for mbs in MBS:
                for recompute in RECOMPUTE:
                    try:
                        cfg = resolve(dataclasses.replace(base, tp=tp, fsdp=mode == "fsdp", micro_batch_size=mbs,
                                                          global_batch_size=batch, grad_accum_steps=0,
                                                          activation_checkpointing=recompute), gpus)
                    except ConfigError:
                        continue  # a layout the engine refuses (TP vs heads, batch split, --fsdp at DP 1)
                    dp = gpus // tp
                    peak = memory_bytes(cfg, tp, dp, mode, recompute) / GIB
                    mfu, measured = mfu_estimate(tp, mode, mbs, recompute)
                    step = flops_per_token(cfg) * cfg.tokens_per_step / (gpus * peak_tflops * 1e12 * mfu)
                    out.append(Layout(tp, dp, mode, mbs, cfg.grad_accum_steps, recompute, peak, step, mfu, measured,
                                      peak <= (1 - HEADROOM) * gpu_mem_gib))
    if not out:
        raise ConfigError("--gpus", gpus, f"use a GPU count that --global-batch {batch} splits into (a multiple of TP x "
                          f"DP x mbs)", f"admits no layout of {preset}")
    if not any(x.fits for x in out):
        least = min(out, key=lambda x: x.peak_gib)
        raise ConfigError("--gpu-mem-gib", gpu_mem_gib, f"use more GPUs or cards with more memory (the least any layout "
                          f"needs is {least.peak_gib:.1f} GiB per GPU: TP {least.tp} x DP {least.dp} {least.mode}, mbs "
                          f"{least.mbs}, recompute {least.recompute})", f"fits no layout of {preset} on {gpus} GPU(s) "
                          f"with {HEADROOM:.0%} headroom")
    return sorted(out, key=lambda x: (not x.fits, x.step_s))


def plan_lines(layouts: list[Layout], gpu_mem_gib: float, as_json: bool = False) -> list[str]:
    """The table (or one JSON object) `python -m engine plan` prints; the fastest fitting layout is named last."""
    best = next(x for x in layouts if x.fits)
    if as_json:
        return [json.dumps({"gpu_mem_gib": gpu_mem_gib, "headroom": HEADROOM, "fastest": dataclasses.asdict(best),
                            "layouts": [dataclasses.asdict(x) for x in layouts]}, indent=1)]
    lines = [f"{'TP':>3}{'DP':>4} {'mode':<6}{'mbs':>4}{'GAS':>5} {'recompute':<10}{'peak GiB':>9}{'step s':>8}"
             f"{'MFU':>7}  fits (<= {(1 - HEADROOM) * gpu_mem_gib:.1f} GiB)"]
    for x in layouts:
        lines.append(f"{x.tp:>3}{x.dp:>4} {x.mode:<6}{x.mbs:>4}{x.gas:>5} {x.recompute:<10}{x.peak_gib:>9.1f}"
                     f"{x.step_s:>8.3f}{x.mfu:>7.3f}{'' if x.measured else ' est'}  {'yes' if x.fits else 'no'}")
    lines.append(f"fastest that fits: TP {best.tp} x DP {best.dp} {best.mode}, mbs {best.mbs}, GAS {best.gas}, recompute "
                 f"{best.recompute}: {best.peak_gib:.1f} GiB, {best.step_s:.3f} s/step, MFU {best.mfu:.3f}"
                 + ("" if best.measured else " (estimated)"))
    return lines

