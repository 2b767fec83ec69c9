"""Whole training runs on CUDA with the default (CuTeDSL) op versions against the plain-torch ops (GPU).

On CUDA every op defaults to its CuTeDSL version (engine/ops/*/register.toml). The small presets
have shapes the 8B benchmarks never compile (head dim 32, hidden 128, vocabulary shard 384), so
this runs the real CLI on them twice, same seed and data: once with the defaults, once with every
op forced to `baseline`, and compares the per-step loss and the validation losses (evaluation runs
the ops under torch.no_grad, where a version may take another kernel path). minicpm4-0.5b (short
sequences) adds the real padded vocabulary, 73448 in 73472 columns, where quack's no-grad CE path once
made every validation loss NaN.

Tolerance: 3e-2 relative per step over 8 steps. Both runs are bf16 with fp32 masters; the kernels
round at different points (bf16 logits in the fused LM head, fp32 vs bf16 accumulation orders), each
~4e-3 relative, and a few optimizer steps at lr 1e-2 let that drift grow. A wrong kernel (a missing
scale, a transposed operand) moves the loss by far more than this from the second step on.
"""

import pytest

from engine.ops import OP_NAMES
from tests.engine.helpers import deterministic_fields, eval_lines, loss_lines, run_engine

pytestmark = pytest.mark.gpu

BASELINE = [arg for op in OP_NAMES for arg in (f"--op-{op.replace('_', '-')}", "baseline")]


SHAPES = {"tiny": [], "llama-tiny": [], "minicpm4-0.5b": ["--seq-length", "512", "--micro-batch-size", "2"]}


@pytest.mark.parametrize("preset", list(SHAPES))
def test_default_kernels_train_like_the_baseline(preset, tmp_path):
    common = ["pretrain", "--preset", preset, "--device", "cuda", "--num-steps", "8", "--warmup-steps", "2",
              "--eval-samples", "8", "--eval-every", "4", "--no-save-final", *SHAPES[preset]]
    fast = run_engine(*common, "--run-dir", str(tmp_path / "fast"), timeout=600)
    base = run_engine(*common, *BASELINE, "--run-dir", str(tmp_path / "base"), timeout=600)
    assert "fa4-tuned" in fast.stdout and "cute" in fast.stdout  # the run header names the versions
    lf = [float(deterministic_fields(x)[1]) for x in loss_lines(fast.stdout)]
    lb = [float(deterministic_fields(x)[1]) for x in loss_lines(base.stdout)]
    assert len(lf) == len(lb) == 8
    assert lf[-1] < lf[0]  # it learns
    for step, (a, b) in enumerate(zip(lf, lb), start=1):
        assert abs(a - b) <= 3e-2 * abs(b), f"step {step}: defaults {a} vs baseline {b}"
    vf = [float(x.split("val_loss=")[1].split()[0]) for x in eval_lines(fast.stdout)]
    vb = [float(x.split("val_loss=")[1].split()[0]) for x in eval_lines(base.stdout)]
    assert len(vf) == len(vb) == 3  # steps 0, 4, 8
    for a, b in zip(vf, vb):
        assert abs(a - b) <= 3e-2 * abs(b), f"validation: defaults {vf} vs baseline {vb}"
