"""gemm_fc1 `compiled` (engine/ops/gemm_fc1/compiled.py): the baseline's GEMM, the SwiGLU forward and backward each
one torch.compile kernel. Against silu(x W_gate^T) * (x W_up^T) written out in fp64, against the baseline, with and
without --fp8, and inside a training run.

Tolerances: fp32 1e-5 as tests/ops/test_ops_gemm_fc1.py (dot products of O(1) values). bf16: the compiled SwiGLU
computes in fp32 from the bf16 GEMM output and rounds once, the baseline rounds silu(gate), the product and dy * up
each to bf16; both sit within the baseline's own bf16 bound against fp64 (rtol 3e-2, atol 1e-2 x the scale), and
the compiled one no further from fp64 than the baseline (its error is the GEMM's rounding plus one). With --fp8 the
GEMMs are the same FP8 GEMMs: the SwiGLU's bf16 roundings differ, and where the gradient [dgate | dup] sits near an
FP8 rounding boundary that moves its E5M2 / E4M3 value a whole FP8 step (12-25 %), so compared by relative Frobenius
norm: compiled no further (x 1.1) from the exact linear than the baseline is (FP8's own error, ~6 % here), and the
two apart by well under that (at most half of it; ~1.5 % measured).

torch.compile costs ~10 s a graph on 2 CPU cores, so the CPU cases are `slow`; the GPU case runs the Triton kernels
at the 8B slice's shapes."""

import subprocess
import sys

import pytest
import torch

from engine.ops.gemm_fc1 import baseline, compiled
from tests.engine.helpers import REPO, TINY_FAST, loss_lines


def reference(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, dtype=torch.float64) -> tuple:
    """(y, dx, dw) in fp64 (fp32 on the GPU: its 1e-6 is far below FP8's error)."""
    x64, w64 = (t.detach().to(dtype).requires_grad_() for t in (x, w))
    gate, up = (x64 @ w64.t()).chunk(2, dim=-1)
    y = gate / (1 + torch.exp(-gate)) * up
    y.backward(dy.to(dtype))
    return y.detach(), x64.grad, w64.grad


