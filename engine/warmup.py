"""`python -m engine warmup-kernels`: compile every configured op on the run's shapes, fill the cache.

Why and how: docs/engine/training.md, section `engine/warmup.py`.
"""

import dataclasses
import time

import torch

from engine.config import EngineConfig, resolve
from engine.ops.dispatch import OP_NAMES, check_documents, load_op, resolve_version
from engine.ops.kernel_cache import kernel_cache_root
from engine.ops.workloads import call_op, grad_leaves, make_inputs, op_shapes, rank_callable
from engine.train import make_reproducible

__all__ = ["warmup_kernels", "warm_op"]


def _sync() -> None:
    torch.cuda.synchronize()


def warm_op(op: str, fn, cfg: EngineConfig, *, device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """(first call s, warm call s) of forward + backward of `fn` on cfg's per-rank shapes."""
    shapes = op_shapes(cfg)
    call = rank_callable(op, fn, shapes)
    times = []
    for seed in (0, 1):
        inputs = make_inputs(op, shapes, device=device, dtype=dtype, seed=seed)
        _sync()
        t0 = time.perf_counter()
        outs = call_op(op, call, inputs, shapes)
        loss = sum(o.float().sum() for o in outs)
        loss.backward()
        _sync()
        times.append(time.perf_counter() - t0)
        del inputs, outs, loss
        if op == "rmsnorm":  # the model calls it with and without a residual
            plain = make_inputs(op, shapes, device=device, dtype=dtype, seed=seed, residual=False)
            call_op(op, call, plain, shapes)[0].float().sum().backward()
            _sync()
            assert all(v.grad is not None for v in grad_leaves(plain).values())
    with torch.no_grad():  # evaluation's forward: a version may launch another kernel variant without autograd
        call_op(op, call, make_inputs(op, shapes, device=device, dtype=dtype, seed=2), shapes)
        _sync()
    return times[0], times[1]


def warmup_kernels(cfg: EngineConfig) -> int:
    """Compile/load every configured op's kernels for cfg's shapes and print a table; returns 0."""
    # One rank's shapes only: the batch split over data-parallel ranks does not matter here.
    cfg = resolve(dataclasses.replace(cfg, grad_accum_steps=0, global_batch_size=0), world_size=cfg.tp)
    if cfg.device == "cpu" or not torch.cuda.is_available():
        print("warmup-kernels: no CUDA device here; CPU runs use the baseline ops, nothing to compile")
        return 0
    make_reproducible(cfg, "cuda")  # --deterministic compiles the ordered attention backward a run would use
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.float32 if cfg.compute_dtype == "fp32" else torch.bfloat16
    s = op_shapes(cfg)
    print(f"warmup-kernels: preset={cfg.preset} tp={cfg.tp} (shapes of one rank) mbs={cfg.micro_batch_size} "
          f"seq={cfg.seq_length} dtype={dtype} device={torch.cuda.get_device_name(device)} "
          f"cache={kernel_cache_root()}")
    print(f"  attention q [{s.batch}, {s.seq}, {s.heads_q}, {s.head_dim}] kv heads {s.heads_kv}"
          f"{' within packed documents (--document-mask: the varlen kernels)' if s.documents else ''}; "
          f"fc1 w [{2 * s.ffn_local}, {s.hidden}]; lm head w [{s.vocab_local}, {s.hidden}]; tokens {s.tokens}")
    rows = []
    total = time.perf_counter()
    for op in OP_NAMES:
        version = resolve_version(op, getattr(cfg, f"op_{op}"), "cuda", fp8=cfg.fp8 != "off")
        fn = load_op(op, version)
        if op == "attention":
            check_documents(cfg, version, fn)
        first, warm = warm_op(op, fn, cfg, device=device, dtype=dtype)
        rows.append((op, version, first, warm))
    total = time.perf_counter() - total
    print(f"{'op':<12} {'version':<10} {'first call s':>13} {'warm call ms':>13} {'compile/load s':>15}")
    for op, version, first, warm in rows:
        note = "  (torch: nothing to compile)" if version == "baseline" else ""
        print(f"{op:<12} {version:<10} {first:>13.2f} {warm * 1e3:>13.2f} {max(0.0, first - warm):>15.2f}{note}")
    print(f"total {total:.1f} s")
    return 0
