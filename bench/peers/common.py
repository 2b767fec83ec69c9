"""What every peer shares: the shapes it must match, synthetic batches, the timed loop and its result.

A peer is configured from the engine's own flags (parsed by the engine's parser and resolved by
engine.config.resolve), so it trains the same shapes, batch (mbs x GAS x seq) and vocabulary as the
engine run it is compared with. Its MFU uses the engine's FLOP count (engine/flops.py); before it
trains, each peer counts the matmul parameters of the model it actually built and must match
engine.flops.matmul_params, so a peer with other shapes fails instead of reporting a flattering ratio.
"""

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from engine.cli import build_parser, config_from_args
from engine.config import EngineConfig, resolve
from engine.flops import flops_per_token, matmul_params, mfu, peak_flops, peak_fp8_flops

__all__ = ["engine_config", "check_matmul_params", "linear_params", "synthetic_batches", "time_steps", "summarize"]


def engine_config(flags: list[str], world_size: int | None = None) -> EngineConfig:
    """The resolved EngineConfig of `python -m engine pretrain FLAGS` on `world_size` processes (default:
    --tp processes, one TP group: the layout bench/mfu.py launches)."""
    cfg = config_from_args(build_parser().parse_args(["pretrain", *flags]))
    return resolve(cfg, cfg.tp if world_size is None else world_size)


def linear_params(weights: Iterable[torch.Tensor], lm_head: torch.Tensor, vocab_size: int, tp: int = 1) -> int:
    """Matmul parameters of a built model, counted like engine.flops: every hidden matmul weight, and the LM
    head over the true vocabulary (padding rows are not useful work). With TP the local shards are scaled
    back up by `tp` (every matmul weight is split over TP ranks, never replicated, at the layouts we run)."""
    hidden = sum(w.numel() for w in weights) * tp
    return hidden + lm_head.shape[1] * vocab_size


def check_matmul_params(cfg: EngineConfig, counted: int, peer: str) -> None:
    expected = matmul_params(cfg)
    if counted != expected:
        raise ValueError(f"{peer}: the built model has {counted:,} matmul parameters, the engine's shapes "
                         f"{expected:,}: it is not configured to the same model, so its MFU would not compare")


def synthetic_batches(cfg: EngineConfig, device: torch.device, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """GAS micro-batches of uniform random tokens [mbs, seq] and their next-token labels (all valid); the
    same on every rank (TP ranks must see one batch). Throughput does not depend on the token values."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(cfg.grad_accum_steps):
        ids = torch.randint(0, cfg.vocab_size, (cfg.micro_batch_size, cfg.seq_length + 1), generator=gen)
        out.append((ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], float], *, steps: int, warmup: int, device: torch.device) -> tuple[list[float], list[float]]:
    """Run warmup + steps optimizer steps; wall time of each timed step (device synchronised around it, as
    the engine times its steps) and every step's loss."""
    times, losses = [], []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(float(step()))
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, losses


def _peak_mem_per_rank(device: torch.device) -> list[float]:
    mine = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [float(x) for x in gathered]


def summarize(name: str, cfg: EngineConfig, times: list[float], losses: list[float], device: torch.device,
              world: int, fp8: bool = False, **extra) -> dict:
    """The peer's result record, in the fields the engine's runs use (bench/mfu.py prints both alike). fp8: the peer's
    linears run in FP8, so its MFU is also given against the FP8 dense peak, as a --fp8 engine row's."""
    med = statistics.median(times)
    tokens = cfg.tokens_per_step
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(cfg, dev_name)
    return {"name": name, "kind": "peer", "device": dev_name, "nproc": world, "torch": torch.__version__,
            "tokens_per_step": tokens, "flops_per_token": flops_per_token(cfg), "median_step_s": med,
            "step_s_spread": [min(times), max(times)], "tokens_per_s": tokens / med,
            "mfu": mfu(cfg, tokens, med, world, peak), "peak_tflops": peak / 1e12,
            "mfu_fp8_peak": (mfu(cfg, tokens, med, world, peak_fp8_flops(dataclasses.replace(cfg, fp8="tensorwise"), dev_name))
                             if fp8 else None),
            "peak_mem_gib_per_gpu": _peak_mem_per_rank(device), "losses": losses, "final_loss": losses[-1],
            "step_times_s": times, **extra}
