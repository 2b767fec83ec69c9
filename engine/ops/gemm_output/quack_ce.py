"""LM head + cross-entropy with the gradients computed during the forward (quack CE kernels).

Why and how: docs/engine/ops.md, section `engine/ops/gemm_output/quack_ce.py`.
"""

import torch
import torch.distributed as dist
from quack.cross_entropy import cross_entropy_fwd_out

from engine.ops.gemm_output.baseline import check_inputs
from engine.ops.gemm_output.ce_kernels import ce_backward_, ce_forward_
from engine.ops.gemm_output.cute_scale import scale_
from engine.ops.kernel_cache import configure_quack_cache

__all__ = ["gemm_output", "gemm_output_chunked", "gemm_output_vocab_parallel_local", "CHUNK_TOKENS", "IGNORE_INDEX"]

configure_quack_cache()

CHUNK_TOKENS = 4096
IGNORE_INDEX = -100
_NOT_OWNED = -1  # a valid row whose label lives on another TP rank: no onehot here, loss still counts
_DTYPES = (torch.bfloat16, torch.float16)


def _all_reduce(t: torch.Tensor, op: "dist.ReduceOp", group) -> None:
    if group is not None:
        dist.all_reduce(t, op=op, group=group)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, labels, vocab_start, vocab_size, tp_group, vocab_parallel, chunk_tokens, need_h, need_w,
                main_grad):
        n, v_local = h.shape[0], w.shape[0]
        n_real = max(0, min(v_local, vocab_size - vocab_start))
        valid = labels != IGNORE_INDEX
        local = labels - vocab_start
        owned = valid & (local >= 0) & (local < v_local)
        defer_w = need_w and main_grad is not None  # dW in backward, straight into the fp32 accumulator
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_h else None  # contiguous: scale_
        grad_w = torch.empty(w.shape, dtype=w.dtype, device=w.device) if need_w and not defer_w else None
        need_grad = need_h or need_w
        rows_max = min(chunk_tokens, n)
        buf = torch.empty(rows_max, v_local, dtype=torch.float32, device=h.device)  # logits
        # d loss_sum / d logits in the GEMM dtype: one chunk's, or every row's when dW waits for the backward
        dlogits_all = (torch.empty(n if defer_w else rows_max, v_local, dtype=h.dtype, device=h.device)
                       if need_grad else None)
        row_loss = torch.empty(n, dtype=torch.float32, device=h.device)
        if vocab_parallel:
            fwd_target = torch.where(owned, local, IGNORE_INDEX)
            bwd_target = torch.where(owned, local, torch.where(valid, _NOT_OWNED, IGNORE_INDEX))
            dloss_rows = valid.to(torch.float32)
            lse_local = torch.empty(n, dtype=torch.float32, device=h.device)
            idx = torch.where(owned, local, 0).unsqueeze(1)
        first_w = True
        for start in range(0, n, chunk_tokens):
            rows = slice(start, min(start + chunk_tokens, n))
            logits = buf[: rows.stop - rows.start]
            dlogits = None
            if need_grad:
                dlogits = dlogits_all[rows] if defer_w else dlogits_all[: rows.stop - rows.start]
            torch.mm(h[rows], w.t(), out_dtype=torch.float32, out=logits)
            if n_real < v_local:
                logits[:, n_real:] = float("-inf")
            if not vocab_parallel:
                # Without a gradient to keep, dx goes over the logits: the kernel computes it either way.
                ce_forward_(logits, labels[rows], row_loss[rows], logits if dlogits is None else dlogits,
                            IGNORE_INDEX)
            else:
                if n_real > 0:
                    cross_entropy_fwd_out(logits, fwd_target[rows], None, loss=row_loss[rows], lse=lse_local[rows],
                                          dx=None, weight=None, ignore_index=IGNORE_INDEX)
                else:  # a shard of padding only: exp() of its columns is 0 everywhere
                    lse_local[rows] = float("-inf")
                target = torch.where(owned[rows], logits.gather(1, idx[rows]).squeeze(1), 0.0)
                gmax = lse_local[rows].clone()
                _all_reduce(gmax, dist.ReduceOp.MAX, tp_group)
                stats = torch.stack([torch.exp(lse_local[rows] - gmax), target])
                _all_reduce(stats, dist.ReduceOp.SUM, tp_group)
                lse = gmax + torch.log(stats[0])
                row_loss[rows] = torch.where(valid[rows], lse - stats[1], 0.0)
                if need_grad:
                    ce_backward_(logits, bwd_target[rows], dloss_rows[rows], lse, dlogits, IGNORE_INDEX)
            if need_h:
                torch.mm(dlogits, w, out=grad_h[rows])
            if need_w and not defer_w:
                if first_w:
                    torch.mm(dlogits.t(), h[rows], out=grad_w)
                else:
                    grad_w.addmm_(dlogits.t(), h[rows])
                first_w = False
        if grad_w is not None and n == 0:
            grad_w.zero_()
        if defer_w:
            ctx.save_for_backward(grad_h, dlogits_all, h, w)
        else:
            ctx.save_for_backward(grad_h, grad_w)
        ctx.main_grad = main_grad if defer_w else None
        ctx.consumed = False
        return row_loss.sum()

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.consumed:
            raise RuntimeError("gemm_output (quack) scales its stored gradients in place: backward runs once per forward")
        ctx.consumed = True
        scale = grad_loss.to(torch.float32)
        if ctx.main_grad is None:
            grad_h, grad_w = ctx.saved_tensors
            if grad_w is not None:
                grad_w = scale_(grad_w, scale)
        else:
            # dW = dlogits^T (scale h): the scale goes on h (n x d, small) rather than on the product, rounded once
            # to h's dtype, and the GEMM adds into the fp32 accumulator (no bf16 dW, no scaling pass over it).
            grad_h, dlogits, h, w = ctx.saved_tensors
            h_scaled = scale_(h.clone(memory_format=torch.contiguous_format), scale)
            grad_w = ctx.main_grad.weight_grad(dlogits, h_scaled, w)
        if grad_h is not None:
            grad_h = scale_(grad_h, scale)
        return grad_h, grad_w, None, None, None, None, None, None, None, None, None


