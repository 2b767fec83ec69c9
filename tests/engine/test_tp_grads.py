"""The layers' TP gradient declarations, without processes: every element of the model counts in the grad norm on
exactly one TP rank, and the sums cover exactly the replicated parts.

The model is built on the meta device once per simulated TP rank (no process groups: the groups are only carried,
never used, by the declarations). The reference is counting: the full, unsharded model's parameter count (from the
config's shapes, independently of any shard) must equal the elements counted over all ranks. Exact integers.
"""

import pytest
import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.model import Transformer
from engine.model.layers import RMSNormWeight
from engine.model.tp_grads import TPGrads


def _rank_model(cfg, tp: int, rank: int) -> tuple[Transformer, ParallelState]:
    par = ParallelState(rank=rank, world_size=tp, tp_rank=rank, tp_size=tp, dp_rank=0, dp_size=1,
                        device=torch.device("meta"))
    with torch.device("meta"):
        return Transformer(cfg, par, None, "meta", torch.float32), par


def _full_param_count(cfg) -> int:
    """Unsharded parameters from the config alone (padded vocabulary: embedding and LM head)."""
    h, d, layers = cfg.hidden_size, cfg.head_dim, cfg.num_layers
    attn = (cfg.num_heads + 2 * cfg.num_kv_heads) * d * h + h * cfg.num_heads * d
    mlp = 2 * cfg.ffn_hidden_size * h + h * cfg.ffn_hidden_size
    return 2 * cfg.padded_vocab_size * h + layers * (attn + mlp + 2 * h) + h


@pytest.mark.parametrize("tp,kv_heads,sp", [(1, 2, False), (2, 2, False), (2, 2, True), (4, 2, False), (2, 1, True)])
def test_every_element_counts_once_and_sums_cover_the_replicas(tp, kv_heads, sp):
    cfg = resolve(build_config({"preset": "tiny", "tp": tp, "num_kv_heads": kv_heads, "sequence_parallel": sp}), tp)
    counted = 0
    for rank in range(tp):
        model, par = _rank_model(cfg, tp, rank)
        grads = model.tp_grads()
        assert isinstance(grads, TPGrads)
        counted += sum(s.stop - s.start for p in model.parameters() for s in grads.counted(p, 0, p.numel()))
        norm_gains = [m.weight for m in model.modules() if isinstance(m, RMSNormWeight)]
        summed = {id(s.param): (s.lo, s.hi) for s in grads.sums}
        # sequence parallelism: each norm gain's gradient is a partial sum over tokens, summed whole over TP
        for w in norm_gains:
            assert (summed.get(id(w)) == (0, w.numel())) == (sp and tp > 1)
        # more TP ranks than KV heads: the K/V rows of QKV are summed over the ranks sharing the head
        replicas = tp // kv_heads if tp > kv_heads else 1
        for layer in model.layers:
            rows = layer.attn.kv_rows
            expected = (rows[0] * cfg.hidden_size, rows[1] * cfg.hidden_size) if replicas > 1 else None
            assert summed.get(id(layer.attn.qkv)) == expected
    assert counted == _full_param_count(cfg)


def test_a_parameter_no_layer_declares_counts_whole_on_every_rank():
    grads = TPGrads(tp_rank=1)
    p = torch.nn.Parameter(torch.zeros(6))
    assert grads.counted(p, 2, 5) == [slice(0, 3)]