def run(version, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, **kw) -> tuple:
    """(y, dx, dw) of one version."""
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    y = version.gemm_fc1(x, w, **kw)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def inputs(dtype, device="cpu", m=40, f=48, h=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, m // 2, h, generator=g)
    w = torch.randn(2 * f, h, generator=g) / h**0.5
    dy = torch.randn(2, m // 2, f, generator=g)
    return (t.to(device=device, dtype=dtype) for t in (x, w, dy))


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius)."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def assert_fp8_close(ref: tuple, base: tuple, comp: tuple, what) -> None:
    """The --fp8 bound of the docstring, for y, dx and dw."""
    for name, r, b, c in zip(("y", "dx", "dw"), ref, base, comp):
        assert rel(c, r) <= 1.1 * rel(b, r) and rel(c, b) <= 0.5 * rel(b, r), (what, name, rel(c, r), rel(b, r),
                                                                                rel(c, b))


@pytest.mark.slow
def test_fp32_values_and_gradients_match_fp64():
    x, w, dy = inputs(torch.float32)
    for got, want in zip(run(compiled, x, w, dy), reference(x, w, dy)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_bf16_within_the_baselines_bound_and_no_further_from_fp64():
    x, w, dy = inputs(torch.bfloat16, f=64, h=128)
    ref, base, comp = reference(x, w, dy), run(baseline, x, w, dy), run(compiled, x, w, dy)
    for name, r, b, c in zip(("y", "dx", "dw"), ref, base, comp):
        scale = r.abs().max().item()
        torch.testing.assert_close(c.double(), r, rtol=3e-2, atol=1e-2 * scale, msg=name)
        assert err(c, r) <= err(b, r) * 1.05 + 1e-6, (name, err(c, r), err(b, r))


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_the_same_gemms_as_the_baseline(recipe):
    """--fp8 (the CPU emulation of torch._scaled_mm): compiled runs the baseline's FP8 GEMMs (the bound: docstring)."""
    x, w, dy = inputs(torch.bfloat16, f=64, h=128, m=64)
    ref, base, comp = reference(x, w, dy), run(baseline, x, w, dy, fp8=recipe), run(compiled, x, w, dy, fp8=recipe)
    assert_fp8_close(ref, base, comp, recipe)


@pytest.mark.slow
def test_backward_saves_only_the_gemm_output():
    """The SwiGLU keeps [gate | up] for backward and nothing else (the baseline also keeps silu(gate): [.., f])."""
    x, w, _ = inputs(torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        compiled.gemm_fc1(x.requires_grad_(), w.requires_grad_())
    assert saved.count(torch.Size([40, 96])) == 1 and torch.Size([40, 48]) not in saved, saved


@pytest.mark.slow  # a tiny CPU run compiling its kernels (~1 min on 2 cores)
def test_an_fp8_run_with_selective_recompute_learns():
    """End to end: --fp8 tensorwise with --op-gemm-fc1 compiled under selective activation checkpointing (its
    compiled kernels run again in the recompute); the loss falls."""
    out = subprocess.run([sys.executable, "-m", "engine", "pretrain", *TINY_FAST, "--fp8", "tensorwise",
                          "--op-gemm-fc1", "compiled", "--op-fp8-cast", "compiled", "--activation-checkpointing",
                          "selective", "--eval-samples", "0", "--no-save-final"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gemm_fc1=compiled" in out.stdout
    losses = [float(line.split("global_loss=")[1].split()[0]) for line in loss_lines(out.stdout)]
    assert len(losses) >= 5 and losses[-1] < losses[0] - 0.3, losses


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_at_the_slice_shapes_against_the_baseline_and_run_to_run():
    """The 8B slice's FC1 ([2, 4096] tokens x hidden 4096, f 16384): bf16 within the baseline's bound of the fp32
    linear and no further from it than the baseline, --fp8 tensorwise by the FP8 bound (docstring), and the Triton
    kernels bit for bit run to run."""
    x, w, dy = inputs(torch.bfloat16, "cuda", m=8192, f=16384, h=4096)
    assert_like_baseline(compiled, x, w, dy, ({}, {"fp8": "tensorwise"}))


def assert_like_baseline(version, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, settings) -> None:
    """For each of `settings` (gemm_fc1 keywords): bf16 no further (x 1.05) from the fp32 linear than the baseline,
    --fp8 by the FP8 bound (docstring); then the version bit for bit run to run."""
    ref = reference(x, w, dy, torch.float32)
    for kw in settings:
        base, got = run(baseline, x, w, dy, **kw), run(version, x, w, dy, **kw)
        if kw:
            assert_fp8_close(ref, base, got, kw)
        else:
            for name, r, b, c in zip(("y", "dx", "dw"), ref, base, got):
                assert rel(c, r) <= 1.05 * rel(b, r) + 1e-4, (name, rel(c, r), rel(b, r))
        again = run(version, x, w, dy, **kw)
        assert all(torch.equal(a, c) for a, c in zip(again, got)), kw


def assert_hands_main_grad(version, fp8: str) -> None:
    """Two micro-batches into a MainGrad (the first writes, the second adds) against the unfused weight gradients
    summed: the same GEMMs; the unfused ones arrive in bf16 (w's dtype), so they differ from the fp32 sum by bf16's
    rounding of each (relative 2^-9 at most an element: 2^-8 bounds the norm of two; measured 1.7e-3)."""
    from engine.distributed import MainGrad

    x, w, dy = inputs(torch.bfloat16, "cuda", m=1024, f=1024, h=512, seed=1)
    main = MainGrad(torch.zeros(w.shape, dtype=torch.float32, device="cuda"))
    unfused = torch.zeros(w.shape, dtype=torch.float32, device="cuda")
    wr = w.detach().clone().requires_grad_()
    for scale in (1.0, -0.5):
        version.gemm_fc1(x, wr, main_grad=main, fp8=fp8).backward(dy * scale)
        assert main.take()
        wr.grad = None
        unfused += run(version, x, w, dy * scale, fp8=fp8)[2].float()
    assert rel(main.grad, unfused) < 2**-8, fp8
