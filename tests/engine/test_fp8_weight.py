"""The two tensor subclasses of --fsdp-fp8-all-gather, in one process (the gathers themselves: tests/parallel/
test_fp8_tp.py `test_fp8_all_gather_*`).

Fp8Weight (engine/distributed/fp8_weight.py) is what FSDP2 hands the linear: weight_copy must give its FP8 copy as
the cast would (same q, same scale, the transpose), the views that bring it to the linear must keep it, and any
other op must raise (it holds no values in its dtype). Fp8Shard (engine/sharding/fp8_all_gather.py) is the sharded
fp32 master: every op runs on the plain shard, FSDP2's views and padding keep the subclass (and its scale), in-place
ops (the optimizer's foreach ones too) change the master, and a gather before the scale is set raises.
"""

import pytest
import torch

from engine.distributed.fp8 import fp8_copy, weight_copy
from engine.distributed.fp8_weight import Fp8Weight
from engine.sharding.fp8_all_gather import Fp8Shard, _Scale, plain_shard


def gathered(seed: int = 0) -> tuple[torch.Tensor, Fp8Weight]:
    w = torch.randn(48, 32, generator=torch.Generator().manual_seed(seed)).bfloat16()
    cast = fp8_copy(w, "tensorwise")
    return w, Fp8Weight(cast.q, cast.scale, torch.bfloat16)


def test_weight_copy_of_a_gathered_weight_is_the_cast_of_the_weight():
    w, fp8 = gathered()
    want, got = fp8_copy(w, "tensorwise", transposed=True), weight_copy(fp8, "tensorwise")
    assert got.q.dtype == torch.float8_e4m3fn and fp8.dtype == torch.bfloat16 and fp8.shape == w.shape
    assert torch.equal(got.q.view(torch.uint8), want.q.view(torch.uint8))
    assert torch.equal(got.qt.view(torch.uint8), want.qt.view(torch.uint8)) and torch.equal(got.scale, want.scale)


def test_a_gathered_weight_keeps_through_its_views_and_refuses_other_ops():
    _, fp8 = gathered()
    param = torch.nn.Parameter(fp8)  # FSDP2 makes the unsharded parameter of it (a detach)
    assert isinstance(param, Fp8Weight) and param.requires_grad
    for same in (fp8.view(fp8.shape), fp8.view(-1, fp8.shape[1]), fp8.view_as(fp8), fp8.detach(),
                 torch.as_strided(fp8, fp8.shape, (fp8.shape[1], 1), 0)):
        assert isinstance(same, Fp8Weight) and same.q is fp8.q and same.scale is fp8.scale
    for other in (lambda: fp8 + 1, lambda: fp8.t(), lambda: fp8.view(-1), lambda: fp8.float(),
                  lambda: torch.empty_like(fp8)):
        with pytest.raises(RuntimeError, match="FP8-gathered weight.*--fsdp-fp8-all-gather"):
            other()


def test_a_shard_runs_every_op_on_its_master():
    t = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    scale = _Scale()
    shard = Fp8Shard(t.clone(), 12, torch.bfloat16, scale)
    for kept in (shard.view(-1), shard.detach(), shard[2:4], shard.narrow(0, 0, 3), shard.new_zeros(8, 4),
                 *torch.chunk(shard, 2)):
        assert isinstance(kept, Fp8Shard) and kept.scale is scale and kept.rows == 12
    assert torch.equal(shard[2:4].t, t[2:4])
    summed = shard + 1
    assert type(summed) is torch.Tensor and torch.equal(summed, t + 1)
    assert shard.copy_(2 * t) is shard and torch.equal(shard.t, 2 * t)
    torch._foreach_mul_([shard], 0.5)  # AdamW's own foreach ops (CPU) step the master in place
    assert torch.equal(plain_shard(shard), t) and plain_shard(t) is t
    with pytest.raises(RuntimeError, match="before precompute_fp8_scales set its scale"):
        shard.fsdp_pre_all_gather(None)
