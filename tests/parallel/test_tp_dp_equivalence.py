"""TP = 2 and DP = 2 (two real gloo processes) against the single-process engine, same init and data.

All runs are fp32 on CPU, tiny preset, seq 64, global batch 4 samples. The parallel layouts compute
the same sums in another order (row-parallel partial sums, split grad-norm squares), so they agree
to float32 rounding, which Adam can amplify a little over the STEPS (10) steps of the long runs:
- logits from the same init and after 10 steps: rel. 1e-5 (observed 2e-7; 2e-7 after 20 steps too);
- 10-step losses: rel. 1e-5 (observed <= 1e-7; over 20 steps <= 2e-7); grad norms the same (over 20 steps
  <= 6e-7); the grad norm is the sharp check that TP-replicated weights (norm gains, replicated K/V rows) count once:
  double counting the norm gains or a K/V head changes it by percents;
- DP = 2 x GAS 1 against DP = 1 x GAS 2: 1e-6 (the fp32 sum of two micro-batch gradients is the
  same two numbers added in either order; observed: losses equal bit for bit, grad norms 1e-7,
  whose squares are summed per rank first);
- overlap on / off: the same collectives on the same numbers, bit for bit; so is the forward's row-chunked
  GEMM + all-reduce (--tp-fwd-chunks; each row the same dot products, fp32 on one thread per rank).
- gradient-accumulation fusion on / off (TP 2, 5 steps): 1e-5, as a layout change (fp32 sums of the same
  products in another kernel).
- validation loss (12 fixed samples, whatever the layout): at step 0 (the same weights bit for bit) mbs 4,
  mbs 2 x GAS 2, DP 2 and TP 2 agree to rel. 1e-6 (fp32 sums inside each micro-batch's loss, grouped
  differently); after 10 steps to 1e-5, as the losses (observed 5e-8).
- muP learning rates (tiny: hidden matrices at lr / 4) against an independent loop (the judge's plain
  forward + torch.optim.AdamW with explicit param groups, tests/engine/adamw_reference.py): logits of a
  fixed batch after 10 steps at rel. 1e-4 (observed 1.2e-7); the same loop with one lr for every
  tensor is >= 1e-2 away (observed 0.14; 0.27 after 20 steps), so a ZeRO-1 shard that applies a wrong multiplier
  to any range shows.
"""

import math

import pytest
import torch

from tests.engine.adamw_reference import initial_weights, reference_logits, train_reference
from tests.once import once_per_run
from tests.parallel.workers import fixed_tokens, make_config, single_run, spawn

TP2 = {"tp": 2}
STEPS = 10  # the long trajectories (the module docstring says what was observed over them)
SCENARIOS = [
    ("tp2", TP2, STEPS),
    ("tp2_sp", {"tp": 2, "sequence_parallel": True}, STEPS),
    ("tp2_no_overlap", {"tp": 2, "tp_comm_overlap": False}, 5),
    ("tp2_fwd_chunks", {"tp": 2, "tp_fwd_chunks": 3}, 5),  # 3 row chunks of the 256 rows: uneven (85, 85, 86)
    ("tp2_fwd_chunks_plain", {"tp": 2, "tp_fwd_chunks": 2, "tp_comm_overlap": False, "grad_accum_fusion": False}, 5),
    ("tp2_kv1", {"tp": 2, "num_kv_heads": 1}, 10),  # one KV head replicated on both TP ranks
    ("tp2_unfused", {"tp": 2, "grad_accum_fusion": False}, 5),  # weight gradients through param.grad + add
    ("dp2", {"micro_batch_size": 2, "ddp_bucket_mb": 0.3}, STEPS),  # ~6 buckets
    ("dp2_no_overlap", {"micro_batch_size": 2, "ddp_bucket_mb": 0.3, "overlap_grad_reduce": False,
                        "overlap_param_gather": False}, 5),
]


GAS2 = {"micro_batch_size": 2, "grad_accum_steps": 2}


