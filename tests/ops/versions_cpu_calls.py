"""The engine's side of tests/ops/test_ops_versions_cpu.py: runs in the candidate's process (harness.judge.candidate),
never in the test's. Each function asks the engine one question and hands back the answer as data; environment
variables a question needs are set here, for this process only, and restored."""

import contextlib
import dataclasses
import os

import torch

from engine.config import build_config, resolve
from engine.ops.dispatch import OP_NAMES, load_op, load_register, resolve_version
from engine.ops.kernel_cache import DEFAULT_KERNEL_CACHE, kernel_cache_root
from engine.ops.workloads import make_inputs, op_flops, op_shapes

__all__ = ["op_names", "register", "resolve_on_cpu", "load", "shapes", "workload_inputs", "kernel_cache",
           "warm_op_grad_modes"]


@contextlib.contextmanager
def _env(name: str, value: str | None):
    old = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if old is not None:
            os.environ[name] = old


def op_names() -> list:
    return list(OP_NAMES)


def register(op: str) -> dict:
    """{version: {"devices": [...], "requires": [...]}} as the engine reads engine/ops/<op>/register.toml."""
    return {name: {"devices": list(v.devices), "requires": list(v.requires)} for name, v in load_register(op).versions.items()}


def resolve_on_cpu(op: str, version: str) -> str:
    """resolve_version(op, "", "cpu") with TEMPER_OP_<OP>=version."""
    with _env(f"TEMPER_OP_{op.upper()}", version):
        return resolve_version(op, "", "cpu")


def load(op: str, version: str) -> None:
    load_op(op, version)


def shapes(preset: str, tp: int, tp_rank: int = 0) -> dict:
    """op_shapes of the preset's config at (tp, tp_rank): every field, and `tokens`, and the FLOPs of a
    gemm_output forward + backward."""
    s = op_shapes(build_config({"preset": preset}), tp=tp, tp_rank=tp_rank)
    return {**dataclasses.asdict(s), "tokens": s.tokens, "gemm_output_flops": float(op_flops("gemm_output", s, backward=True))}


def workload_inputs(op: str, preset: str, tp: int, tp_rank: int) -> dict:
    """make_inputs(op) for the preset's per-rank shapes (fp32, CPU, seed 0): the tensors, and which require grad."""
    s = op_shapes(build_config({"preset": preset}), tp=tp, tp_rank=tp_rank)
    x = make_inputs(op, s, device="cpu", dtype=torch.float32, seed=0)
    return {"tensors": {k: v.detach() for k, v in x.items() if isinstance(v, torch.Tensor)},
            "requires_grad": [k for k, v in x.items() if isinstance(v, torch.Tensor) and v.requires_grad]}


def kernel_cache(env_value: str | None) -> dict:
    """kernel_cache_root() with TEMPER_KERNEL_CACHE unset (None) or set to `env_value`, and the default."""
    with _env("TEMPER_KERNEL_CACHE", env_value):
        return {"root": str(kernel_cache_root()), "default": DEFAULT_KERNEL_CACHE}


def warm_op_grad_modes(op: str) -> list:
    """warm_op over the op's baseline on the CPU (tiny, seq 32, fp32, no CUDA sync): torch.is_grad_enabled() at each
    call of the op, in order."""
    from engine import warmup

    seen = []

    def counted(*args, **kwargs):
        seen.append(torch.is_grad_enabled())
        return load_op(op, "baseline")(*args, **kwargs)

    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "seq_length": 32}))
    sync, warmup._sync = warmup._sync, lambda: None
    try:
        warmup.warm_op(op, counted, cfg, device=torch.device("cpu"), dtype=torch.float32)
    finally:
        warmup._sync = sync
    return seen
