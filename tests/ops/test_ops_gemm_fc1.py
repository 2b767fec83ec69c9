"""gemm_fc1 baseline vs silu(x W_gate^T) * (x W_up^T) written out in fp64 on the split weight.

Tolerances: fp32 -> 1e-5 (dot products of length 24 of O(1) values in fp32, ~1e-6 absolute).
bf16: reference in fp64 on the same bf16 values. The baseline rounds the GEMM output, the silu
and the product to bf16 (three roundings of <= 2^-8 relative each, ~1.2% worst case compounded
with silu's conditioning), so rtol 3e-2 plus atol 1e-2 x the output scale.

The baseline runs in the engine's process (the `engine` fixture: a child through harness.judge.candidate,
tests/ops/op_calls.py); the inputs are drawn here and the references and assertions stay here: this process never
imports the engine.
"""

import torch

from tests.ops.child import CALL


def gemm_fc1(engine, x, w, grad=None):
    """(output, {"x", "w": gradient}) of the baseline in the engine's process; x and w are leaves."""
    got = engine.call(CALL, "engine.ops.gemm_fc1.baseline:gemm_fc1", [x, w], requires_grad=("0", "1"), grad=grad)
    return got["out"][0], {"x": got["grad"]["0"], "w": got["grad"]["1"]}


def reference_fc1(x, w):
    x, w = x.double(), w.double()
    f = w.shape[0] // 2
    gate = x @ w[:f].T
    up = x @ w[f:].T
    return gate / (1 + torch.exp(-gate)) * up


def _inputs(dtype, seed, f=20, h=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, h, generator=g).to(dtype)
    w = (torch.randn(2 * f, h, generator=g) / h**0.5).to(dtype)
    return x, w


def test_fp32_values_and_gradients(engine):
    x, w = _inputs(torch.float32, seed=1)
    g = torch.randn((2, 5, 20), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y, grads = gemm_fc1(engine, x, w, grad=[g.float()])
    assert y.shape == (2, 5, 20) and y.dtype == torch.float32
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    ref = reference_fc1(x64, w64)
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    ref.backward(g)
    torch.testing.assert_close(grads["x"].double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads["w"].double(), w64.grad, rtol=1e-5, atol=1e-5)


def test_gate_and_up_halves_are_not_swapped(engine):
    x, w = _inputs(torch.float64, seed=2)
    swapped = torch.cat([w[20:], w[:20]])
    assert not torch.allclose(gemm_fc1(engine, x, w)[0], reference_fc1(x, swapped))


def test_bf16_within_tolerance(engine):
    x, w = _inputs(torch.bfloat16, seed=4, f=64, h=128)
    y, grads = gemm_fc1(engine, x, w, grad=[torch.ones(2, 5, 64, dtype=torch.bfloat16)])  # y.float().sum()'s backward
    assert y.dtype == torch.bfloat16
    ref = reference_fc1(x, w)
    torch.testing.assert_close(y.double(), ref, rtol=3e-2, atol=1e-2 * ref.abs().max().item())
    assert grads["x"].dtype == grads["w"].dtype == torch.bfloat16
