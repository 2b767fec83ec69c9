"""--optimizer muon under TP 2 and DP 2 (ZeRO-1), real gloo processes, against one process and against the
independent loop of tests/engine/muon_reference.py (no engine Muon in it).

What each layout must get right: TP 2 orthogonalises the FULL logical matrices (Q, K, V, O, gate, up, down)
from the shards the TP ranks hold, a replicated KV head (kv1) taken once; DP 2 assigns whole matrices to DP
ranks, all-gathers their clipped gradients and broadcasts the new values. A layout that orthogonalised its
shards alone would change every update by O(1) (NS of a block is not a block of NS); the independent loop with
fused Q/K/V is 1e-2 away (tests/engine/test_muon.py).

Tolerances (all fp32 on CPU, NS in fp32): the layouts add the same products in another order (row-parallel
partial sums, bucketed gradient reductions), ~1e-7 relative per step, which Muon passes on as the AdamW runs
do (tests/parallel/test_tp_dp_equivalence.py): losses and grad norms rel. 1e-5 over 8 steps, logits 1e-5
against one process and 1e-4 against the independent loop (observed: <= 1e-6).
A DP 2 run resumes a one-process checkpoint (Muon's whole-matrix state re-owned by name): steps 5-8 as one
process at 1e-5; and the other way, a DP 2 checkpoint resumed on one process. Marked slow:
the 4-process TP 2 x DP 2 run, and TP 2 resuming its own checkpoint bit for bit.
"""

import pytest
import torch

from tests.engine.adamw_reference import initial_weights, reference_logits
from tests.engine.helpers import deterministic_fields, loss_lines
from tests.engine.muon_reference import train_muon_reference
from tests.once import once_per_run
from tests.parallel.test_tp_dp_equivalence import assert_trajectories, tensor_rel
from tests.parallel.launch import TINY_DP, torchrun
from tests.parallel.workers import SAVE_TO, fixed_tokens, make_config, single_run, spawn

MUON = {"optimizer": "muon"}
DP2 = {**MUON, "micro_batch_size": 2, "ddp_bucket_mb": 0.3}  # ~6 buckets: matrices straddle bucket shards


@pytest.fixture(scope="session")
@once_per_run
def single(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks: the same GEMM blocking
    try:
        return {"ref": single_run(MUON, 8), "ref_kv1": single_run({**MUON, "num_kv_heads": 1}, 6),
                "ckpt": single_run(MUON, 4, save_to=str(tmp_path_factory.mktemp("muon_ckpt")))["checkpoint"]}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
@once_per_run
def world2(tmp_path_factory, single):
    return spawn(2, [("tp2", {**MUON, "tp": 2}, 8), ("tp2_kv1", {**MUON, "tp": 2, "num_kv_heads": 1}, 6),
                     ("dp2", DP2, 8), ("dp2_from_dp1", {**DP2, "resume": single["ckpt"]}, 4),
                     ("dp2_saved", {**DP2, SAVE_TO: str(tmp_path_factory.mktemp("muon_dp2_ckpt"))}, 4)],
                 tmp_path_factory.mktemp("muon_world2"))


@pytest.fixture(scope="session")
@once_per_run
def independent(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = make_config(MUON, 1, str(tmp_path_factory.mktemp("muon_ref")))
        return reference_logits(train_muon_reference(initial_weights(cfg), cfg, 8)[0], cfg, fixed_tokens(cfg.vocab_size))
    finally:
        torch.set_num_threads(threads)


def test_tp2_orthogonalises_the_full_matrices(world2, single, independent):
    got, want = world2["tp2"], single["ref"]
    assert got["layout"] == (2, 1)
    assert_trajectories(got["steps"], want["steps"], 1e-5, "muon tp2")
    assert tensor_rel(got["logits"], want["logits"]) < 1e-5
    assert tensor_rel(got["logits"], independent) < 1e-4


def test_tp2_with_a_replicated_kv_head(world2, single):
    got, want = world2["tp2_kv1"], single["ref_kv1"]
    assert_trajectories(got["steps"], want["steps"], 1e-5, "muon tp2 kv1")
    assert tensor_rel(got["logits"], want["logits"]) < 1e-5


def test_dp2_zero1_owns_whole_matrices(world2, single, independent):
    got, want = world2["dp2"], single["ref"]
    assert got["layout"] == (1, 2) and got["buckets"] >= 4
    assert_trajectories(got["steps"], want["steps"], 1e-5, "muon dp2")
    assert tensor_rel(got["logits"], want["logits"]) < 1e-5
    assert tensor_rel(got["logits"], independent) < 1e-4


def test_dp2_resumes_a_one_process_muon_checkpoint(world2, single):
    assert_trajectories(world2["dp2_from_dp1"]["steps"], single["ref"]["steps"][4:8], 1e-5, "muon dp2 from dp1")


@pytest.mark.slow
def test_tp2_dp2_at_once(tmp_path, single, independent):
    got = spawn(4, [("tp2_dp2", {**DP2, "tp": 2}, 8)], tmp_path)["tp2_dp2"]
    assert got["layout"] == (2, 2)
    assert_trajectories(got["steps"], single["ref"]["steps"], 1e-5, "muon tp2 x dp2")
    assert tensor_rel(got["logits"], independent) < 1e-4


def test_dp2_checkpoint_resumes_on_one_process(world2):
    """DP 2 saves its Muon state at step 4 (each matrix by its owner, plain tensors by name); one process (GAS 2)
    resumes it and continues as DP 2 did: 1e-5 (observed ~1e-7, the grad-norm squares add in another order)."""
    saved = world2["dp2_saved"]
    one = single_run({**MUON, "micro_batch_size": 2, "grad_accum_steps": 2, "resume": saved["checkpoint"]}, 4)
    assert saved["steps"] == world2["dp2"]["steps"][:4]
    assert_trajectories(one["steps"], world2["dp2"]["steps"][4:8], 1e-5, "dp2 checkpoint resumed on one process")


MUON_ARGS = [*TINY_DP, "--optimizer", "muon", "--num-steps", "8", "--save-every", "4", "--global-batch-size", "4",
             "--micro-batch-size", "2"]


@pytest.mark.slow
def test_tp2_resumes_bit_for_bit(tmp_path):
    run = torchrun(2, "pretrain", *MUON_ARGS, "--tp", "2", "--run-dir", str(tmp_path / "a"))
    again = torchrun(2, "pretrain", *MUON_ARGS, "--tp", "2", "--run-dir", str(tmp_path / "b"),
                     "--resume", str(tmp_path / "a" / "checkpoints" / "step_00000004"))
    assert loss_lines(again.stdout) and [deterministic_fields(x) for x in loss_lines(again.stdout)] == \
        [deterministic_fields(x) for x in loss_lines(run.stdout)][4:]
