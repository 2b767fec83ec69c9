"""`python -m engine plan`: which TP x DP-mode x mbs x GAS x recompute layout to train a preset with on N GPUs.

Why and how: docs/engine/training.md, section `engine/plan.py`.
"""

import dataclasses
import functools
import json
import math
from dataclasses import dataclass

from engine.config import EngineConfig, build_config, resolve
from engine.errors import ConfigError
from engine.flops import PEAK_TFLOPS, flops_per_token
from engine.model.layers import kv_head_range

__all__ = ["Layout", "plan", "predict", "memory_bytes", "mfu_estimate", "dp_bytes", "fsdp_time_model", "plan_lines",
           "fp8_bytes_per_layer", "fp8_speedup", "HEADROOM", "FSDP_OPTIONS"]

HEADROOM = 0.05  # a layout fits when its predicted peak is at most (1 - HEADROOM) x the card's memory
GIB = 2**30
TPS = (1, 2, 4, 8)
MBS = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")

# measured MFU, 4 x H200, MiniCPM4-8B, mbs 2, seq 4096, global batch 16 (bench/results/mfu_8b_4gpu_fsdp_h200x4.json,
# mfu_8b_4gpu_fsdp_tune_h200x4.json, mfu_8b_4gpu_recheck_h200x4.json: ZeRO-1 and FSDP2's defaults the mean of the runs)
_MEASURED = {("zero1", 1): 0.589, ("zero1", 2): 0.533, ("fsdp", 1): 0.498, ("fsdp", 2): 0.461}
_SELECTIVE = {1: 0.85, 2: 0.75}
_MEASURED_AT = {"preset": "minicpm4-8b", "seq_length": 4096, "micro_batch_size": 2, "global_batch_size": 16, "gpus": 4,
                "peak_tflops": PEAK_TFLOPS["H200"]}
# --fsdp measured away from its defaults at _MEASURED_AT (bench/results/mfu_8b_4gpu_fsdp_tune_h200x4.json): (TP, the
# fields that differ from their defaults) -> MFU. With the two defaults above, what fsdp_time_model() is fitted to.
_FSDP_MEASURED = (
    (1, {"fsdp_prefetch": 1}, 0.509),
    (1, {"fsdp_reshard_after_forward": "never"}, 0.534),
    (1, {"fsdp_grad_sync": "step"}, 0.511),
    (1, {"fsdp_reduce_dtype": "bf16"}, 0.515),
    (1, {"fsdp_prefetch": 1, "fsdp_reshard_after_forward": "never", "fsdp_grad_sync": "step"}, 0.558),
    (2, {"fsdp_prefetch": 1, "fsdp_reshard_after_forward": "never", "fsdp_grad_sync": "step"}, 0.519),
    (1, {"fsdp_prefetch": 1, "fsdp_reduce_dtype": "bf16"}, 0.525),
)
# --fp8 tensorwise's speed over bf16 at the same layout (tokens/s ratio, MiniCPM4-8B, mbs 2, seq 4096, 4 x H200) with
# the FP8 kernels a run gets by default (gemm_fc1 triton, the Triton cast; fifteenth session): (DP mode, TP,
# --fp8-weight-cache) -> ratio. ZeRO-1 DP 4 with the cache: bench/results/mfu_8b_4gpu_fp8_s15_h200x4.json; DP 4 without
# it, TP 1 x FSDP 4 and ZeRO-1 TP 2 x DP 2 with it: mfu_8b_4gpu_fp8_layouts_s15_h200x4.json (one job, each beside its
# bf16 twin). The kernels before them (--op-gemm-fc1 compiled, the compiled cast) measured 1.292 / 1.092 / 1.187 /
# 1.208 at these points (docs/fp8.md). Elsewhere fp8_speedup() says how it extrapolates.
_FP8_SPEEDUP = {("zero1", 1, True): 1.399, ("zero1", 1, False): 1.379, ("fsdp", 1, False): 1.309,
                ("zero1", 2, True): 1.179}
