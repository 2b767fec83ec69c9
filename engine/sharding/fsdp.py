"""Fully sharded data parallelism (--fsdp): torch's FSDP2 over each TP rank's own shards.

Why and how: docs/engine/sharding.md, section `engine/sharding/fsdp.py`.
"""

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from engine.config import EngineConfig
from engine.distributed import ParallelState
from engine.optim.optimizer import adam_step_tensor, clip_coefficient, global_norm, make_adamw
from engine.model.tp_grads import TPGrads
from engine.sharding.fp8_all_gather import fp8_shards, plain_shard, precompute_fp8_scales, wrap_fp8_weights
from engine.sharding.zero_state import KINDS, sharded_piece, state_prefix

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["device_mesh", "shard_model", "ShardedAdamW", "fsdp_optimizer_state", "load_fsdp_optimizer_state"]


def device_mesh(par: ParallelState) -> "DeviceMesh":
    """The (dp, tp) mesh over ParallelState's existing process groups: rank r at [r // tp, r % tp]."""
    # torch.distributed's FSDP and mesh modules are imported when --fsdp uses them: they pull in DTensor and sympy,
    # ~1.2 s of CPU at every engine start otherwise.
    from torch.distributed.device_mesh import DeviceMesh

    ranks = torch.arange(par.world_size).view(par.dp_size, par.tp_size)
    return DeviceMesh.from_group([par.dp_group, par.tp_group], par.device.type, mesh=ranks,
                                 mesh_dim_names=("dp", "tp"))


def shard_model(model: nn.Module, par: ParallelState, compute_dtype: torch.dtype, cfg: EngineConfig) -> None:
    """fully_shard each decoder layer, then the root, over the dp sub-mesh. The model holds fp32 parameters.

    --fsdp-reshard-after-forward picks which layers free their gathered weights after forward, --fsdp-prefetch how
    many layers' all-gathers are issued ahead (explicitly; 0 leaves FSDP2's implicit one), --fsdp-reduce-dtype the
    gradients' dtype on the wire (the sharded gradient stays fp32), --fsdp-fp8-all-gather the FP8 linears' weights
    gathered as their FP8 copies (engine/sharding/fp8_all_gather.py)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # (see device_mesh)

    mesh = device_mesh(par)["dp"]
    policy = MixedPrecisionPolicy(param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
                                  reduce_dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[cfg.fsdp_reduce_dtype])
    if cfg.fsdp_fp8_all_gather:
        wrap_fp8_weights(model, compute_dtype)
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=_reshard(cfg.fsdp_reshard_after_forward,
                                                                                       i, len(layers)))
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root: FSDP2 never reshards it after forward
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # SUM, not the average over DP: the loss is divided by the global token count already. Forced to a
            # plain SUM collective (gloo has no PREMUL_SUM).
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    if cfg.fsdp_prefetch:
        n = cfg.fsdp_prefetch
        model.set_modules_to_forward_prefetch(layers[:n])
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + n])
            layer.set_modules_to_backward_prefetch(layers[max(0, i - n):i][::-1])


def _reshard(policy: str, index: int, count: int) -> bool:
    """reshard_after_forward of decoder layer `index` of `count` under --fsdp-reshard-after-forward `policy`."""
    return {"always": True, "never": False, "default": index < count - 1}[policy]


def _rows(numel_rows: int, dp_rank: int, dp_size: int) -> tuple[int, int]:
    """Rows [lo, hi) of a dim-0 shard as FSDP2 cuts it (torch.chunk: ceil-sized pieces, the last ones short or empty)."""
    chunk = math.ceil(numel_rows / dp_size)
    lo = min(dp_rank * chunk, numel_rows)
    return lo, min(lo + chunk, numel_rows)


def _flat_range(param: torch.Tensor, dp_rank: int, dp_size: int) -> tuple[int, int]:
    """[lo, hi) of the flattened (TP-local) parameter that DP rank `dp_rank` holds."""
    rows = param.shape[0]
    width = param.numel() // rows
    lo, hi = _rows(rows, dp_rank, dp_size)
    return lo * width, hi * width


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded parameter (or of its gradient / a moment), flattened; a plain tensor
    (--fsdp-fp8-all-gather's Fp8Shard unwrapped: what the optimizer and checkpoints see is the fp32 master)."""
    return plain_shard(param.to_local()).reshape(-1)