def _check(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, vocab_start: int, vocab_size: int,
           chunk_tokens: int) -> None:
    check_inputs(h, w, labels, vocab_start, vocab_size, chunk_tokens)
    if h.dtype not in _DTYPES or w.dtype != h.dtype or not h.is_cuda:
        raise ValueError(f"gemm_output (quack) runs bf16/fp16 CUDA tensors of one dtype; got h {h.dtype} {h.device}, "
                         f"w {w.dtype}: use --op-gemm-output baseline for other dtypes")
    if w.shape[0] % 8 or w.shape[1] % 8:
        raise ValueError(f"gemm_output (quack) needs V_local and d multiples of 8 (pad the vocabulary to 128 x TP); "
                         f"got w {tuple(w.shape)}")


def gemm_output_chunked(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_start: int, vocab_size: int,
                        tp_group: "dist.ProcessGroup | None" = None, vocab_parallel: bool | None = None,
                        chunk_tokens: int = CHUNK_TOKENS, main_grad=None) -> torch.Tensor:
    """gemm_output with an explicit chunk size and path.

    vocab_parallel None: the vocab-parallel path when tp_group has more than one rank or when this
    shard does not hold the whole vocabulary (labels may then live elsewhere; without a group the
    loss is this shard's alone, as for the baseline). True without a group runs one rank's share of
    that path with the collectives left out (warmup, benchmarks).
    """
    _check(h, w, labels, vocab_start, vocab_size, chunk_tokens)
    if vocab_parallel is None:
        whole = vocab_start == 0 and w.shape[0] >= vocab_size
        vocab_parallel = not whole or (tp_group is not None and dist.get_world_size(tp_group) > 1)
    grad_on = torch.is_grad_enabled()
    need_h, need_w = grad_on and h.requires_grad, grad_on and w.requires_grad
    return _FusedLinearCrossEntropy.apply(h, w, labels, vocab_start, vocab_size, tp_group, vocab_parallel,
                                          chunk_tokens, need_h, need_w, main_grad)


def gemm_output(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_start: int, vocab_size: int,
                tp_group: "dist.ProcessGroup | None" = None, main_grad=None) -> torch.Tensor:
    """Sum of cross-entropy of softmax(h @ w^T) over tokens whose label is not -100 (fp32 scalar).

    w is this rank's shard of the padded vocabulary; with a tp_group of several ranks the softmax
    spans all shards (docs/engine/ops.md). main_grad: w's fp32 gradient accumulator, which the
    backward adds dW into (engine/ops/gemm_output/register.toml). Contract: engine/ops/README.md.
    """
    return gemm_output_chunked(h, w, labels, vocab_start=vocab_start, vocab_size=vocab_size, tp_group=tp_group,
                               main_grad=main_grad)


def gemm_output_vocab_parallel_local(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, *, vocab_start: int,
                                     vocab_size: int) -> torch.Tensor:
    """One TP rank's work of the vocab-parallel path without its collectives (compiles and times the
    kernels a TP > 1 run uses, in one process); the loss is this shard's alone."""
    return gemm_output_chunked(h, w, labels, vocab_start=vocab_start, vocab_size=vocab_size, tp_group=None,
                               vocab_parallel=True)
