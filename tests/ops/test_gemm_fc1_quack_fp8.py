"""gemm_fc1 `quack` with --fp8 tensorwise (engine/ops/gemm_fc1/quack_gated.py `_GemmFc1Fp8`): quack's gated GEMM on
the FP8 copies of x and W, its SwiGLU in the epilogue, then the FP8 linears' dgrad and wgrad. Against the fp32 linear
and the baseline's FP8 path (torch._scaled_mm, then the SwiGLU in bf16), by the FP8 bound of
tests/ops/test_gemm_fc1_compiled.py: no further (x 1.1) from the exact linear than the baseline is (FP8's own error,
~6 % here) and the two apart by at most half of it. The casts are the same; what differs is the GEMM's accumulation
order and that quack's SwiGLU reads the fp32 accumulator, not its bf16 rounding. Then bit for bit run to run, and the
weight gradient into a main_grad (the step's first write, then an add) against the unfused one.

The refusals at start (rowwise, --fp8-fast-accum: register.toml's `fp8 = ["tensorwise"]`) are CPU tests:
tests/ops/test_ops_dispatch.py."""

import pytest
import torch

from tests.ops.test_gemm_fc1_compiled import assert_fp8_close, assert_hands_main_grad, inputs, reference, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="needs an SM90 GPU")]


def test_quack_fp8_at_the_slice_shapes_against_the_baseline_and_run_to_run():
    from engine.ops.gemm_fc1 import baseline, quack_gated

    x, w, dy = inputs(torch.bfloat16, "cuda", m=8192, f=16384, h=4096)
    ref = reference(x, w, dy, torch.float32)
    base, quack = run(baseline, x, w, dy, fp8="tensorwise"), run(quack_gated, x, w, dy, fp8="tensorwise")
    assert_fp8_close(ref, base, quack, "quack tensorwise")
    again = run(quack_gated, x, w, dy, fp8="tensorwise")
    assert all(torch.equal(a, b) for a, b in zip(again, quack))


def test_quack_fp8_hands_its_weight_gradient_to_the_main_grad():
    """tests/ops/test_gemm_fc1_compiled.py assert_hands_main_grad (its bound and why)."""
    from engine.ops.gemm_fc1 import quack_gated
    assert_hands_main_grad(quack_gated, "tensorwise")
