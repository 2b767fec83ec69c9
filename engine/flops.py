"""The FLOP count behind every MFU the engine prints (the Megatron / ForgeTrain count).

Per token: 6 x (parameters of the matmuls: QKV, O, FC1 (gate and up), FC2, and the LM head over the
true vocabulary) + 6 x L x (num_heads x head_dim) x seq for causal attention (QK^T and AV,
forward and backward, halved for the causal mask). Embedding lookups count 0. Recomputation is not
counted (it is overhead, not useful work). MFU = that x tokens / (seconds x devices x peak).

The peak is bf16's (every MFU the engine prints, `mfu`, so numbers stay comparable across runs); a --fp8 run also
reports `mfu_fp8_peak` (metrics.jsonl) against the dense FP8 peak, twice bf16's on every part with FP8 tensor cores
(NVIDIA H100 / H200 datasheets: FP8 Tensor Core 3,958 TFLOP/s with 2:4 sparsity, so 1,979 dense, beside BF16's
1,979 with sparsity, 989 dense). Only the decoder's linears run in FP8, so no run can reach the FP8 peak.
"""

from engine.config import EngineConfig
from engine.errors import ConfigError

__all__ = ["matmul_params", "flops_per_token", "peak_flops", "peak_fp8_flops", "mfu", "PEAK_TFLOPS", "PEAK_FP8_TFLOPS"]

# Dense bf16 tensor-core peak per device, TFLOP/s (vendor datasheets, SXM parts, no sparsity).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "GH200": 989.0, "A100": 312.0, "A800": 312.0,
               "B200": 2250.0, "B100": 1750.0, "L40S": 362.0}
# Dense FP8 (E4M3 / E5M2) tensor-core peak per device, TFLOP/s (same datasheets, no sparsity): the parts with FP8
# tensor cores (compute capability 8.9+, engine/distributed/fp8.py check_fp8_device), each twice its bf16 peak.
PEAK_FP8_TFLOPS = {"H100": 1979.0, "H200": 1979.0, "H800": 1979.0, "GH200": 1979.0, "B200": 4500.0, "B100": 3500.0,
                   "L40S": 733.0}


def matmul_params(cfg: EngineConfig) -> int:
    h, d = cfg.hidden_size, cfg.head_dim
    qkv = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    o = cfg.num_heads * d * h
    fc1 = h * 2 * cfg.ffn_hidden_size
    fc2 = cfg.ffn_hidden_size * h
    return cfg.num_layers * (qkv + o + fc1 + fc2) + h * cfg.vocab_size


def flops_per_token(cfg: EngineConfig) -> float:
    attention = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cfg.seq_length
    return 6.0 * matmul_params(cfg) + attention


def peak_flops(cfg: EngineConfig, device_name: str) -> float:
    """Peak FLOP/s of one device: --peak-tflops if given, else by GPU model name; 0 on CPU (no MFU)."""
    if cfg.peak_tflops > 0:
        return cfg.peak_tflops * 1e12
    if device_name == "cpu":
        return 0.0
    return _by_name(PEAK_TFLOPS, cfg, device_name, f"pass the bf16 dense peak of a {device_name!r} in TFLOP/s",
                    "is unset and the GPU is not in the known list")


def peak_fp8_flops(cfg: EngineConfig, device_name: str) -> float:
    """Dense FP8 peak FLOP/s of one device for a --fp8 run: twice --peak-tflops if given (bf16's, and FP8's is twice
    it on every part in PEAK_FP8_TFLOPS), else by GPU model name; 0 with --fp8 off or on CPU (no MFU)."""
    if cfg.fp8 == "off" or (device_name == "cpu" and cfg.peak_tflops <= 0):
        return 0.0
    if cfg.peak_tflops > 0:
        return 2.0 * cfg.peak_tflops * 1e12
    return _by_name(PEAK_FP8_TFLOPS, cfg, device_name, f"pass the bf16 dense peak of a {device_name!r} in TFLOP/s "
                    "(the FP8 one is taken as twice it)", "is unset and the GPU has no FP8 peak in the known list")


def _by_name(table: dict[str, float], cfg: EngineConfig, device_name: str, fix: str, why: str) -> float:
    """The peak FLOP/s of the first part of `table` the device's name contains; else refused naming --peak-tflops."""
    for key, tflops in table.items():
        if key in device_name.upper():
            return tflops * 1e12
    raise ConfigError("--peak-tflops", cfg.peak_tflops, fix, why)


def mfu(cfg: EngineConfig, tokens: int, seconds: float, num_devices: int, peak: float) -> float:
    if peak <= 0 or seconds <= 0:
        return 0.0
    return flops_per_token(cfg) * tokens / (seconds * num_devices * peak)
