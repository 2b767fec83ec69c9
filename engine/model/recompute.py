"""Activation recompute of decoder layers: --activation-checkpointing {none, selective, full}.

Why and how: docs/engine/model.md, section `engine/model/recompute.py`.
"""

from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

__all__ = ["recompute_layer", "SAVED_OPS"]


# torchtitan's save list (torchtitan/models/llama3/parallelize.py) less its every-other-matmul thinning, plus
# CPU's flash attention and the matmul variants a linear lowers to.
_aten = torch.ops.aten
SAVED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten._scaled_mm.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default, _aten._scaled_dot_product_flash_attention_for_cpu.default,
})


def _policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    return create_selective_checkpoint_contexts(_policy)


def recompute_layer(layer: torch.nn.Module, mode: str, *args):
    """layer(*args) under the --activation-checkpointing `mode` ('full' or 'selective')."""
    if mode == "full":
        return checkpoint(layer, *args, use_reentrant=False)
    if mode == "selective":
        return checkpoint(layer, *args, use_reentrant=False, context_fn=partial(_selective_contexts))
    raise ValueError(f"recompute_layer: mode {mode!r} is not 'full' or 'selective'")