class ShardedAdamW:
    """AdamW over FSDP2's sharded fp32 parameters, with the engine's grad norm and clipping over TP x DP.

    `tp_grads`: what TP asks of the gradients (the sharded model's `tp_grads()`)."""

    def __init__(self, model: nn.Module, cfg: EngineConfig, par: ParallelState, lr_multipliers: Mapping[str, float],
                 tp_grads: TPGrads):
        self.model, self.cfg, self.par, self.tp_grads = model, cfg, par, tp_grads
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        missing = [n for n, _ in self.named if n not in lr_multipliers]
        assert not missing, f"no lr multiplier for {missing}"
        for name, p in self.named:
            lo, hi = _flat_range(p, par.dp_rank, par.dp_size)
            assert _local(p.data).numel() == hi - lo, f"{name}: FSDP2's shard is not rows {lo}..{hi} of the flattened tensor"
        self.adam = make_adamw([(n, p.ndim, p) for n, p in self.named], cfg, lr_multipliers, par.device)
        self.fp8_weights = fp8_shards([p for _, p in self.named])  # --fsdp-fp8-all-gather
        self._fp8_scales()

    def _fp8_scales(self) -> None:
        """--fsdp-fp8-all-gather: the FP8 weights' scales of the masters as they are now (at start, after each step
        and each load): one all-reduce over DP, before the next forward's all-gathers read them."""
        precompute_fp8_scales(self.fp8_weights, self.par.dp_group)

    def zero_grads(self) -> None:
        self.adam.zero_grad(set_to_none=True)

    def start_micro_batch(self, last: bool) -> None:
        """Before a micro-batch's backward (engine/train.py): what FSDP2 does at the end of it. --fsdp-grad-sync step
        accumulates unsharded gradients until the last micro-batch, which reduce-scatters their sum;
        --fsdp-reshard-after-forward never keeps the gathered weights until the last backward (they do not change
        within a step)."""
        sync = last or self.cfg.fsdp_grad_sync == "micro-batch"
        self.model.set_requires_gradient_sync(sync)
        self.model.set_is_last_backward(sync)  # FSDP2's micro-batching: no reduce-scatter to wait for before then
        self.model.set_reshard_after_backward(last or self.cfg.fsdp_reshard_after_forward != "never")

    @torch.no_grad()
    def finish_grads(self) -> None:
        """After the last micro-batch's backward (FSDP2 has reduce-scattered every gradient): the TP sums."""
        for s in self.tp_grads.sums:
            lo, hi = _flat_range(s.param, self.par.dp_rank, self.par.dp_size)
            a, b = max(s.lo, lo), min(s.hi, hi)
            if a < b and s.param.grad is not None:
                dist.all_reduce(_local(s.param.grad)[a - lo:b - lo], group=s.group)

    def _counted(self, param: torch.Tensor) -> list[slice]:
        """Slices of this rank's flattened gradient shard that count towards the grad norm (see MixedPrecisionAdamW)."""
        lo, hi = _flat_range(param, self.par.dp_rank, self.par.dp_size)
        return self.tp_grads.counted(param, lo, hi)

    @torch.no_grad()
    def grad_norm(self) -> float:
        """Global L2 norm of the gradients over this rank's counted shards, summed over DP and TP."""
        views = [_local(p.grad)[part] for _, p in self.named if p.grad is not None for part in self._counted(p)]
        return global_norm(views, self.par)

    @torch.no_grad()
    def clip(self, norm: float) -> None:
        coef = clip_coefficient(self.cfg, norm)
        if coef is not None:
            for _, p in self.named:
                if p.grad is not None:
                    _local(p.grad).mul_(coef)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        for group in self.adam.param_groups:
            group["lr"] = lr * group["lr_mult"]
        self.adam.step()
        self._fp8_scales()

    def adam_step(self) -> int:
        for _, p in self.named:
            state = self.adam.state.get(p)
            if state and "step" in state:
                return int(state["step"].item())
        return 0

    def named_grads(self) -> list[tuple[str, torch.Tensor]]:
        """(name, this rank's gradient shard), for the divergence report."""
        return [(n, _local(p.grad)) for n, p in self.named if p.grad is not None]

    def state_tensors(self) -> list[tuple[str, nn.Parameter, tuple[torch.Tensor, ...]]]:
        """(name, parameter, this rank's flattened (master, exp_avg, exp_avg_sq)); zero moments before the first step."""
        out = []
        for name, p in self.named:
            state = self.adam.state.get(p, {})
            moments = [_local(state[k]) if k in state else torch.zeros_like(_local(p.data)) for k in KINDS[1:]]
            out.append((name, p, (_local(p.data), *moments)))
        return out

    @torch.no_grad()
    def load(self, name_to_values: dict[str, tuple[torch.Tensor, ...]], adam_step: int) -> None:
        """Install loaded (master, exp_avg, exp_avg_sq) shards: the parameters themselves and AdamW's state."""
        for name, p in self.named:
            master, exp_avg, exp_avg_sq = name_to_values[name]
            _local(p.data).copy_(master)
            if adam_step > 0:
                state = self.adam.state[p]
                for key, value in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                    state[key] = torch.zeros_like(p.data)
                    _local(state[key]).copy_(value)
                state["step"] = adam_step_tensor(adam_step, self.par.device)
        self._fp8_scales()


def _pieces(param: torch.Tensor, par: ParallelState) -> list[tuple[int, int, int]]:
    """(global rank, lo, hi) of every DP rank's non-empty shard of this TP rank's flattened parameter."""
    out = []
    for d in range(par.dp_size):
        lo, hi = _flat_range(param, d, par.dp_size)
        if lo < hi:
            out.append((d * par.tp_size + par.tp_rank, lo, hi))
    return out


def fsdp_optimizer_state(optimizer: ShardedAdamW, par: ParallelState,
                         stage: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> dict[str, Any]:
    """This rank's shards of the masters and moments, keyed and pieced as the ZeRO-1 optimizer writes them."""
    prefix = state_prefix(par)
    copy = stage or (lambda key, t: t)
    out: dict[str, Any] = {}
    for name, p, tensors in optimizer.state_tensors():
        lo, hi = _flat_range(p, par.dp_rank, par.dp_size)
        if lo == hi:  # this rank holds no row of it (fewer rows than DP ranks): the others write it
            continue
        for kind, tensor in zip(KINDS, tensors):
            key = f"{prefix}{kind}/{name}"
            out[key] = sharded_piece(copy(key, tensor), p.numel(), _pieces(p, par), par.rank)
    return out


def load_fsdp_optimizer_state(optimizer: ShardedAdamW, state: dict[str, Any], par: ParallelState,
                              adam_step: int) -> None:
    """Install what DCP loaded into `state` (built by fsdp_optimizer_state)."""
    prefix = state_prefix(par)
    values = {}
    for name, p, tensors in optimizer.state_tensors():
        key = f"{prefix}{KINDS[0]}/{name}"
        values[name] = tuple(state[f"{prefix}{kind}/{name}"].local_shards()[0].tensor for kind in KINDS) \
            if key in state else tensors
    optimizer.load(values, adam_step)