# The runs below are session-scoped (tests/conftest.py says why): module-scoped, a clean run trained them three times.
@pytest.fixture(scope="session")
@once_per_run
def single(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks: the same GEMM blocking
    try:
        return {
            "ref": single_run({}, STEPS),
            "ref_kv1": single_run({"num_kv_heads": 1}, 10),
            "ref_gas2": single_run(GAS2, STEPS),
            # a single-process checkpoint after 4 steps, for DP 2 to resume (plain tensors -> ZeRO shards)
            "ckpt_gas2": single_run(GAS2, 4, save_to=str(tmp_path_factory.mktemp("single_ckpt")))["checkpoint"],
        }
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
@once_per_run
def world2(tmp_path_factory, single):
    resume = ("dp2_from_dp1", {"micro_batch_size": 2, "ddp_bucket_mb": 0.3, "resume": single["ckpt_gas2"]}, 4)
    return spawn(2, SCENARIOS + [resume], tmp_path_factory.mktemp("world2"))


def adamw_reference(overrides: dict, steps: int, tmp: str) -> dict[str, torch.Tensor]:
    """Logits of the fixed batch after `steps` steps of the independent loop, with muP lrs and with
    one lr for all tensors (the global batch of BASE: 4 samples)."""
    cfg = make_config(overrides, 1, tmp)
    init = initial_weights(cfg)
    tokens = fixed_tokens(cfg.vocab_size)
    return {kind: reference_logits(train_reference(init, cfg, steps, mup_lr=kind == "mup")[0], cfg, tokens)
            for kind in ("mup", "uniform")}


def assert_matches_adamw_reference(logits: torch.Tensor, ref: dict[str, torch.Tensor], what: str) -> None:
    assert tensor_rel(logits, ref["mup"]) < 1e-4, f"{what}: {tensor_rel(logits, ref['mup'])}"
    assert tensor_rel(logits, ref["uniform"]) > 1e-2, what


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def tensor_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def assert_trajectories(got, want, tol: float, what: str) -> None:
    assert len(got) <= len(want)
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(got, want), start=1):
        assert math.isfinite(loss) and rel(loss, ref_loss) < tol, f"{what} step {step}: loss {loss} vs {ref_loss}"
        assert rel(norm, ref_norm) < tol, f"{what} step {step}: grad norm {norm} vs {ref_norm}"


def test_tp2_logits_match_single_process(world2, single):
    assert world2["tp2"]["layout"] == (2, 1)
    assert tensor_rel(world2["tp2"]["logits0"], single["ref"]["logits0"]) < 1e-5
    assert tensor_rel(world2["tp2"]["logits"], single["ref"]["logits"]) < 1e-5


def test_tp2_trajectory_matches_single_process(world2, single):
    assert_trajectories(world2["tp2"]["steps"], single["ref"]["steps"], 1e-5, "tp2")
    first, last = single["ref"]["steps"][0][0], single["ref"]["steps"][-1][0]
    assert last < first - 1.0  # it trains


def test_sequence_parallel_matches_single_process(world2, single):
    assert tensor_rel(world2["tp2_sp"]["logits0"], single["ref"]["logits0"]) < 1e-5
    assert_trajectories(world2["tp2_sp"]["steps"], single["ref"]["steps"], 1e-5, "tp2 + sequence parallel")
    # the norm-gain sums ran from backward hooks, once per step (one bucket at the default size)
    assert world2["tp2_sp"]["launched_by_backward"] == [1] * STEPS


def test_replicated_kv_heads_match_single_process(world2, single):
    """num_kv_heads 1 at TP 2: both ranks hold the KV head; its gradient is summed over them and
    counted once in the grad norm."""
    got, want = world2["tp2_kv1"], single["ref_kv1"]
    assert tensor_rel(got["logits0"], want["logits0"]) < 1e-5
    assert_trajectories(got["steps"], want["steps"], 1e-5, "tp2 kv1")
    assert tensor_rel(got["logits"], want["logits"]) < 1e-5


def test_tp_comm_overlap_is_the_same_math(world2):
    assert world2["tp2_no_overlap"]["steps"] == world2["tp2"]["steps"][:5]


def test_row_chunked_forward_all_reduces_are_the_same_math(world2):
    """--tp-fwd-chunks: O's and FC2's GEMMs in row chunks, each all-reduced as it is computed. Every output row is the
    same dot products as in one GEMM, summed over the same two ranks: bit for bit the same losses and grad norms,
    with the backward overlap and fusion (the default path's weight-gradient sinks) and without either."""
    assert world2["tp2_fwd_chunks"]["steps"] == world2["tp2"]["steps"][:5]
    assert world2["tp2_fwd_chunks_plain"]["steps"] == world2["tp2_unfused"]["steps"][:5]


