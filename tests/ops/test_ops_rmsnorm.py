"""rmsnorm baseline vs the formula written out in fp64, with and without the fused residual add.

Tolerances: fp32 inputs -> rtol/atol 1e-5 (a mean over 32 squares and one rsqrt in fp32, ~1e-7
relative, with margin for the backward's sums). bf16: the reference runs in fp64 on the same bf16
values; the baseline computes in fp32 and rounds once, so the output is within half a bf16 ulp
(2^-8 relative) of the exact value: rtol 2^-7 gives a 2x margin (plus a tiny atol for values near 0).

The baseline runs in the engine's process (the `engine` fixture: a child through harness.judge.candidate, code in
tests/ops/op_calls.py); the inputs and upstream gradients are drawn here and the references and assertions stay
here: this process never imports the engine.
"""

import pytest
import torch

EPS = 1e-6


def rmsnorm(engine, x, weight, *, grad=None, **kwargs):
    """The baseline run in the engine's process on these tensors (x, weight and a `residual` keyword are leaves
    that require grad): (outputs, {"x", "weight", "residual": gradient}), the gradients after a backward with the
    upstream gradients `grad` (one per output)."""
    got = engine.call("tests.ops.op_calls:call", "engine.ops.rmsnorm.baseline:rmsnorm", [x, weight], kwargs,
                      requires_grad=("0", "1", *(["residual"] if "residual" in kwargs else [])), grad=grad)
    names = {"0": "x", "1": "weight", "residual": "residual"}
    return got["out"], {names[k]: g for k, g in got["grad"].items()}


def reference_rmsnorm(x, weight, eps):
    x, weight = x.double(), weight.double()
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def _tensors(shape, dtype, seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * 2).to(dtype) for _ in range(n)]


def _weight(h, dtype, seed):
    g = torch.Generator().manual_seed(seed + 100)
    return (1 + 0.3 * torch.randn(h, generator=g)).to(dtype)


def _leaf64(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def test_plain_fp32_values_and_gradients(engine):
    (x,) = _tensors((2, 5, 32), torch.float32, seed=1, n=1)
    # Row 1 at 1e-3: its mean square (4e-6) is of eps's order, so a dropped or wrong eps shows; at std 2 (row 0)
    # eps moves the output by 1e-7 relative, far below the tolerance.
    x[1] *= 1e-3
    w = _weight(32, torch.float32, seed=1)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (out,), grads = rmsnorm(engine, x, w, eps=EPS, grad=[g.float()])
    assert out.dtype == torch.float32 and out.shape == x.shape
    x64, w64 = _leaf64(x, w)
    ref = reference_rmsnorm(x64, w64, EPS)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    ref.backward(g)
    torch.testing.assert_close(grads["x"].double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads["weight"].double(), w64.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 1.4 / 2.0])
def test_residual_fp32_values_and_gradients(scale, engine):
    x, residual = _tensors((3, 4, 32), torch.float32, seed=2, n=2)
    w = _weight(32, torch.float32, seed=2)
    gen = torch.Generator().manual_seed(9)
    g_out, g_s = (torch.randn(x.shape, generator=gen, dtype=torch.float64) for _ in range(2))
    (out, s), grads = rmsnorm(engine, x, w, eps=EPS, residual=residual, residual_scale=scale,
                              grad=[g_out.float(), g_s.float()])
    assert out.dtype == s.dtype == torch.float32

    x64, r64, w64 = _leaf64(x, residual, w)
    s_ref = r64 + scale * x64
    out_ref = reference_rmsnorm(s_ref, w64, EPS)
    torch.testing.assert_close(s.double(), s_ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), out_ref.detach(), rtol=1e-5, atol=1e-5)

    ((out_ref * g_out).sum() + (s_ref * g_s).sum()).backward()
    for got, want in ((grads["x"], x64.grad), (grads["residual"], r64.grad), (grads["weight"], w64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_bf16_plain_and_residual_within_tolerance(engine):
    x, residual = _tensors((4, 64), torch.bfloat16, seed=3, n=2)
    w = _weight(64, torch.bfloat16, seed=3)
    (out,), _ = rmsnorm(engine, x, w, eps=EPS)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference_rmsnorm(x, w, EPS), rtol=2**-7, atol=1e-6)

    scale = 0.7
    ones = torch.ones(x.shape, dtype=torch.bfloat16)  # the backward of out.float().sum() + s.float().sum()
    (out, s), grads = rmsnorm(engine, x, w, eps=EPS, residual=residual, residual_scale=scale, grad=[ones, ones])
    assert out.dtype == s.dtype == torch.bfloat16
    s_ref = residual.double() + scale * x.double()
    torch.testing.assert_close(s.double(), s_ref, rtol=2**-7, atol=1e-6)
    # The norm reads the returned (rounded) s, as the unfused model would.
    torch.testing.assert_close(out.double(), reference_rmsnorm(s, w, EPS), rtol=2**-7, atol=1e-6)
    assert grads["x"].dtype == grads["residual"].dtype == grads["weight"].dtype == torch.bfloat16


def test_residual_stream_keeps_its_dtype(engine):
    (x,) = _tensors((2, 16), torch.bfloat16, seed=4, n=1)
    (residual,) = _tensors((2, 16), torch.float32, seed=5, n=1)
    w = _weight(16, torch.float32, seed=4)
    (out, s), _ = rmsnorm(engine, x, w, eps=EPS, residual=residual, residual_scale=0.5)
    assert s.dtype == torch.float32 and out.dtype == torch.float32
    torch.testing.assert_close(s.double(), residual.double() + 0.5 * x.double(), rtol=1e-6, atol=1e-6)
