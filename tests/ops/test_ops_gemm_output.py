"""gemm_output baseline (TP=1) vs F.cross_entropy on full fp64 logits with padding columns removed.

Tolerances: fp32 inputs -> loss rtol 1e-5 (per-row log-sum-exp in fp32, ~1e-7 relative, summed over
<= 64 rows) and grads rtol/atol 1e-5 x scale. bf16 inputs: the reference runs in fp64 on the same
bf16 values; logits are still fp32 (bf16 products are exact in fp32), so the loss keeps rtol 1e-5;
backward feeds grad_logits to the GEMMs in bf16 (2^-9 relative rounding) and rounds grads to bf16,
so grads get rtol 2e-2 with atol 1e-2 x max|grad|.
"""

import pytest
import torch
import torch.nn.functional as F

from engine.ops.gemm_output.baseline import CHUNK_TOKENS, gemm_output, gemm_output_chunked


def reference_loss(h, w, labels, vocab_size):
    logits = h.double() @ w.double().T
    return F.cross_entropy(logits[:, :vocab_size], labels, ignore_index=-100, reduction="sum")


def _case(n, d, v_padded, vocab_size, dtype, seed, ignore_every=5):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v_padded, d, generator=g) * 2 / d**0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab_size, (n,), generator=g)
    labels[::ignore_every] = -100
    return h, w, labels


def _check_against_reference(h, w, labels, vocab_size, loss, rtol_loss, rtol_grad, atol_grad_frac):
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    ref = reference_loss(h64, w64, labels, vocab_size)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss.double(), ref, rtol=rtol_loss, atol=0)
    loss.backward()
    ref.backward()
    for got, want in ((h.grad, h64.grad), (w.grad, w64.grad)):
        assert got.dtype == h.dtype
        torch.testing.assert_close(got.double(), want, rtol=rtol_grad, atol=atol_grad_frac * want.abs().max().item())


@pytest.mark.parametrize("n,chunk", [(37, 8), (32, 8), (5, 4096), (9, 1)])
def test_fp32_matches_reference_across_chunkings(n, chunk):
    vocab_size = 50  # padded to 64: columns 50..63 must not take part in the softmax
    h, w, labels = _case(n, 16, 64, vocab_size, torch.float32, seed=n)
    loss = gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=vocab_size, chunk_tokens=chunk)
    _check_against_reference(h, w, labels, vocab_size, loss, 1e-5, 1e-5, 1e-5)
    assert torch.count_nonzero(w.grad[vocab_size:]) == 0  # padding rows get no gradient


def test_default_chunk_boundary_crossed():
    n = CHUNK_TOKENS + 5  # two chunks with the real default, the second one 5 rows
    vocab_size = 120
    h, w, labels = _case(n, 8, 128, vocab_size, torch.float32, seed=2, ignore_every=7)
    loss = gemm_output(h, w, labels, vocab_start=0, vocab_size=vocab_size)
    _check_against_reference(h, w, labels, vocab_size, loss, 1e-5, 1e-5, 1e-5)


def test_bf16_within_tolerance():
    vocab_size = 200
    h, w, labels = _case(64, 32, 256, vocab_size, torch.bfloat16, seed=3)
    loss = gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=vocab_size, chunk_tokens=24)
    _check_against_reference(h, w, labels, vocab_size, loss, 1e-5, 2e-2, 1e-2)


def test_all_labels_ignored_gives_zero_loss_and_gradients():
    h, w, labels = _case(6, 8, 16, 16, torch.float32, seed=4)
    labels[:] = -100
    loss = gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=16, chunk_tokens=4)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


def test_backward_against_numerical_gradients_fp64():
    # gradcheck differentiates numerically: an independent check of the hand-written backward.
    h, w, labels = _case(7, 5, 12, 10, torch.float64, seed=5, ignore_every=3)
    fn = lambda a, b: gemm_output_chunked(a, b, labels, vocab_start=0, vocab_size=10, chunk_tokens=3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, w))


def test_never_saves_full_logits_for_backward():
    n, v = 40, 64
    h, w, labels = _case(n, 8, v, v, torch.float32, seed=6)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        loss = gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=v, chunk_tokens=8)
    loss.backward()
    assert saved and max(saved) < n * v  # h, w, labels and one lse per row; no [n, V] tensor


def test_only_h_requires_grad():
    h, w, labels = _case(9, 8, 16, 16, torch.float32, seed=7)
    w = w.detach()
    gemm_output_chunked(h, w, labels, vocab_start=0, vocab_size=16, chunk_tokens=4).backward()
    assert h.grad is not None and h.grad.shape == h.shape


def test_rejects_bad_labels_dtype():
    h, w, labels = _case(4, 8, 16, 16, torch.float32, seed=8)
    with pytest.raises(ValueError, match="int64 labels"):
        gemm_output(h, w, labels.int(), vocab_start=0, vocab_size=16)
