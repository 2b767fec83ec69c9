"""rmsnorm baseline vs the formula written out in fp64, with and without the fused residual add.

Tolerances: fp32 inputs -> rtol/atol 1e-5 (a mean over 32 squares and one rsqrt in fp32, ~1e-7
relative, with margin for the backward's sums). bf16: the reference runs in fp64 on the same bf16
values; the baseline computes in fp32 and rounds once, so the output is within half a bf16 ulp
(2^-8 relative) of the exact value: rtol 2^-7 gives a 2x margin (plus a tiny atol for values near 0).
"""

import pytest
import torch

from engine.ops.rmsnorm.baseline import rmsnorm

EPS = 1e-6


def reference_rmsnorm(x, weight, eps):
    x, weight = x.double(), weight.double()
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def _tensors(shape, dtype, seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g) * 2).to(dtype).requires_grad_() for _ in range(n)]


def _weight(h, dtype, seed):
    g = torch.Generator().manual_seed(seed + 100)
    return (1 + 0.3 * torch.randn(h, generator=g)).to(dtype).requires_grad_()


def _leaf64(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def test_plain_fp32_values_and_gradients():
    (x,) = _tensors((2, 5, 32), torch.float32, seed=1, n=1)
    w = _weight(32, torch.float32, seed=1)
    out = rmsnorm(x, w, eps=EPS)
    assert out.dtype == torch.float32 and out.shape == x.shape
    x64, w64 = _leaf64(x, w)
    ref = reference_rmsnorm(x64, w64, EPS)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out.backward(g.float())
    ref.backward(g)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 1.4 / 2.0])
def test_residual_fp32_values_and_gradients(scale):
    x, residual = _tensors((3, 4, 32), torch.float32, seed=2, n=2)
    w = _weight(32, torch.float32, seed=2)
    out, s = rmsnorm(x, w, eps=EPS, residual=residual, residual_scale=scale)
    assert out.dtype == s.dtype == torch.float32

    x64, r64, w64 = _leaf64(x, residual, w)
    s_ref = r64 + scale * x64
    out_ref = reference_rmsnorm(s_ref, w64, EPS)
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.double(), out_ref, rtol=1e-5, atol=1e-5)

    gen = torch.Generator().manual_seed(9)
    g_out, g_s = (torch.randn(out.shape, generator=gen, dtype=torch.float64) for _ in range(2))
    ((out * g_out.float()).sum() + (s * g_s.float()).sum()).backward()
    ((out_ref * g_out).sum() + (s_ref * g_s).sum()).backward()
    for got, want in ((x.grad, x64.grad), (residual.grad, r64.grad), (w.grad, w64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_bf16_plain_and_residual_within_tolerance():
    x, residual = _tensors((4, 64), torch.bfloat16, seed=3, n=2)
    w = _weight(64, torch.bfloat16, seed=3)
    out = rmsnorm(x, w, eps=EPS)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference_rmsnorm(x.detach(), w.detach(), EPS), rtol=2**-7, atol=1e-6)

    scale = 0.7
    out, s = rmsnorm(x, w, eps=EPS, residual=residual, residual_scale=scale)
    assert out.dtype == s.dtype == torch.bfloat16
    s_ref = residual.detach().double() + scale * x.detach().double()
    torch.testing.assert_close(s.double(), s_ref, rtol=2**-7, atol=1e-6)
    # The norm reads the returned (rounded) s, as the unfused model would.
    torch.testing.assert_close(out.double(), reference_rmsnorm(s.detach(), w.detach(), EPS), rtol=2**-7, atol=1e-6)
    (out.float().sum() + s.float().sum()).backward()
    assert x.grad.dtype == residual.grad.dtype == w.grad.dtype == torch.bfloat16


def test_residual_stream_keeps_its_dtype():
    (x,) = _tensors((2, 16), torch.bfloat16, seed=4, n=1)
    (residual,) = _tensors((2, 16), torch.float32, seed=5, n=1)
    w = _weight(16, torch.float32, seed=4)
    out, s = rmsnorm(x, w, eps=EPS, residual=residual, residual_scale=0.5)
    assert s.dtype == torch.float32 and out.dtype == torch.float32
    torch.testing.assert_close(s.double(), residual.detach().double() + 0.5 * x.detach().double(), rtol=1e-6, atol=1e-6)