# The --fsdp variants plan(fsdp_knobs=...) ranks, as (--fsdp-reshard-after-forward, --fsdp-reduce-dtype): off, FSDP2's
# defaults only; exact (the default), also `never` (the same sums); all, also the bf16 reduce-scatter (bf16 sums).
# --fsdp-grad-sync step is modelled (memory_bytes, dp_bytes, the time model) but not ranked: `never` saves more
# bytes for less memory. --fsdp-prefetch is in the time model (measured) but not ranked.
FSDP_OPTIONS = {"off": (("default", "fp32"),), "exact": (("default", "fp32"), ("never", "fp32")),
                "all": (("default", "fp32"), ("never", "fp32"), ("default", "bf16"), ("never", "bf16"))}


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
    reshard: str = ""  # --fsdp: --fsdp-reshard-after-forward
    reduce: str = ""  # --fsdp: --fsdp-reduce-dtype

    @property
    def label(self) -> str:
        """zero1, fsdp, or fsdp with its knobs away from their defaults (fsdp/never, fsdp/bf16, fsdp/never/bf16)."""
        knobs = [k for k, default in ((self.reshard, "default"), (self.reduce, "fp32")) if k and k != default]
        return "/".join([self.mode, *knobs])


def _local_params(cfg: EngineConfig, tp: int) -> tuple[int, int, int]:
    """(this TP rank's parameters, one layer's, the root's) at TP `tp`."""
    h, d = cfg.hidden_size, cfg.head_dim
    lo, hi = kv_head_range(cfg.num_kv_heads, 0, tp)
    qkv = (cfg.num_heads // tp + 2 * (hi - lo)) * d
    layer = qkv * h + h * (cfg.num_heads // tp) * d + 3 * (cfg.ffn_hidden_size // tp) * h + 2 * h
    root = 2 * (cfg.padded_vocab_size // tp) * h + h
    return cfg.num_layers * layer + root, layer, root


def memory_bytes(cfg: EngineConfig, dp: int) -> float:
    """Predicted peak bytes per GPU of the resolved `cfg` on `dp` data-parallel ranks (the model:
    docs/engine/training.md, engine/plan.py): TP, --fsdp and its knobs, GAS, recompute as `cfg` says."""
    p, layer, root = _local_params(cfg, cfg.tp)
    if cfg.fsdp:
        reshard = cfg.fsdp_reshard_after_forward
        gathered = p - root + 2 * layer if reshard == "never" else 3 * layer
        state = 16 * p / dp + 2 * (root - cfg.hidden_size) + 2 * gathered
        if cfg.fsdp_grad_sync == "step" and cfg.grad_accum_steps > 1:
            # the unsharded fp32 gradients accumulated over the micro-batches, held from the first backward; the
            # sharded fp32 gradient (in 16 P / d) exists only after the last one's reduce-scatter, past the peak
            state += 4 * p - 4 * p / dp
    else:
        state = 6 * p + 12 * p / dp
    h, f = cfg.hidden_size, cfg.ffn_hidden_size // cfg.tp
    lo, hi = kv_head_range(cfg.num_kv_heads, 0, cfg.tp)
    q = cfg.num_heads // cfg.tp * cfg.head_dim
    qkv = q + 2 * (hi - lo) * cfg.head_dim
    tokens = cfg.micro_batch_size * cfg.seq_length
    none = 2 * tokens * (5 * h + 2 * qkv + q + 3 * f)
    recompute = cfg.activation_checkpointing
    per_layer = {"none": none, "selective": 2 * tokens * (4 * h + qkv), "full": 2 * tokens * 2 * h}[recompute]
    per_layer += fp8_bytes_per_layer(cfg, p_layer=layer - 2 * h, tokens=tokens, h=h, f=f)
    return state + cfg.num_layers * per_layer + (none if recompute == "full" else 0)


def fp8_bytes_per_layer(cfg: EngineConfig, p_layer: int, tokens: int, h: int, f: int) -> int:
    """What --fp8 adds to a layer's share of the peak (bytes; p_layer: its linear weights on this TP rank). Tensorwise
    keeps FP8 copies (docs/fp8.md): each weight's, 1 byte a parameter from forward to backward (the transposed copy
    dgrad takes), 2 with --fp8-weight-cache (both layouts, held through the step, whatever the recompute); and the
    inputs of FC1 and FC2 saved as FP8 in place of bf16 (1 byte an element less: QKV's and O's bf16 inputs stay held
    by the norm and the attention). Under recompute the copies and inputs are made again in backward: only the
    cache stays. Rowwise recasts in backward from the bf16 tensors: nothing held. Measured: within 0.5 GiB of each
    FP8 run's peak less its bf16 twin's (0.47 at TP 2, <= 0.05 elsewhere; tests/engine/test_plan.py)."""
    if cfg.fp8 != "tensorwise":
        return 0
    if cfg.activation_checkpointing != "none":
        return 2 * p_layer if cfg.fp8_weight_cache else 0
    return (2 if cfg.fp8_weight_cache else 1) * p_layer - tokens * (h + f)


def fp8_speedup(cfg: EngineConfig) -> tuple[float, bool]:
    """(--fp8's tokens/s over bf16 at cfg's layout, whether measured at the 4-GPU point without recompute). Measured
    at TP 1 (ZeRO-1 with and without the weight cache, FSDP without) and TP 2 (ZeRO-1, cache); elsewhere, in this
    order: the same DP mode's ratio with the cache the other way, times (or over) what the cache is worth at TP 1
    under ZeRO-1; ZeRO-1's at that TP likewise; TP 2's past TP 2.
    Rowwise: 1.0 (not measured at the CuTeDSL defaults; torchao's rowwise 1.05x on the slice)."""
    if cfg.fp8 != "tensorwise":
        return (1.0, False) if cfg.fp8 == "rowwise" else (1.0, True)
    mode, tp, cache = "fsdp" if cfg.fsdp else "zero1", min(cfg.tp, 2), cfg.fp8_weight_cache
    worth = _FP8_SPEEDUP[("zero1", 1, True)] / _FP8_SPEEDUP[("zero1", 1, False)]  # the cache's, as a factor
    other = worth if cache else 1 / worth
    for key, factor in (((mode, tp, cache), 1.0), ((mode, tp, not cache), other), (("zero1", tp, cache), 1.0)):
        if key in _FP8_SPEEDUP:  # measured: the layout and point the runs had (no recompute)
            exact = key == (mode, cfg.tp, cache) and cfg.activation_checkpointing == "none"
            return _FP8_SPEEDUP[key] * factor, exact
    return _FP8_SPEEDUP[("zero1", tp, not cache)] * other, False  # ZeRO-1 at TP 1 and 2 has one of the two


def dp_bytes(cfg: EngineConfig) -> float:
    """Bytes of one step's data-parallel collectives per GPU of the resolved `cfg` (buffer sizes: parameter
    all-gathers in bf16, gradient reduce-scatters in the reduce dtype)."""
    p, layer, root = _local_params(cfg, cfg.tp)
    if not cfg.fsdp:
        return 2 * p + 4 * p  # one all-gather after the step, one fp32 reduce-scatter on the last micro-batch
    gas, reshard = cfg.grad_accum_steps, cfg.fsdp_reshard_after_forward
    # gathered again in backward: the layers resharded after forward (the root never is)
    again = {"always": p - root, "default": p - root - layer, "never": 0}[reshard]
    forward = 1 if reshard == "never" else gas  # never: the weights stay gathered across the micro-batches
    reduces = 1 if cfg.fsdp_grad_sync == "step" else gas
    return 2 * (forward * p + gas * again) + reduces * {"fp32": 4, "bf16": 2}[cfg.fsdp_reduce_dtype] * p


def _at_measured(tp: int, **fields) -> EngineConfig:
    """The resolved config of a measured point (_MEASURED_AT) at TP `tp`, `fields` overridden."""
    at = _MEASURED_AT
    base = build_config({"preset": at["preset"], "seq_length": at["seq_length"]})
    return resolve(dataclasses.replace(base, tp=tp, micro_batch_size=at["micro_batch_size"],
                                       global_batch_size=at["global_batch_size"], grad_accum_steps=0, **fields),
                   at["gpus"])


def _fsdp_terms(cfg: EngineConfig, dp: int, zero1_step: float) -> tuple[float, float, float]:
    """The time model's three regressors for --fsdp `cfg`: the extra bytes of DP collectives over ZeRO-1's x (DP - 1)
    / DP (the share each rank sends), ZeRO-1's step time (FSDP2's own cost scales with the work: copy-in / copy-out
    around each collective, the DTensor optimizer, no gradient-accumulation fusion), and that time again where
    --fsdp-prefetch is on (the all-gathers no longer queue behind the layer's kernels on one hardware queue)."""
    extra = (dp_bytes(cfg) - dp_bytes(dataclasses.replace(cfg, fsdp=False))) * (dp - 1) / dp
    return extra, zero1_step, zero1_step if cfg.fsdp_prefetch else 0.0


@functools.cache
def _fsdp_points() -> tuple[tuple[EngineConfig, float], ...]:
    """The measured --fsdp points as (resolved config, MFU): FSDP2's defaults at TP 1 and 2, and _FSDP_MEASURED."""
    points = [(tp, {}, _MEASURED[("fsdp", tp)]) for tp in (1, 2)] + list(_FSDP_MEASURED)
    return tuple((_at_measured(tp, fsdp=True, **fields), mfu) for tp, fields, mfu in points)


def _point(cfg: EngineConfig) -> tuple:
    """What identifies a measured point: the model, the layout, the batch and the --fsdp knobs."""
    return (cfg.num_layers, cfg.hidden_size, cfg.ffn_hidden_size, cfg.padded_vocab_size, cfg.tp, cfg.fsdp,
            cfg.micro_batch_size, cfg.seq_length, cfg.global_batch_size, cfg.activation_checkpointing,
            cfg.fsdp_reshard_after_forward, cfg.fsdp_grad_sync, cfg.fsdp_reduce_dtype, cfg.fsdp_prefetch)


@functools.cache
def fsdp_time_model() -> tuple[float, float, float]:
    """(seconds per DP byte, FSDP2's overhead as a share of ZeRO-1's step, the share prefetch saves): least squares
    over the nine measured --fsdp points (_fsdp_points) of the gap to ZeRO-1's time at the same point. Fitted
    residuals: within 0.025 s of 1.5-1.8 s steps (tests/engine/test_plan.py)."""
    import torch  # the engine's one dependency; a 3-column least squares

    rows, gaps = [], []
    for cfg, mfu in _fsdp_points():
        work = flops_per_token(cfg) * cfg.tokens_per_step / (_MEASURED_AT["gpus"] * _MEASURED_AT["peak_tflops"] * 1e12)
        zero1_step = work / _MEASURED[("zero1", cfg.tp)]
        rows.append(_fsdp_terms(cfg, _MEASURED_AT["gpus"] // cfg.tp, zero1_step))
        gaps.append(work / mfu - zero1_step)
    a = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(gaps, dtype=torch.float64).unsqueeze(1)
    scale = a.abs().max(dim=0).values  # the columns differ by 1e11: solve in units of each column's largest
    x = torch.linalg.lstsq(a / scale, b).solution.squeeze(1) / scale
    return tuple(float(v) for v in x)


def mfu_estimate(tp: int, mbs: int, recompute: str) -> tuple[float, bool]:
    """(MFU, whether it is a measured point) of a ZeRO-1 layout (docs/engine/training.md says where the numbers come
    from); --fsdp is ZeRO-1's time plus fsdp_time_model()'s gap, or its own measured point (predict)."""
    base_tp = min(tp, 2)
    value = _MEASURED[("zero1", base_tp)] * 0.9 ** max(0, int(math.log2(tp)) - 1)
    measured = tp <= 2 and mbs == 2 and recompute != "full"
    if recompute == "selective":
        value *= _SELECTIVE[base_tp]
    elif recompute == "full":
        value *= 0.75
    if mbs == 1:
        value *= 0.94
    return value, measured


def predict(cfg: EngineConfig, gpus: int, peak_tflops: float = PEAK_TFLOPS["H100"]) -> tuple[float, float, float, bool]:
    """(peak GiB per GPU, step seconds, MFU, whether the MFU is a measured point) of the resolved `cfg` on `gpus` GPUs.
    --fsdp: the measured point where there is one, else ZeRO-1's time at that point plus fsdp_time_model()'s gap (the
    extra bytes of data-parallel collectives, FSDP2's own overhead, less what prefetch saves; never below ZeRO-1's)."""
    dp = gpus // cfg.tp
    work = flops_per_token(cfg) * cfg.tokens_per_step / (gpus * peak_tflops * 1e12)
    point = (cfg.micro_batch_size, cfg.activation_checkpointing)
    mfu, measured = mfu_estimate(cfg.tp, *point)
    step = work / mfu
    if cfg.fsdp:
        at = gpus == _MEASURED_AT["gpus"]
        measured_mfu = next((m for c, m in _fsdp_points() if at and _point(c) == _point(cfg)), None)
        if measured_mfu is not None:
            step = work / measured_mfu
        else:
            per_byte, overhead, prefetch = fsdp_time_model()
            extra, zero1_step, with_prefetch = _fsdp_terms(cfg, dp, step)
            step += max(per_byte * extra + overhead * zero1_step + prefetch * with_prefetch, 0.0)
            measured = False
    speedup, fp8_measured = fp8_speedup(cfg)
    return memory_bytes(cfg, dp) / GIB, step / speedup, speedup * work / step, measured and fp8_measured


def plan(preset: str, gpus: int, gpu_mem_gib: float, seq_length: int = 0, global_batch: int = 0,
         peak_tflops: float = PEAK_TFLOPS["H100"], fsdp_knobs: str = "exact", fp8: str = "off",
         fp8_weight_cache: bool = False) -> list[Layout]:
    """Every layout `resolve` accepts, fastest first. seq_length 0: the preset's; global_batch 0: 4 samples per GPU.
    fsdp_knobs: which --fsdp variants besides FSDP2's defaults to rank (FSDP_OPTIONS); fp8, fp8_weight_cache: every
    layout with --fp8 (and --fp8-weight-cache), its memory and speed (fp8_bytes_per_layer, fp8_speedup)."""
    if gpus < 1:
        raise ConfigError("--gpus", gpus, "use a positive number of GPUs", "is out of range")
    if not gpu_mem_gib > 0:
        raise ConfigError("--gpu-mem-gib", gpu_mem_gib, "use the card's memory in GiB, e.g. 80 or 141", "is out of range")
    base = build_config({"preset": preset, **({"seq_length": seq_length} if seq_length else {})})
    batch = global_batch or 4 * gpus
    if fsdp_knobs not in FSDP_OPTIONS:
        raise ConfigError("--fsdp-knobs", fsdp_knobs, f"use one of: {', '.join(FSDP_OPTIONS)}", "is not a valid choice")
    options = [("zero1", "", "")] + [("fsdp", reshard, reduce) for reshard, reduce in FSDP_OPTIONS[fsdp_knobs]]
    out: list[Layout] = []
    fp8_refusal: ConfigError | None = None  # why --fp8 admits no layout, if it is --fp8's own field that refuses
    for tp in TPS:
        for mode, reshard, reduce in options:
            for mbs in MBS:
                for recompute in RECOMPUTE:
                    knobs = {"fsdp_reshard_after_forward": reshard, "fsdp_reduce_dtype": reduce} if reshard else {}
                    try:
                        cfg = resolve(dataclasses.replace(base, tp=tp, fsdp=mode == "fsdp", micro_batch_size=mbs,
                                                          global_batch_size=batch, grad_accum_steps=0,
                                                          activation_checkpointing=recompute, fp8=fp8,
                                                          fp8_weight_cache=fp8_weight_cache, **knobs), gpus)
                    except ConfigError as err:
                        if err.field.startswith("--fp8"):
                            fp8_refusal = err
                        continue  # a layout the engine refuses (TP vs heads, batch split, --fsdp at DP 1)
                    peak, step, mfu, measured = predict(cfg, gpus, peak_tflops)
                    out.append(Layout(tp, gpus // tp, mode, mbs, cfg.grad_accum_steps, recompute, peak, step, mfu,
                                      measured, peak <= (1 - HEADROOM) * gpu_mem_gib, reshard, reduce))
    if not out and fp8_refusal is not None:
        raise fp8_refusal
    if not out:
        raise ConfigError("--gpus", gpus, f"use a GPU count that --global-batch {batch} splits into (a multiple of TP x "
                          f"DP x mbs)", f"admits no layout of {preset}")
    if not any(x.fits for x in out):
        least = min(out, key=lambda x: x.peak_gib)
        raise ConfigError("--gpu-mem-gib", gpu_mem_gib, f"use more GPUs or cards with more memory (the least any layout "
                          f"needs is {least.peak_gib:.1f} GiB per GPU: TP {least.tp} x DP {least.dp} {least.label}, mbs "
                          f"{least.mbs}, recompute {least.recompute})", f"fits no layout of {preset} on {gpus} GPU(s) "
                          f"with {HEADROOM:.0%} headroom")
    return sorted(out, key=lambda x: (not x.fits, x.step_s, x.peak_gib))  # a tie: the smaller one


def plan_lines(layouts: list[Layout], gpu_mem_gib: float, as_json: bool = False, fp8: str = "off",
               fp8_weight_cache: bool = False) -> list[str]:
    """The table (or one JSON object) `python -m engine plan` prints; the fastest fitting layout is named last, with
    the --fp8 flags every layout was planned with."""
    best = next(x for x in layouts if x.fits)
    flags = "" if fp8 == "off" else f"--fp8 {fp8}" + (" --fp8-weight-cache" if fp8_weight_cache else "")
    if as_json:
        return [json.dumps({"gpu_mem_gib": gpu_mem_gib, "headroom": HEADROOM, "fp8": fp8,
                            "fp8_weight_cache": fp8_weight_cache, "fastest": dataclasses.asdict(best),
                            "layouts": [dataclasses.asdict(x) for x in layouts]}, indent=1)]
    lines = [f"{'TP':>3}{'DP':>4} {'mode':<16}{'mbs':>4}{'GAS':>5} {'recompute':<10}{'peak GiB':>9}{'step s':>8}"
             f"{'MFU':>7}  fits (<= {(1 - HEADROOM) * gpu_mem_gib:.1f} GiB)"]
    for x in layouts:
        lines.append(f"{x.tp:>3}{x.dp:>4} {x.label:<16}{x.mbs:>4}{x.gas:>5} {x.recompute:<10}{x.peak_gib:>9.1f}"
                     f"{x.step_s:>8.3f}{x.mfu:>7.3f}{'' if x.measured else ' est'}  {'yes' if x.fits else 'no'}")
    lines.append(f"fastest that fits: TP {best.tp} x DP {best.dp} {best.label}, mbs {best.mbs}, GAS {best.gas}, recompute "
                 f"{best.recompute}{', ' + flags if flags else ''}: {best.peak_gib:.1f} GiB, {best.step_s:.3f} s/step, "
                 f"MFU {best.mfu:.3f}" + ("" if best.measured else " (estimated)"))
    return lines

