"""gemm_fc1 `triton` (engine/ops/gemm_fc1/triton_swiglu.py): the baseline's GEMM, the SwiGLU forward and backward
each one hand-written Triton kernel, the backward taking its output's amax for the FP8 cast of FC1's output gradient.
Held to the bounds of tests/ops/test_gemm_fc1_compiled.py (its docstring says why each): bf16 within the baseline's
bound of the fp32 linear and no further from it than the baseline (x 1.05), --fp8 tensorwise and rowwise by the FP8
bound (no further x 1.1 from the exact linear than the baseline, the two apart by at most half of it). Then bit for
bit run to run, the weight gradient into a main_grad against the unfused one, and the fused amaxes: the FP8 copies
of the output gradient and of the forward's y (FC2's input: the contract's `amax`) cast with them equal the ones cast
without, bit for bit (the same amax: of the bf16 values the kernel stores), and FC1 + FC2 tensorwise gives the same
bits with and without the forward's (tests/engine/test_fp8_fc2_amax.py holds the CPU path and the model to it).

The kernels run on CUDA only (CPU: refused at start by the registry's devices); with Triton's interpreter they run
on CPU too (TRITON_INTERPRET=1, a development check, not the suite's: its FP8 conversion rounds ties away)."""

import pytest
import torch

from engine.distributed.fp8 import E4M3, E5M2, amax_of, cast
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


def fp8_equal(got: tuple, want: tuple) -> bool:
    """Two casts' (q, scale[, qt]), bit for bit."""
    bits = [t.view(torch.uint8) if t.dtype in (E4M3, E5M2) else t for t in (*got, *want)]
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(bits[:len(got)], bits[len(got):]))


def test_the_forward_amax_is_the_stored_outputs_and_nan_and_inf_survive():
    """swiglu's amax (the forward kernel's, for FC2's input) equals torch's amax of the y it stored, y is the one it
    stores without the amax bit for bit, and FC2's FP8 copy of y cast with it (E4M3, both layouts) is the one cast
    without, bit for bit; ragged shapes (masked tails: 0, below any |y|). A NaN in gate or up gives a NaN amax (scale
    1, as the baseline's), an inf in up (silu(gate) x inf) an inf amax (scale 0), all zeros an amax of 0."""
    from engine.ops.gemm_fc1.triton_swiglu import swiglu

    g = torch.Generator(device="cuda").manual_seed(5)
    for m, f in ((1001, 700), (8192, 16384), (7, 513)):
        pre = (torch.randn(m, 2 * f, device="cuda", generator=g) * 3).bfloat16()
        y, amax = swiglu(pre, True)
        plain, none = swiglu(pre, False)
        assert none is None and torch.equal(y, plain)
        assert amax.dtype == torch.float32 and amax.shape == () and torch.equal(amax, y.float().abs().amax())
        assert torch.equal(amax, amax_of(y))
        assert fp8_equal(cast(y, E4M3, None, False, transposed=True, amax=amax), cast(y, E4M3, None, False,
                                                                                      transposed=True))
    pre = (torch.randn(64, 2 * 600, device="cuda", generator=g) * 3).bfloat16()
    for at, value, want in (((3, 5), float("nan"), "nan"), ((60, 600 + 599), float("nan"), "nan"),
                            ((0, 600 + 2), float("inf"), "inf")):
        bad = pre.clone()
        bad[at] = value
        y, amax = swiglu(bad, True)
        assert (amax.isnan() if want == "nan" else amax == float("inf")) and torch.equal(
            amax.nan_to_num(), y.float().abs().amax().nan_to_num()), (at, value)
        assert fp8_equal(cast(y, E4M3, None, False, amax=amax), cast(y, E4M3, None, False)), (at, value)
    assert swiglu(torch.zeros_like(pre), True)[1].item() == 0.0


@pytest.mark.parametrize("shape", [dict(m=8192, f=16384, h=4096), dict(m=208, f=608, h=256)], ids=["slice", "ragged"])
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "main_grad"])
def test_fc1_then_fc2_tensorwise_gives_the_same_bits_with_the_forward_amax(shape, fused):
    """The model's MLP at TP 1 (engine/model/layers.py MLP): gemm_fc1 triton with `amax`, then FC2's FP8 linear
    taking it (fused_linear's x_amax), against FC2's cast reducing h itself: h, FC2's output and the gradients of x,
    FC1's and FC2's weights bit for bit; y without `amax` the same y; the amax the baseline's plain reduction of
    it. The 8B's FFN at the slice's tokens (8192 x 16384: a micro-batch's FC2 input) and a shape the SwiGLU's tiles
    do not divide (f = 608 against 512 columns a tile; a multiple of 16, as FC2's FP8 GEMM needs: --fp8 refuses
    others at start)."""
    from engine.distributed.wgrad import MainGrad, attach_main_grad, fused_linear, main_grad_of
    from engine.ops.gemm_fc1 import triton_swiglu

    x, w1, dy = inputs(torch.bfloat16, "cuda", **shape)
    g = torch.Generator().manual_seed(2)
    w2 = (torch.randn(shape["h"], shape["f"], generator=g) / shape["f"] ** 0.5).to("cuda", torch.bfloat16)
    dout = (torch.randn(*x.shape, generator=g) * 1e-2).to("cuda", torch.bfloat16)
    outs = []
    for with_amax in (True, False):
        xr, w1r, w2r = (t.clone().requires_grad_() for t in (x, w1, w2))
        mains = [MainGrad(torch.zeros(w.shape, dtype=torch.float32, device="cuda")) for w in (w1r, w2r)] \
            if fused else []
        for w, main in zip((w1r, w2r), mains):
            attach_main_grad(w, main)
        main1 = main_grad_of(w1r) if fused else None
        if with_amax:
            h, amax = triton_swiglu.gemm_fc1(xr, w1r, main_grad=main1, fp8="tensorwise", amax=True)
            assert torch.equal(amax, amax_of(h)) and not amax.requires_grad
        else:
            h, amax = triton_swiglu.gemm_fc1(xr, w1r, main_grad=main1, fp8="tensorwise"), None
        out = fused_linear(h, w2r, "tensorwise", x_amax=amax)
        out.backward(dout)
        grads = [m.grad for m in mains] if fused else [w1r.grad, w2r.grad]
        outs.append((h.detach(), out.detach(), xr.grad, *grads))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