def test_gradient_accumulation_fusion_is_the_same_math(world2, single):
    """Fused (the default: QKV, O, FC2 and embedding gradients added straight into the fp32 buffer by the column-
    parallel linear, the MLP region and the vocab-parallel embedding) against unfused at TP 2, and unfused TP 2
    against the fused single process: fp32 sums of the same products, 1e-5 as any layout change."""
    assert_trajectories(world2["tp2_unfused"]["steps"], world2["tp2"]["steps"], 1e-5, "tp2 unfused vs fused")
    assert_trajectories(world2["tp2_unfused"]["steps"], single["ref"]["steps"], 1e-5, "tp2 unfused vs one process")


def test_dp2_equals_gas2(world2, single):
    assert world2["dp2"]["layout"] == (1, 2)
    assert_trajectories(world2["dp2"]["steps"], single["ref_gas2"]["steps"], 1e-6, "dp2 vs gas2")
    assert_trajectories(world2["dp2"]["steps"], single["ref"]["steps"], 1e-5, "dp2 vs mbs 4")


def test_dp_overlap_launches_from_backward_and_gathers_behind_the_forward(world2):
    on, off = world2["dp2"], world2["dp2_no_overlap"]
    assert on["buckets"] >= 4
    # every bucket's reduce-scatter was launched by backward itself, none left for finish()
    assert on["launched_by_backward"] == [on["buckets"]] * STEPS
    # after each step every bucket's all-gather is still in flight: the next forward waits for them
    assert on["gathers_in_flight_after_step"] == [on["buckets"]] * STEPS
    assert off["launched_by_backward"] == [0] * 5 and off["gathers_in_flight_after_step"] == [0] * 5
    assert off["steps"] == on["steps"][:5]


def test_dp2_resumes_a_single_process_checkpoint(world2, single):
    """Plain per-parameter tensors saved by one process, loaded as DP 2's ZeRO-1 shards: steps 5-8
    continue the one-process run (1e-6, as DP 2 vs GAS 2)."""
    assert_trajectories(world2["dp2_from_dp1"]["steps"], single["ref_gas2"]["steps"][4:8], 1e-6, "dp2 from a dp1 checkpoint")


@pytest.fixture(scope="session")
@once_per_run
def adamw_ref(tmp_path_factory):
    return adamw_reference({}, STEPS, str(tmp_path_factory.mktemp("adamw_ref")))


def test_mup_lrs_at_tp2_and_zero1_dp2_match_torch_adamw(world2, single, adamw_ref):
    """The muP multipliers at TP 2 (sharded hidden matrices) and DP 2 with ZeRO-1 over ~6 buckets (shards
    cut parameters at arbitrary element ranges) against torch.optim.AdamW with explicit param groups."""
    assert_matches_adamw_reference(single["ref"]["logits"], adamw_ref, "one process")
    assert_matches_adamw_reference(world2["tp2"]["logits"], adamw_ref, "tp2")
    assert_matches_adamw_reference(world2["dp2"]["logits"], adamw_ref, "dp2 zero-1")


def test_validation_loss_is_the_same_whatever_the_layout(world2, single):
    """Evaluation reads --eval-samples samples whatever mbs, GAS, DP and TP are (it used to read
    eval_steps x mbs x DP samples, so mbs 2 x GAS 2 and mbs 4 reported different val_loss)."""
    runs = {"mbs 4": single["ref"], "mbs 2 x GAS 2": single["ref_gas2"], "dp2 (mbs 2)": world2["dp2"],
            "tp2 (mbs 4)": world2["tp2"]}
    want0, want = single["ref"]["val0"], single["ref"]["val"]
    assert math.isfinite(want0) and want < want0 - 0.5  # evaluated, and it trained
    for what, run in runs.items():
        assert rel(run["val0"], want0) < 1e-6, f"{what}: step-0 val_loss {run['val0']} vs {want0}"
        assert rel(run["val"], want) < 1e-5, f"{what}: step-{STEPS} val_loss {run['val']} vs {want}"
