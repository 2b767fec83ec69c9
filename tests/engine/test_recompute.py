"""--activation-checkpointing {none, selective, full} (engine/model/recompute.py): the same numbers, less kept.

Recompute runs the same forward on the same inputs, so in fp32 on CPU the loss and every gradient equal those of
`none` bit for bit (the ops run in the same order with the same operands; a tolerance would hide a layer recomputed
with other inputs). What tells the modes apart is what backward runs again, counted at torch's dispatcher:
- full re-runs the layer's forward up to the last tensor backward needs (torch stops a recompute early): QKV, O
  and FC1 and attention, 3 matmuls per layer (FC2 is last and its output is kept by nothing);
- selective keeps the matmul and attention outputs (torchtitan's SAC policy) and re-runs none of them, while it
  still recomputes the elementwise ops (RMSNorm's, RoPE's, SwiGLU's), so it is not `none` either.
"""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.model import build_model
from engine.ops import resolve_ops

CPU = torch.device("cpu")


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _run(mode: str, preset: str):
    cfg = resolve(build_config({"preset": preset, "device": "cpu", "compute_dtype": "fp32", "seq_length": 32,
                                "activation_checkpointing": mode}))
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    tokens = torch.randint(0, cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(3))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    counter = _Count()
    with counter:
        loss.backward()
    return cfg, loss.detach(), {n: p.grad for n, p in model.named_parameters()}, counter.ops


@pytest.mark.parametrize("preset", ["tiny", "llama-tiny"])
def test_selective_and_full_recompute_give_the_same_loss_and_gradients(preset):
    cfg, loss, grads, ops = _run("none", preset)
    layers = cfg.num_layers
    for mode in ("selective", "full"):
        _, other_loss, other_grads, other_ops = _run(mode, preset)
        assert torch.equal(other_loss, loss), mode
        for name, grad in grads.items():
            assert torch.equal(other_grads[name], grad), (mode, name)
        matmuls = other_ops["mm"] + other_ops["addmm"] - ops["mm"] - ops["addmm"]
        attention = sum(n for op, n in other_ops.items() if op.startswith("_scaled_dot_product") and "backward" not in op)
        if mode == "full":
            assert matmuls == 3 * layers and attention == layers, (mode, other_ops - ops)
        else:  # selective: no matmul or attention again, but the cheap ops are recomputed
            assert matmuls == 0 and attention == 0, (mode, other_ops - ops)
            assert sum((other_ops - ops).values()) > 0, "selective recomputed nothing: it is 'none'"


def test_the_former_boolean_form_is_refused_with_the_new_values():
    with pytest.raises(ConfigError, match="write 'full'"):
        build_config({"activation_checkpointing": True})
    with pytest.raises(ConfigError, match="is not a valid choice"):
        resolve(build_config({"activation_checkpointing": "some"}))
