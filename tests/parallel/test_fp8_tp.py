"""--fp8 at TP 2 (two real gloo processes, the CPU emulation of torch._scaled_mm) against the single process, and
under --fsdp at DP 2 against ZeRO-1 (test_fp8_under_fsdp_matches_zero1).

The TP paths (column-parallel QKV with its overlapped backward, the MLP region carrying FC2's FP8 wgrad,
row-parallel O / FC2 with the chunked forward, sequence parallelism, overlap off) each scale their own shard
(engine/distributed/fp8.py: amax is local). The single process scales whole tensors, so the two runs round
some operands on different FP8 grids: the per-GEMM difference is bounded by the FP8 error itself (~0.05
relative, tests/engine/test_fp8.py), and on the tiny model's loss it is about what FP8 itself changes against
fp32. Observed (5 steps, max over steps; 2026-11-27): tensorwise TP 2 (overlap, SP, plain + row chunks) against
the single process: loss 1.2e-4 to 3.0e-4, grad norm 1.7e-3 to 2.3e-3, logits after 5 steps 1.6e-2 to 2.0e-2;
rowwise: 3.6e-6, 3.3e-5, 4.2e-3; for scale, single-process FP8 against fp32: loss 4.0e-4, grad norm 3.7e-3.
Tolerances: loss 2e-3, grad norm 1e-2, logits 5e-2. A TP path that dropped FP8 would run fp32 (TP 2 fp32 is
1e-8 from the single fp32 process); every TP run here is >= 1e-4 from fp32 in grad norm (observed >= 9e-4), so
FP8 is checked to be on in the TP paths too.
"""

import math

import pytest
import torch

from tests.once import once_per_run
from tests.parallel.workers import FSDP_PROBE, SAVE_TO, single_run, spawn

FP8 = {"fp8": "tensorwise"}
SCENARIOS = [
    ("tp2", {**FP8, "tp": 2}, 5),
    ("tp2_sp", {**FP8, "tp": 2, "sequence_parallel": True}, 5),
    ("tp2_plain", {**FP8, "tp": 2, "tp_comm_overlap": False, "tp_fwd_chunks": 2}, 5),
    # SP without fusion: the row-parallel layers' FP8 linear has no sink (before 2026-11-27: no autograd, it raised)
    ("tp2_rowwise_sp_unfused", {"fp8": "rowwise", "tp": 2, "sequence_parallel": True, "grad_accum_fusion": False}, 5),
]
# --fsdp with --fp8 (DP 2): the FP8 GEMMs on FSDP2's all-gathered weights, against ZeRO-1 at the same DP (the same
# data split and the same FP8 operands: each rank scales its own micro-batch either way).
# Tensorwise only: the recipes differ inside the linear, not in what FSDP2 gathers or reduces.
DP_SCENARIOS = [
    ("dp2_zero1", FP8, 3),
    ("dp2_fsdp", {**FP8, "fsdp": True}, 3),
    ("dp2_fsdp_off", {"fsdp": True}, 3),
]
# --fsdp-fp8-all-gather (test_fp8_all_gather_*): the same run with the weights gathered as FP8 (and saved), resumed
# without the flag and saved, resumed with it (in this order, one run dir); bf16 compute; one step of each watched.
AG = {**FP8, "fsdp": True, "fsdp_fp8_all_gather": True}
BF16_GAS2 = {"compute_dtype": "bf16", "micro_batch_size": 2, "grad_accum_steps": 2, "fsdp_prefetch": 1}


def ag_scenarios(run_dir: str) -> list:
    return [("ag_saved", {**AG, SAVE_TO: run_dir}, 3),
            ("ag_to_plain", {**FP8, "fsdp": True, "resume": "auto", SAVE_TO: run_dir}, 1),
            ("plain_to_ag", {**AG, "resume": "auto", SAVE_TO: run_dir}, 1),
            # bf16 compute: FSDP2 gathers bf16, so the cast starts from the shard rounded to bf16 (the GPU's case);
            # two micro-batches a step, the next layer's all-gather issued ahead (--fsdp-prefetch 1)
            ("dp2_fsdp_bf16", {**FP8, "fsdp": True, **BF16_GAS2}, 2), ("dp2_fsdp_ag_bf16", {**AG, **BF16_GAS2}, 2),
            ("probe_ag", {**AG, FSDP_PROBE: True}, 1)]


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.fixture(scope="session")
@once_per_run
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = {"tensorwise": single_run(FP8, 5), "rowwise": single_run({"fp8": "rowwise"}, 5),
                  "off": single_run({}, 5)}
    finally:
        torch.set_num_threads(threads)
    scenarios = SCENARIOS + DP_SCENARIOS + ag_scenarios(str(tmp_path_factory.mktemp("fp8_ag_run")))
    return single, spawn(2, scenarios, tmp_path_factory.mktemp("fp8_world2"))


@pytest.mark.parametrize("name", [s[0] for s in SCENARIOS])
def test_fp8_tp2_matches_the_single_process(runs, name):
    single, world = runs
    ref = single["rowwise" if "rowwise" in name else "tensorwise"]
    got = world[name]
    for (loss, norm), (ref_loss, ref_norm) in zip(got["steps"], ref["steps"], strict=True):
        assert math.isfinite(loss) and rel(loss, ref_loss) < 2e-3 and rel(norm, ref_norm) < 1e-2, name
    assert ((got["logits"] - ref["logits"]).norm() / ref["logits"].norm()).item() < 5e-2, name
    assert max(rel(a[1], b[1]) for a, b in zip(got["steps"], single["off"]["steps"])) > 1e-4, name  # FP8 is on


