"""attention baseline vs an explicit fp64 causal softmax(QK^T)V with the GQA head mapping written out.

With document boundaries (`cu_seqlens`): every document's output and gradients equal the fp64
reference run on that document alone (its own q, k, v slice), 1e-5 as below.

Tolerances: fp32 inputs -> 1e-5 (fp32 SDPA on CPU accumulates sums of <= 16 products of O(1)
values, errors ~1e-6). bf16 inputs are compared with a reference computed in fp64 from the same
bf16 values, so only the kernel's own rounding counts: rounding the output to bf16 costs up to
2^-8 relative (rtol 2^-7 leaves a 2x margin), and bf16 probabilities / partial sums add an error
bounded by a few ulps of max|v| (atol 4e-3 x max|v|; measured <= 1.6e-3 x max|v| over 5 seeds).
"""

import math

import pytest
import torch

from engine.ops.attention.baseline import attention


def reference_attention(q, k, v, scale):
    """Causal GQA attention in fp64, one query head at a time: head i reads KV head i // (hq // hkv)."""
    q, k, v = q.double(), k.double(), v.double()
    b, s, hq, d = q.shape
    group = hq // k.shape[2]
    future = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
    heads = []
    for i in range(hq):
        j = i // group
        scores = (q[:, :, i, :] @ k[:, :, j, :].transpose(1, 2)) * scale  # [b, s, s]
        scores = scores.masked_fill(future, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v[:, :, j, :])
    return torch.stack(heads, dim=2)


def _inputs(b, s, hq, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g).to(dtype).requires_grad_() for h in (hq, hkv, hkv)]


@pytest.mark.parametrize("hq,hkv", [(4, 2), (3, 3), (6, 1)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_reference_fp32_with_gradients(hq, hkv, scale):
    d = 8
    scale = scale if scale is not None else 1 / math.sqrt(d)
    q, k, v = _inputs(2, 7, hq, hkv, d, torch.float32, seed=hq * 10 + hkv)
    out = attention(q, k, v, softmax_scale=scale)
    assert out.shape == (2, 7, hq, d) and out.dtype == torch.float32

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, scale)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)

    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    out.backward(grad_out.float())
    ref.backward(grad_out)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_causality_future_keys_do_not_matter():
    q, k, v = _inputs(1, 6, 2, 1, 4, torch.float32, seed=3)
    out = attention(q, k, v, softmax_scale=0.5)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, 4:] += 10.0
    v2[:, 4:] -= 10.0
    out2 = attention(q, k2, v2, softmax_scale=0.5)
    torch.testing.assert_close(out[:, :4], out2[:, :4], rtol=0, atol=0)
    assert not torch.allclose(out[:, 4:], out2[:, 4:])


def test_bf16_within_tolerance():
    q, k, v = _inputs(2, 16, 4, 2, 16, torch.bfloat16, seed=11)
    out = attention(q, k, v, softmax_scale=0.25)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = reference_attention(q.detach(), k.detach(), v.detach(), 0.25)
    bound = 4e-3 * v.detach().double().abs().max().item()
    torch.testing.assert_close(out.double(), ref, rtol=2**-7, atol=bound)
    out.sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16


def test_rejects_heads_not_a_multiple():
    q, k, v = _inputs(1, 4, 3, 2, 4, torch.float32, seed=1)
    with pytest.raises(ValueError, match="not a multiple"):
        attention(q, k, v, softmax_scale=0.5)


def test_documents_match_the_reference_run_on_each_document_alone():
    # two rows of 12: row 0 holds documents of 4, 1 and 7 tokens, row 1 one of 1 and one of 11
    lengths = [4, 1, 7, 1, 11]
    cu = torch.tensor([0, 4, 5, 12, 13, 24], dtype=torch.int32)
    q, k, v = _inputs(2, 12, 4, 2, 8, torch.float32, seed=5)
    out = attention(q, k, v, softmax_scale=0.4, cu_seqlens=cu, max_seqlen=max(lengths))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(grad_out)
    flat = [t.detach().double().reshape(24, t.shape[2], 8) for t in (q, k, v)]
    g_flat = grad_out.double().reshape(24, 4, 8)
    got = [out.detach().reshape(24, 4, 8)] + [t.grad.reshape(24, t.shape[2], 8) for t in (q, k, v)]
    for start, end in zip(cu.tolist(), cu.tolist()[1:]):
        parts = [t[start:end].unsqueeze(0).requires_grad_() for t in flat]
        ref = reference_attention(*parts, 0.4)
        ref.backward(g_flat[start:end].unsqueeze(0))
        want = [ref.detach()] + [t.grad for t in parts]
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            torch.testing.assert_close(a[start:end].double(), b[0], rtol=1e-5, atol=1e-5, msg=f"{name} [{start}:{end}]")


def test_documents_hide_other_documents_and_need_int32_offsets():
    q, k, v = _inputs(1, 8, 2, 1, 4, torch.float32, seed=4)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    out = attention(q, k, v, softmax_scale=0.5, cu_seqlens=cu, max_seqlen=5)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :3] += 10.0  # the first document's keys and values: invisible to the second
    v2[:, :3] -= 10.0
    out2 = attention(q, k2, v2, softmax_scale=0.5, cu_seqlens=cu, max_seqlen=5)
    torch.testing.assert_close(out[:, 3:], out2[:, 3:], rtol=0, atol=0)
    assert not torch.allclose(out[:, :3], out2[:, :3])
    with pytest.raises(ValueError, match="int32"):
        attention(q, k, v, softmax_scale=0.5, cu_seqlens=cu.long(), max_seqlen=5)
