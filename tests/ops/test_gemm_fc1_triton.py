"""gemm_fc1 `triton` (engine/ops/gemm_fc1/triton_swiglu.py): the baseline's GEMM, the SwiGLU forward and backward
each one hand-written Triton kernel, the backward taking its output's amax for the FP8 cast of FC1's output gradient.
Held to the bounds of tests/ops/test_gemm_fc1_compiled.py (its docstring says why each): bf16 within the baseline's
bound of the fp32 linear and no further from it than the baseline (x 1.05), --fp8 tensorwise and rowwise by the FP8
bound (no further x 1.1 from the exact linear than the baseline, the two apart by at most half of it). Then bit for
bit run to run, the weight gradient into a main_grad against the unfused one, and the fused amax: the FP8 copy of
the output gradient cast with it equals the one cast without it, bit for bit (the same amax: of the bf16 values the
kernel stores).

The kernels run on CUDA only (CPU: refused at start by the registry's devices); with Triton's interpreter they run
on CPU too (TRITON_INTERPRET=1, a development check, not the suite's: its FP8 conversion rounds ties away)."""

import pytest
import torch

from engine.distributed.fp8 import E5M2, cast
from tests.ops.test_gemm_fc1_compiled import assert_hands_main_grad, assert_like_baseline, inputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("shape", [dict(m=8192, f=16384, h=4096), dict(m=208, f=600, h=256)], ids=["slice", "ragged"])
def test_triton_against_the_baseline_bf16_and_fp8_and_run_to_run(shape):
    """The 8B slice's FC1 and a shape no tile divides (rows and columns masked)."""
    from engine.ops.gemm_fc1 import triton_swiglu

    x, w, dy = inputs(torch.bfloat16, "cuda", **shape)
    assert_like_baseline(triton_swiglu, x, w, dy, ({}, {"fp8": "tensorwise"}, {"fp8": "rowwise"}))


def test_the_fused_amax_is_the_reductions_and_nan_survives():
    """dswiglu's amax equals torch's amax of the [dgate | dup] it wrote, so the FP8 copy cast with it is the one
    cast without it, bit for bit (E5M2, both layouts); a NaN in dy gives a NaN amax (scale 1, as the baseline's)."""
    from engine.ops.gemm_fc1.triton_swiglu import dswiglu

    g = torch.Generator(device="cuda").manual_seed(3)
    pre = torch.randn(1001, 2 * 700, device="cuda", generator=g).bfloat16()
    dy = torch.randn(1001, 700, device="cuda", generator=g).bfloat16()
    dpre, amax = dswiglu(dy, pre, amax=True)
    assert amax.dtype == torch.float32 and torch.equal(amax, dpre.float().abs().amax())
    with_amax = cast(dpre, E5M2, None, False, transposed=True, amax=amax)
    without = cast(dpre, E5M2, None, False, transposed=True)
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == E5M2 else a, b.view(torch.uint8) if b.dtype == E5M2 else b)
               for a, b in zip(with_amax, without))
    dy[7, 9] = float("nan")
    assert dswiglu(dy, pre, amax=True)[1].isnan().item()


def test_triton_hands_its_weight_gradient_to_the_main_grad():
    """tests/ops/test_gemm_fc1_compiled.py assert_hands_main_grad (its bound and why), bf16 and FP8."""
    from engine.ops.gemm_fc1 import triton_swiglu
    for fp8 in ("off", "tensorwise"):
        assert_hands_main_grad(triton_swiglu, fp8)
