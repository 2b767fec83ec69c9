"""--fsdp-fp8-all-gather: FSDP2 all-gathers each FP8 linear's weight as its tensorwise FP8 copy (1 byte an element
on the wire instead of bf16's 2), through FSDP2's all-gather extension (fsdp_pre_all_gather / fsdp_post_all_gather
on the sharded parameter's local tensor).

Why and how: docs/engine/sharding.md, section `engine/sharding/fp8_all_gather.py`.
"""

import math

import torch
import torch.distributed as dist
from torch import nn

from engine.distributed.fp8 import E4M3, amax_scale, scaled_cast
from engine.distributed.fp8_weight import Fp8Weight

__all__ = ["Fp8Shard", "wrap_fp8_weights", "fp8_shards", "precompute_fp8_scales", "plain_shard"]

_ops = torch.ops.aten
# The ops whose results are still the shard (views of it), or a new one like it (FSDP2 pads the shard with
# new_zeros before copying it in): FSDP2's sharding makes the sharded parameter's local tensor out of these.
_KEEP = {_ops.detach.default, _ops.alias.default, _ops.view.default, _ops._unsafe_view.default,
         _ops.as_strided.default, _ops.slice.Tensor, _ops.split.Tensor, _ops.split_with_sizes.default,
         _ops.new_zeros.default}


class _Scale:
    """One weight's scale, shared by every view of its shard (FSDP2 views and re-pads the shard), set once a step
    by precompute_fp8_scales: None before the first."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class Fp8Shard(torch.Tensor):
    """This DP rank's rows of an FP8 linear's (TP-local) weight, the fp32 master: the local tensor of FSDP2's sharded
    parameter. Every op runs on the plain shard `t` (the optimizer steps it, checkpoints read it); FSDP2's all-gather
    asks it for its FP8 copy instead (fsdp_pre_all_gather) and turns what it gathered into an Fp8Weight
    (fsdp_post_all_gather). `rows`: the whole weight's rows; `dtype_gathered`: the dtype the bf16 path would have
    gathered (FSDP2's param dtype), whose rounding the cast starts from, so the FP8 bits are the ones that path's
    cast makes."""

    t: torch.Tensor

    @staticmethod
    def __new__(cls, t: torch.Tensor, rows: int, dtype_gathered: torch.dtype, scale: _Scale):
        # guard: allow public-surface -- torch's wrapper-subclass constructor has no public name
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, strides=t.stride(), storage_offset=t.storage_offset(),
                                                   dtype=t.dtype, device=t.device, requires_grad=t.requires_grad)

    def __init__(self, t: torch.Tensor, rows: int, dtype_gathered: torch.dtype, scale: _Scale):
        self.t, self.rows, self.dtype_gathered, self.scale = t, rows, dtype_gathered, scale

    def __repr__(self) -> str:
        return f"Fp8Shard({self.t!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        inner_args, inner_kwargs = _plain(args), _plain(kwargs or {})
        out = func(*inner_args, **inner_kwargs)
        if func in _KEEP:  # (the shard is their first argument; split's result is a list)
            like = args[0]
            shards = [Fp8Shard(t, like.rows, like.dtype_gathered, like.scale) for t in _as_list(out)]
            return shards[0] if isinstance(out, torch.Tensor) else type(out)(shards)
        if args and isinstance(args[0], Fp8Shard) and out is inner_args[0]:
            return args[0]  # in place: the shard itself
        return out

    def fsdp_pre_all_gather(self, mesh, outer_size=None, outer_stride=None, module=None, mp_policy=None):
        """The all-gather's input: this rank's rows rounded to the gathered dtype, cast to E4M3 with the weight's
        scale, padded to FSDP2's shard rows (zeros cast to zeros), as bytes (every backend gathers uint8)."""
        if self.scale.value is None:
            raise RuntimeError("--fsdp-fp8-all-gather: an FP8 weight was gathered before precompute_fp8_scales set "
                               "its scale (engine/sharding/fsdp.py ShardedAdamW sets them at start, after each "
                               "step and after a load)")
        rows = math.ceil(self.rows / mesh.size())
        shard = self.t.to(self.dtype_gathered)
        if shard.shape[0] < rows:
            shard = torch.cat([shard, shard.new_zeros(rows - shard.shape[0], *shard.shape[1:])])
        return (scaled_cast(shard, self.scale.value, E4M3).view(torch.uint8),), (self.scale.value,)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        """The gathered bytes as the weight's FP8 copy: the first `rows` rows (the rest is padding), in an Fp8Weight
        of FSDP2's param dtype. On later all-gathers FSDP2 refills the same buffer; only the scale is new."""
        (data,), (scale,) = all_gather_outputs, metadata
        if out is not None:
            out.scale = scale
            return None
        return Fp8Weight(data.view(E4M3)[:self.rows], scale, param_dtype), (data,)


def _plain(x):
    """x with every Fp8Shard in it (nested in lists, tuples, dicts: foreach ops take lists) replaced by its `t`."""
    if isinstance(x, Fp8Shard):
        return x.t
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _as_list(out) -> list:
    return [out] if isinstance(out, torch.Tensor) else list(out)


def wrap_fp8_weights(model: nn.Module, dtype_gathered: torch.dtype) -> None:
    """Before fully_shard: make each weight a module runs through its FP8 linears (`fp8_linear_weights`) an Fp8Shard
    parameter, which fully_shard then splits by rows like any other."""
    for module in model.modules():
        for name in getattr(module, "fp8_linear_weights", ()):
            w = getattr(module, name)
            module.register_parameter(name, nn.Parameter(Fp8Shard(w.data, w.shape[0], dtype_gathered, _Scale()),
                                                         requires_grad=w.requires_grad))


def plain_shard(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor of a local shard: an Fp8Shard's `t`, any other tensor itself."""
    return t.t if isinstance(t, Fp8Shard) else t


def fp8_shards(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The sharded parameters (DTensors) among `params` whose local tensor is an Fp8Shard."""
    return [p for p in params if isinstance(p.to_local(), Fp8Shard)]


@torch.no_grad()
def precompute_fp8_scales(params: list[torch.Tensor], group: "dist.ProcessGroup | None") -> None:
    """Each weight's scale from its amax over all DP ranks' shards, for all weights with one all-reduce (MAX).
    The amax of the shard rounded to the gathered dtype is the rounding of the fp32 amax (rounding is monotonic and
    symmetric), so no rounded copy is made; the scale is amax_scale's of the gathered whole, bit for bit."""
    if not params:
        return
    shards = [p.to_local() for p in params]
    amax = torch.stack([torch.linalg.vector_norm(s.t, ord=math.inf, dtype=torch.float32).to(s.dtype_gathered).float()
                        if s.t.numel() else torch.zeros((), device=s.t.device) for s in shards])
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    scales = amax_scale(amax.unsqueeze(1), E4M3, -1, False)  # a row's inf-norm is its one amax: the same formula
    for s, scale in zip(shards, scales):
        s.scale.value = scale[0]