def test_fp8_under_fsdp_matches_zero1(runs):
    """--fsdp --fp8 against ZeRO-1 --fp8 at DP 2: the same sums of the same FP8 products (observed: equal to ~1e-15,
    fp32 on CPU; tolerance 1e-6, the fp32 noise of a differently ordered reduction), and FP8 is on under FSDP (the
    grad norm >= 1e-4 from --fsdp without --fp8, as the TP test's check)."""
    _, world = runs
    fsdp, zero1, off = world["dp2_fsdp"], world["dp2_zero1"], world["dp2_fsdp_off"]
    for (loss, norm), (ref_loss, ref_norm) in zip(fsdp["steps"], zero1["steps"], strict=True):
        assert rel(loss, ref_loss) < 1e-6 and rel(norm, ref_norm) < 1e-6
    assert max(rel(a[1], b[1]) for a, b in zip(fsdp["steps"], off["steps"])) > 1e-4


def test_fp8_all_gather_matches_the_bf16_gather_bit_for_bit(runs):
    """--fsdp-fp8-all-gather casts each DP rank's shard with the scale of the whole weight (the amaxes all-reduced,
    MAX: exact), so the gathered FP8 weight is the one the linear casts from the gathered weight, bit for bit: the
    same losses, grad norms and logits, exactly (no sum is reordered: only where the cast happens moves), in fp32
    and in bf16 compute (there with two micro-batches a step and explicit prefetch)."""
    _, world = runs
    ag, fsdp = world["ag_saved"], world["dp2_fsdp"]
    assert ag["steps"] == fsdp["steps"]
    for (loss, norm), (ref_loss, ref_norm) in zip(ag["steps"], world["dp2_zero1"]["steps"], strict=True):
        assert rel(loss, ref_loss) < 1e-6 and rel(norm, ref_norm) < 1e-6  # and so ZeRO-1's (see the test above)
    assert torch.equal(ag["logits0"], fsdp["logits0"]) and torch.equal(ag["logits"], fsdp["logits"])
    # bf16: the amax of the bf16-rounded weight is the rounded fp32 amax, so here too bit for bit
    ag, fsdp = world["dp2_fsdp_ag_bf16"], world["dp2_fsdp_bf16"]
    assert ag["steps"] == fsdp["steps"] and torch.equal(ag["logits"], fsdp["logits"])
    assert ag["steps"][0] != world["ag_saved"]["steps"][0]  # bf16 compute did run


def test_fp8_all_gather_sends_fp8_bytes_to_fp8_weights(runs):
    """What FSDP2 all-gathers, watched for one step: each decoder layer's all-gather (forward, and backward's
    re-gathers) sends its FP8 linears' shards at 1 byte an element and its norm gains at 4 (fp32 on CPU), as bytes
    (uint8: the dtypes are mixed), where the bf16 gather sends every element at 4; the root's (embedding, LM head)
    is unchanged; the linears compute with an Fp8Weight (the gathered FP8 copy), not a weight in the compute dtype;
    gradients are reduce-scattered in fp32 as without the flag."""
    _, world = runs
    ag = world["probe_ag"]
    assert ag["linear_types"] == ["Fp8Weight"]
    shard = ag["shard_bytes"]
    layer_bytes = (shard["fp8_linears"] // 4 + shard["others"]) // 4  # tiny: 4 decoder layers of one shape
    layers = [b for dtype, b in ag["sent"] if dtype == "torch.uint8"]
    root = [dtype for dtype, _ in ag["sent"] if dtype != "torch.uint8"]
    assert ag["forward"] == [{"all_gather": 5, "reduce_scatter": 0}] and ag["backward"][0]["all_gather"] == 3
    assert layers == [layer_bytes] * 7 and root == ["torch.float32"]
    assert ag["reduce_dtypes"] == ["torch.float32"]


def test_fp8_all_gather_scale_is_that_of_the_whole_weight(runs):
    """Each precomputed scale (one all-reduce over DP for all weights) is amax_scale of the whole (TP-local)
    weight, put together from the shards here: equal, exactly."""
    _, world = runs
    scales = world["probe_ag"]["fp8_scales"]
    assert len(scales) == 4 * 4 and all(got == want for got, want in scales)


def test_fp8_all_gather_checkpoints_resume_either_way(runs):
    """The flag changes no checkpoint (the fp32 masters, the same DCP keys): saved with it at step 3 and resumed
    without it, the weights compute the saved run's logits and step 4 follows; saved without it at step 4 and
    resumed with it (the scales taken again from the loaded masters), the logits of the run that saved, bit for
    bit."""
    _, world = runs
    saved, plain, ag = world["ag_saved"], world["ag_to_plain"], world["plain_to_ag"]
    assert torch.equal(plain["logits0"], saved["logits"]) and plain["steps"][0] != saved["steps"][-1]
    assert torch.equal(ag["logits0"], plain["logits"])


@pytest.mark.slow
def test_fp8_all_gather_pads_uneven_shards(tmp_path):
    """DP 3 (3 processes, bf16 compute): QKV's 256 rows and O's and FC2's 128 do not divide by 3, so those ranks'
    FP8 bytes are padded to FSDP2's shard rows (the last rank's shard is short) and the padding cut after the
    gather; bit for bit the bf16 gather still."""
    cfg = {**FP8, "fsdp": True, "micro_batch_size": 2, "compute_dtype": "bf16"}
    world = spawn(3, [("dp3", cfg, 2), ("dp3_ag", {**cfg, "fsdp_fp8_all_gather": True}, 2)], tmp_path)
    assert world["dp3_ag"]["layout"] == (1, 3)
    assert world["dp3_ag"]["steps"] == world["dp3"]["steps"]
    assert torch.equal(world["dp3_ag"]["logits"], world["dp3"]["logits"])
