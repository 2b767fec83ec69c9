"""CPU-side facts about the CuTeDSL versions: registration, lazy imports, load failures, shapes,
the kernel cache location and warmup on a machine without CUDA. No GPU and no kernel library needed.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import build_config
from engine.errors import ConfigError, KernelLoadError
from engine.ops.dispatch import OP_NAMES, load_op, load_register, resolve_version
from engine.ops.kernel_cache import DEFAULT_KERNEL_CACHE, kernel_cache_root
from engine.ops.workloads import make_inputs, op_flops, op_shapes

ROOT = Path(__file__).resolve().parents[2]
CUTE_VERSIONS = {"attention": "fa4", "gemm_fc1": "quack", "gemm_output": "quack", "rmsnorm": "quack", "rope": "quack"}
KERNEL_LIBS = ("cutlass", "quack", "flash_attn")


def test_every_op_registers_a_cutedsl_version_for_cuda_only():
    for op in OP_NAMES:
        spec = load_register(op).versions[CUTE_VERSIONS[op]]
        assert spec.devices == ("cuda",)
        assert any(r.startswith(("quack", "flash_attn")) for r in spec.requires), spec.requires


def test_importing_and_resolving_on_cpu_never_imports_a_kernel_library():
    code = ("import sys, torch; from engine.config import EngineConfig; from engine.ops import resolve_ops; "
            "import engine.warmup, engine.ops.workloads, engine.ops.kernel_cache; "
            "resolve_ops(EngineConfig(), 'cpu'); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {KERNEL_LIBS!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# Every CuTeDSL version, not only the first per op (rmsnorm has quack's and our own `cute`).
ALL_CUTE = [(op, v) for op in OP_NAMES for v in load_register(op).versions if v != "baseline"]


@pytest.mark.parametrize("op,version", ALL_CUTE)
def test_requesting_a_cutedsl_version_on_cpu_raises(op, version, monkeypatch):
    monkeypatch.setenv(f"TEMPER_OP_{op.upper()}", version)
    with pytest.raises(ConfigError, match="runs only on cuda"):
        resolve_version(op, "", "cpu")


@pytest.mark.parametrize("op,version", ALL_CUTE)
def test_a_version_whose_library_is_missing_raises_kernel_load_error(op, version):
    spec = load_register(op).versions[version]
    if all(importlib.util.find_spec(r.split(".")[0]) is not None for r in spec.requires):
        pytest.skip("the kernel libraries are installed here")
    with pytest.raises(KernelLoadError, match=f"op '{op}' version '{version}'"):
        load_op(op, version)


def test_per_rank_shapes_of_minicpm4_8b():
    cfg = build_config({"preset": "minicpm4-8b"})
    one, two = op_shapes(cfg, tp=1), op_shapes(cfg, tp=2, tp_rank=1)
    assert (one.tokens, one.hidden, one.heads_q, one.heads_kv, one.head_dim) == (8192, 4096, 32, 2, 128)
    assert (one.ffn_local, one.vocab_local, one.vocab_start) == (16384, 73472, 0)
    assert (two.heads_q, two.heads_kv, two.ffn_local, two.vocab_local, two.vocab_start) == (16, 1, 8192, 36736, 36736)
    assert one.residual_scale == pytest.approx(1.4 / 32**0.5)
    # LM head forward: 2 x 8192 x 4096 x 73472 FLOPs; fwd + bwd three times that
    assert op_flops("gemm_output", one, backward=True) == pytest.approx(3 * 2 * 8192 * 4096 * 73472)


def test_workload_inputs_follow_the_contracts():
    s = op_shapes(build_config({"preset": "tiny"}), tp=2, tp_rank=1)
    x = make_inputs("gemm_output", s, device="cpu", dtype=torch.float32, seed=0)
    assert x["w"].shape == (s.vocab_local, s.hidden) and x["labels"].dtype == torch.int64
    assert ((x["labels"] == -100) | ((x["labels"] >= 0) & (x["labels"] < s.vocab_size))).all()
    q = make_inputs("attention", s, device="cpu", dtype=torch.float32, seed=0)
    assert q["q"].shape[2] == s.heads_q and q["k"].shape[2] == s.heads_kv and q["q"].requires_grad


def test_kernel_cache_root_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("TEMPER_KERNEL_CACHE", raising=False)
    assert kernel_cache_root() == Path(DEFAULT_KERNEL_CACHE).expanduser()
    monkeypatch.setenv("TEMPER_KERNEL_CACHE", str(tmp_path / "k"))
    assert kernel_cache_root() == tmp_path / "k"


def test_warmup_kernels_on_a_cpu_only_machine_says_so_and_exits_0():
    out = subprocess.run([sys.executable, "-m", "engine", "warmup-kernels", "--preset", "tiny", "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "nothing to compile" in out.stdout


@pytest.mark.parametrize("op", OP_NAMES)
def test_warm_op_also_runs_the_forward_evaluation_makes(op, monkeypatch):
    """warm_op compiles what a run will launch: forward + backward twice, then a forward under torch.no_grad (a
    version may launch another kernel variant there: gemm_output's CE kernel without a gradient to keep). Run
    here with each op's baseline on the CPU (no CUDA sync), counting the no-grad call."""
    from engine import warmup
    from engine.config import resolve

    monkeypatch.setattr(warmup, "_sync", lambda: None)
    seen = []

    def counted(*args, **kwargs):
        seen.append(torch.is_grad_enabled())
        return load_op(op, "baseline")(*args, **kwargs)

    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "seq_length": 32}))
    warmup.warm_op(op, counted, cfg, device=torch.device("cpu"), dtype=torch.float32)
    assert seen.count(False) == 1 and seen[-1] is False and seen.count(True) >= 2
