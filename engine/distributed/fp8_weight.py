"""A linear weight that arrives as its tensorwise FP8 copy (--fsdp-fp8-all-gather): FSDP2 gathers the FP8 bytes,
and this tensor stands for the weight in the model dtype while holding only those bytes and their scale.

Why and how: docs/engine/sharding.md, section `engine/sharding/fp8_all_gather.py`.
"""

import torch

__all__ = ["Fp8Weight"]


class Fp8Weight(torch.Tensor):
    """The weight [out, in] in `dtype` (FSDP2's param dtype, so autograd gives it a gradient of that dtype), held as
    `q` (E4M3, row-major, [out, in]) and its fp32 `scale`: q is scaled_cast(W, scale), scale one for the whole
    weight. Only engine/distributed/fp8.py `weight_copy` reads it. The ops that bring it to an FP8 linear (FSDP2
    views it to its shape and makes it a Parameter, the MLP region aliases FC2's) give it again (_same_weight); any
    other op raises: it has no values in `dtype` to give."""

    q: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def __new__(cls, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, requires_grad: bool = False):
        # guard: allow public-surface -- torch's wrapper-subclass constructor has no public name
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device,
                                                   requires_grad=requires_grad)

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, requires_grad: bool = False):
        self.q, self.scale = q, scale

    def __repr__(self) -> str:
        return f"Fp8Weight(shape={tuple(self.shape)}, dtype={self.dtype}, q={self.q.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0]
        if isinstance(w, Fp8Weight) and _same_weight(func, w, args[1:], kwargs or {}):
            return Fp8Weight(w.q, w.scale, w.dtype)
        raise RuntimeError(f"{func} on an FP8-gathered weight (--fsdp-fp8-all-gather): it holds only the FP8 copy "
                           f"that the FP8 linears read (engine/distributed/fp8.py weight_copy); a layer that uses "
                           f"the weight otherwise cannot run with --fsdp-fp8-all-gather")


def _same_weight(func, w: Fp8Weight, args: tuple, kwargs: dict) -> bool:
    """Whether `func(w, *args, **kwargs)` is w itself again: a detach or alias, or a view to its own shape and
    (as_strided) row-major strides."""
    ops = torch.ops.aten
    if func in (ops.detach.default, ops.alias.default):
        return True
    if func in (ops.view.default, ops._unsafe_view.default):
        return w.q.view(*args, **kwargs).shape == w.shape
    if func is ops.as_strided.default:
        view = w.q.as_strided(*args, **kwargs)
        return view.shape == w.shape and view.stride() == w.q.stride() and view.storage_offset() == w.q.storage_offset()
    return False
