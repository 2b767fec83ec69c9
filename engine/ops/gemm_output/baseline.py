"""LM head + cross-entropy baseline: torch GEMMs over token chunks, vocab-parallel under TP.

Why and how: docs/engine/ops.md, section `engine/ops/gemm_output/baseline.py`.
"""

import torch
import torch.distributed as dist

__all__ = ["gemm_output", "gemm_output_chunked", "CHUNK_TOKENS", "IGNORE_INDEX", "check_inputs"]

CHUNK_TOKENS = 4096
IGNORE_INDEX = -100
_HALF = (torch.bfloat16, torch.float16)


def _mm(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """a @ b with the result (and accumulation) in `acc`, operands kept in their dtype on CUDA."""
    if a.dtype in _HALF and a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.to(acc), b.to(acc))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, labels, vocab_start, vocab_size, tp_group, chunk_tokens, main_grad):
        n, v_local = h.shape[0], w.shape[0]
        operand = torch.promote_types(h.dtype, w.dtype)
        acc = torch.promote_types(operand, torch.float32)
        hm, wm = h.to(operand), w.to(operand)
        n_real = max(0, min(v_local, vocab_size - vocab_start))  # real (non-padding) columns here
        valid = labels != IGNORE_INDEX
        local = labels - vocab_start
        owned = valid & (local >= 0) & (local < v_local)
        idx = torch.where(owned, local, 0).unsqueeze(1)

        row_max = torch.empty(n, dtype=acc, device=h.device)
        sum_exp = torch.empty(n, dtype=acc, device=h.device)
        target = torch.empty(n, dtype=acc, device=h.device)
        for start in range(0, n, chunk_tokens):
            rows = slice(start, min(start + chunk_tokens, n))
            logits = _mm(hm[rows], wm.t(), acc)
            if n_real < v_local:
                logits[:, n_real:] = float("-inf")
            target[rows] = torch.where(owned[rows], logits.gather(1, idx[rows]).squeeze(1), 0.0)
            m = logits.amax(dim=1)
            # A shard that is all padding has max -inf; subtracting it would give nan.
            m_safe = torch.where(torch.isfinite(m), m, 0.0)
            sum_exp[rows] = logits.sub_(m_safe.unsqueeze(1)).exp_().sum(dim=1)
            row_max[rows] = m  # -inf on an all-padding shard: its exp(m - global max) rescale is 0
        if tp_group is not None:
            global_max = row_max.clone()
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=tp_group)
            stats = torch.stack([sum_exp * torch.exp(row_max - global_max), target])
            dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=tp_group)
            sum_exp, target, row_max = stats[0], stats[1], global_max
        lse = row_max + torch.log(sum_exp)
        loss = torch.where(valid, lse - target, 0.0).sum()

        ctx.save_for_backward(h, w, labels, lse)
        ctx.vocab_start, ctx.n_real, ctx.chunk_tokens, ctx.main_grad = vocab_start, n_real, chunk_tokens, main_grad
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        h, w, labels, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, v_local = h.shape[0], w.shape[0]
        operand = torch.promote_types(h.dtype, w.dtype)
        acc = torch.promote_types(operand, torch.float32)
        hm, wm = h.to(operand), w.to(operand)
        valid = labels != IGNORE_INDEX
        local = labels - ctx.vocab_start
        owned = valid & (local >= 0) & (local < v_local)
        idx = torch.where(owned, local, 0).unsqueeze(1)
        scale = torch.where(valid, grad_loss.to(acc), 0.0)  # d loss_sum / d (row loss)
        onehot_scale = torch.where(owned, scale, 0.0).unsqueeze(1)

        grad_h = torch.empty_like(h) if need_h else None
        grad_w = None
        for start in range(0, n, ctx.chunk_tokens):
            rows = slice(start, min(start + ctx.chunk_tokens, n))
            logits = _mm(hm[rows], wm.t(), acc)
            if ctx.n_real < v_local:
                logits[:, ctx.n_real:] = float("-inf")
            grad = logits.sub_(lse[rows].unsqueeze(1)).exp_().mul_(scale[rows].unsqueeze(1))  # softmax * scale
            grad.scatter_(1, idx[rows], grad.gather(1, idx[rows]) - onehot_scale[rows])
            grad = grad.to(operand)
            if need_h:
                grad_h[rows] = _mm(grad, wm, acc).to(h.dtype)
            if need_w and ctx.main_grad is not None:  # the chunk's dW added in fp32 (the contract's main_grad)
                grad_w = ctx.main_grad.weight_grad(grad, hm[rows], w)
            elif need_w:
                part = _mm(grad.t(), hm[rows], acc)
                grad_w = part if grad_w is None else grad_w.add_(part)
        if need_w:  # no rows: a zero dW (added by the gradient hook, as for any version that ignores main_grad)
            grad_w = torch.zeros(w.shape, dtype=w.dtype, device=w.device) if grad_w is None else grad_w.to(w.dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def check_inputs(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, vocab_start: int, vocab_size: int,
                 chunk_tokens: int) -> None:
    """The contract's shape and range checks, shared by every gemm_output version."""
    if h.dim() != 2 or w.dim() != 2 or h.shape[1] != w.shape[1]:
        raise ValueError(f"gemm_output wants h [n, d] and w [V_local, d]; got {tuple(h.shape)}, {tuple(w.shape)}")
    if labels.shape != (h.shape[0],) or labels.dtype != torch.int64:
        raise ValueError(f"gemm_output wants int64 labels [n={h.shape[0]}]; got {labels.dtype} {tuple(labels.shape)}")
    if vocab_start < 0 or vocab_size <= 0 or chunk_tokens <= 0:
        raise ValueError(f"gemm_output: vocab_start={vocab_start} must be >= 0, vocab_size={vocab_size} and "
                         f"chunk_tokens={chunk_tokens} > 0")


def gemm_output_chunked(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_start: int, vocab_size: int,
                        tp_group: "dist.ProcessGroup | None" = None, chunk_tokens: int = CHUNK_TOKENS,
                        main_grad=None) -> torch.Tensor:
    """gemm_output with an explicit chunk size (tests use small chunks to cross chunk boundaries)."""
    check_inputs(h, w, labels, vocab_start, vocab_size, chunk_tokens)
    return _LinearCrossEntropy.apply(h, w, labels, vocab_start, vocab_size, tp_group, chunk_tokens, main_grad)


def gemm_output(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_start: int, vocab_size: int,
                tp_group: "dist.ProcessGroup | None" = None, main_grad=None) -> torch.Tensor:
    """Sum of cross-entropy of softmax(h @ w^T) over tokens whose label is not -100 (fp32 scalar).

    w is this rank's vocabulary shard (rows vocab_start .. vocab_start + V_local of the padded
    vocabulary); with tp_group the softmax spans all shards of the group. main_grad: w's fp32
    gradient accumulator; the backward adds each chunk's dW into it (register.toml). See the module
    docstring.
    """
    return gemm_output_chunked(h, w, labels, vocab_start=vocab_start, vocab_size=vocab_size, tp_group=tp_group,
                               chunk_tokens=CHUNK_TOKENS, main_grad=main_grad)
