"""Four gloo processes: TP = 4 with KV heads replicated in pairs, and TP = 2 x DP = 2 with sequence
parallelism and one KV head, against one process. Tolerances and reasons as in
test_tp_dp_equivalence.py (rel. 1e-5 for logits, losses and grad norms). And --fsdp --fp8 tensorwise at TP 2 x DP 2
with and without --fsdp-fp8-all-gather: bit for bit.

TP = 4 over the tiny preset's 2 KV heads: ranks {0, 1} hold KV head 0 and {2, 3} head 1 (two KV
groups inside one TP group); each rank has one query head. TP 2 x DP 2 with one KV head: the KV
groups are the two TP groups, the norm-gain sums of sequence parallelism and the KV sums run from
the same backward hooks as the DP reduce-scatters.
"""

import pytest
import torch

from tests.once import once_per_run
from tests.parallel.test_tp_dp_equivalence import (adamw_reference, assert_matches_adamw_reference, assert_trajectories,
                                                   tensor_rel)
from tests.parallel.workers import single_run, spawn

FSDP_FP8 = {"tp": 2, "fsdp": True, "fp8": "tensorwise"}
SCENARIOS = [
    ("tp2_dp2_fsdp_fp8", FSDP_FP8, 1),
    ("tp2_dp2_fsdp_fp8_ag", {**FSDP_FP8, "fsdp_fp8_all_gather": True}, 1),
    ("tp4", {"tp": 4}, 10),
    ("tp2_dp2_sp_kv1", {"tp": 2, "sequence_parallel": True, "num_kv_heads": 1, "micro_batch_size": 2,
                        "ddp_bucket_mb": 0.3}, 10),
]


@pytest.fixture(scope="session")
@once_per_run
def world4(tmp_path_factory):
    return spawn(4, SCENARIOS, tmp_path_factory.mktemp("world4"))


@pytest.fixture(scope="session")
@once_per_run
def single(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {"ref": single_run({}, 10), "ref_kv1": single_run({"num_kv_heads": 1}, 10)}
    finally:
        torch.set_num_threads(threads)


def test_fp8_all_gather_at_tp2_dp2(world4):
    """--fsdp-fp8-all-gather on the 2-D mesh: each TP rank's weight is its own (TP-local) tensor, sharded over its DP
    group, and its scale the amax over that DP group: the scale each TP rank's linear takes of its gathered weight
    without the flag, so the run is that one bit for bit (column- and row-parallel linears, the MLP region's
    alias of FC2's weight)."""
    got, want = world4["tp2_dp2_fsdp_fp8_ag"], world4["tp2_dp2_fsdp_fp8"]
    assert got["layout"] == want["layout"] == (2, 2)
    assert got["steps"] == want["steps"] and torch.equal(got["logits"], want["logits"])


def test_tp4_with_kv_heads_replicated_in_pairs(world4, single):
    got = world4["tp4"]
    assert got["layout"] == (4, 1)
    assert tensor_rel(got["logits0"], single["ref"]["logits0"]) < 1e-5
    assert_trajectories(got["steps"], single["ref"]["steps"], 1e-5, "tp4")
    assert tensor_rel(got["logits"], single["ref"]["logits"]) < 1e-5


def test_tp2_dp2_sequence_parallel_one_kv_head(world4, single):
    got = world4["tp2_dp2_sp_kv1"]
    assert got["layout"] == (2, 2)
    assert_trajectories(got["steps"], single["ref_kv1"]["steps"], 1e-5, "tp2 x dp2 + sp, kv1")
    assert tensor_rel(got["logits"], single["ref_kv1"]["logits"]) < 1e-5
    assert got["launched_by_backward"] == [got["buckets"]] * 10


def test_mup_lrs_at_tp2_dp2_zero1_match_torch_adamw(world4, tmp_path):
    """TP 2 x DP 2 with ZeRO-1 (and SP, one KV head) against torch.optim.AdamW with explicit muP param groups
    (tolerances: test_tp_dp_equivalence.py)."""
    ref = adamw_reference({"num_kv_heads": 1}, 10, str(tmp_path))
    assert_matches_adamw_reference(world4["tp2_dp2_sp_kv1"]["logits"], ref, "tp2 x dp2 zero-1")


def test_groups_are_megatron_placement(world4):
    """TP groups consecutive ranks, DP groups strided, KV groups consecutive blocks inside a TP group."""
    tp4 = {r["rank"]: r for r in world4["tp4"]["placement"]}
    assert all(r["tp"] == [0, 1, 2, 3] and r["dp"] == [r["rank"]] and r["backend"] == "gloo" for r in tp4.values())
    assert [tp4[r]["kv"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    mixed = {r["rank"]: r for r in world4["tp2_dp2_sp_kv1"]["placement"]}
    assert [(mixed[r]["tp_rank"], mixed[r]["dp_rank"]) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert [mixed[r]["tp"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [mixed[r]["dp"] for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [mixed[r]["kv"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
