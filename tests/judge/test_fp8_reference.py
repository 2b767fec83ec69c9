"""The judge's FP8 linear (harness/judge/claims/fp8_reference.py) against the engine's plain-torch reference of the same
recipe (engine/distributed/fp8.py `reference_linear_fp8`): two implementations written apart from the recipe in
docs/fp8.md must quantise alike, so the judge's FP8 floor measures the rounding an honest engine does.

Tolerance 1e-5 relative: both dequantise onto the same FP8 grid in fp32 and multiply in fp32; what is left is
the summation order of the fp32 matmul (K <= 96 terms: ~1e-6). A recipe mix-up (E4M3 for the gradient, a scale
not rounded to a power of 2, a per-tensor scale for rowwise) moves an element by an FP8 quantum, 2^-4 to 2^-3,
and the whole by ~1e-2: far outside.
"""

import pytest
import torch

from engine.distributed.fp8 import reference_linear_fp8
from harness.judge.claims.fp8_reference import RECIPES, fp8_linear, quantise_dequantise


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_judges_fp8_linear_matches_the_engines_reference(recipe):
    torch.manual_seed(0)
    x = torch.randn(2, 48, 64) * torch.logspace(-2, 1, 64)  # columns of very different sizes: rows matter
    w = torch.randn(96, 64) * 0.1
    dy = torch.randn(2, 48, 96) * torch.logspace(-3, 0, 96)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fp8_linear(recipe)(xs, ws)
    y.backward(dy)
    want_y, want_dx, want_dw = reference_linear_fp8(x.reshape(-1, 64), w, dy.reshape(-1, 96), recipe)
    assert _rel(y.reshape(-1, 96), want_y) < 1e-5
    assert _rel(xs.grad.reshape(-1, 64), want_dx) < 1e-5 and _rel(ws.grad, want_dw) < 1e-5
    # and it is FP8, not the exact product: E4M3 keeps 3 mantissa bits (~2^-5 relative per element)
    assert _rel(y.detach(), x @ w.t()) > 5e-3 and _rel(ws.grad, dy.reshape(-1, 96).t() @ x.reshape(-1, 64)) > 5e-3
    other = "rowwise" if recipe == "tensorwise" else "tensorwise"
    assert _rel(fp8_linear(other)(x, w).reshape(-1, 96), want_y) > 1e-3


def test_quantisation_saturates_nothing_and_keeps_zero_rows():
    t = torch.tensor([[3.0, -1e-3, 0.5], [0.0, 0.0, 0.0]])
    q = quantise_dequantise(t, torch.float8_e4m3fn, per_row=True)
    assert q[0, 0] == 3.0 and torch.equal(q[1], t[1]) and torch.isfinite(q).all()


def test_under_bf16_autocast_the_operands_are_rounded_to_bf16_first():
    """As a bf16 engine quantises its bf16 activations and weights: output and input gradient in bf16."""
    x = torch.randn(16, 32, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8_linear("tensorwise")(x, w)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.float32 and torch.isfinite(w.grad).all()


def test_an_unknown_recipe_is_refused_by_name():
    with pytest.raises(ValueError, match="'fp4'"):
        fp8_linear("fp4")
