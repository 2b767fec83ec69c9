"""CPU-side facts about the CuTeDSL versions: registration, lazy imports, load failures, shapes,
the kernel cache location and warmup on a machine without CUDA. No GPU and no kernel library needed.

The engine answers in a process of its own (the `engine` fixture, tests/ops/versions_cpu_calls.py) and the
assertions run here: this process never imports it. The ops and their versions are read here from the protected
registers (engine/ops/<op>/register.toml), so what is tested does not come from the code under test.
"""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from tests.ops.child import raises

ROOT = Path(__file__).resolve().parents[2]
CALLS = "tests.ops.versions_cpu_calls"
CUTE_VERSIONS = {"attention": "fa4", "gemm_fc1": "quack", "gemm_output": "quack", "rmsnorm": "quack", "rope": "quack"}
KERNEL_LIBS = ("cutlass", "quack", "flash_attn")


def registers() -> dict[str, dict[str, dict]]:
    """{op: {version: its table}} from every engine/ops/<op>/register.toml, in the files' order."""
    return {p.parent.name: tomllib.loads(p.read_text(encoding="utf-8"))["versions"]
            for p in sorted((ROOT / "engine" / "ops").glob("*/register.toml"))}


REGISTERS = registers()
# The hot ops, each with a CuTeDSL version; the --fp8 ops are tested in tests/ops/test_fp8_cast.py (the operand
# cast: baseline and torch.compile, both on CPU and CUDA) and tests/ops/test_fp8_wgrad.py.
OP_NAMES = [op for op in REGISTERS if not op.startswith("fp8_")]


def test_every_op_registers_a_cutedsl_version_for_cuda_only(engine):
    assert sorted(engine.call(f"{CALLS}:op_names")) == sorted(OP_NAMES)
    for op in OP_NAMES:
        spec = REGISTERS[op][CUTE_VERSIONS[op]]
        assert spec["devices"] == ["cuda"]
        assert any(r.startswith(("quack", "flash_attn")) for r in spec["requires"]), spec["requires"]
        # the engine reads the register as written
        assert engine.call(f"{CALLS}:register", op) == {v: {"devices": t["devices"], "requires": t["requires"]}
                                                        for v, t in REGISTERS[op].items()}


def test_importing_and_resolving_on_cpu_never_imports_a_kernel_library():
    code = ("import sys, torch; from engine.config import EngineConfig; from engine.ops import resolve_ops; "
            "import engine.warmup, engine.ops.workloads, engine.ops.kernel_cache; "
            "resolve_ops(EngineConfig(), 'cpu'); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {KERNEL_LIBS!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# Every CuTeDSL version, not only the first per op (rmsnorm has quack's and our own `cute`); the CUDA-only ones
# (gemm_fc1's `compiled` is torch.compile and runs on CPU too: tests/ops/test_gemm_fc1_compiled.py).
ALL_CUTE = [(op, v) for op in OP_NAMES for v, spec in REGISTERS[op].items() if spec["devices"] == ["cuda"]]


@pytest.mark.parametrize("op,version", ALL_CUTE)
def test_requesting_a_cutedsl_version_on_cpu_raises(op, version, engine):
    """TEMPER_OP_<OP>=version, set in the engine's process only."""
    raises(engine, "ConfigError", "runs only on cuda", f"{CALLS}:resolve_on_cpu", op, version)


@pytest.mark.parametrize("op,version", ALL_CUTE)
def test_a_version_whose_library_is_missing_raises_kernel_load_error(op, version, engine):
    spec = REGISTERS[op][version]
    if all(importlib.util.find_spec(r.split(".")[0]) is not None for r in spec["requires"]):
        pytest.skip("the kernel libraries are installed here")
    raises(engine, "KernelLoadError", f"op '{op}' version '{version}'", f"{CALLS}:load", op, version)


def test_per_rank_shapes_of_minicpm4_8b(engine):
    one, two = engine.call(f"{CALLS}:shapes", "minicpm4-8b", 1), engine.call(f"{CALLS}:shapes", "minicpm4-8b", 2, 1)
    assert [one[k] for k in ("tokens", "hidden", "heads_q", "heads_kv", "head_dim")] == [8192, 4096, 32, 2, 128]
    assert [one[k] for k in ("ffn_local", "vocab_local", "vocab_start")] == [16384, 73472, 0]
    assert [two[k] for k in ("heads_q", "heads_kv", "ffn_local", "vocab_local", "vocab_start")] == [16, 1, 8192, 36736, 36736]
    assert one["residual_scale"] == pytest.approx(1.4 / 32**0.5)
    # LM head forward: 2 x 8192 x 4096 x 73472 FLOPs; fwd + bwd three times that
    assert one["gemm_output_flops"] == pytest.approx(3 * 2 * 8192 * 4096 * 73472)


def test_workload_inputs_follow_the_contracts(engine):
    s = engine.call(f"{CALLS}:shapes", "tiny", 2, 1)
    x = engine.call(f"{CALLS}:workload_inputs", "gemm_output", "tiny", 2, 1)["tensors"]
    assert x["w"].shape == (s["vocab_local"], s["hidden"]) and x["labels"].dtype == torch.int64
    assert ((x["labels"] == -100) | ((x["labels"] >= 0) & (x["labels"] < s["vocab_size"]))).all()
    q = engine.call(f"{CALLS}:workload_inputs", "attention", "tiny", 2, 1)
    assert q["tensors"]["q"].shape[2] == s["heads_q"] and q["tensors"]["k"].shape[2] == s["heads_kv"]
    assert "q" in q["requires_grad"]


def test_kernel_cache_root_default_and_override(engine, tmp_path):
    """TEMPER_KERNEL_CACHE unset, then set, in the engine's process only."""
    unset = engine.call(f"{CALLS}:kernel_cache", None)
    assert Path(unset["root"]) == Path(unset["default"]).expanduser()
    assert unset["default"] == "~/.cache/temper/kernels"
    assert Path(engine.call(f"{CALLS}:kernel_cache", str(tmp_path / "k"))["root"]) == tmp_path / "k"


def test_warmup_kernels_on_a_cpu_only_machine_says_so_and_exits_0():
    out = subprocess.run([sys.executable, "-m", "engine", "warmup-kernels", "--preset", "tiny", "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "nothing to compile" in out.stdout


@pytest.mark.parametrize("op", OP_NAMES)
def test_warm_op_also_runs_the_forward_evaluation_makes(op, engine):
    """warm_op compiles what a run will launch: forward + backward twice, then a forward under torch.no_grad (a
    version may launch another kernel variant there: gemm_output's CE kernel without a gradient to keep). Run
    (in the engine's process) with each op's baseline on the CPU (no CUDA sync), counting the no-grad call."""
    seen = engine.call(f"{CALLS}:warm_op_grad_modes", op)
    assert seen.count(False) == 1 and seen[-1] is False and seen.count(True) >= 2
