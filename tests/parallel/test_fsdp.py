"""--fsdp (FSDP2 over each TP rank's shards, engine/sharding/fsdp.py) against ZeRO-1 and one process.

All runs fp32 on CPU (gloo), tiny preset, seq 64, global batch 4. What differs from the references is the
order of fp32 sums: FSDP2 reduce-scatters each micro-batch's gradients and sums them into the sharded
gradient (ZeRO-1 and one process accumulate first, then reduce), and the grad-norm squares are summed per
shard. So:
- TP 1 x DP 2 --fsdp against mbs 2 x GAS 2 in one process (the same two micro-batch gradients): 1e-6
  relative per step (observed: bit for bit on the losses, 3e-10 on the grad norms); against ZeRO-1 DP 2 the same;
- TP 2 x DP 2 (torchrun, 4 processes) against one process: 1e-5, as every TP layout (row-parallel partial sums);
- resume with --fsdp on the same layout: bit for bit (the sharded fp32 parameters are the masters, and
  they, AdamW's moments and step, the data position and every rank's RNG state are restored);
- a checkpoint of another mode or DP size (ZeRO-1 DP 1 -> --fsdp DP 2, --fsdp DP 2 -> ZeRO-1 DP 1): the
  continued trajectory within the same tolerances as the mode change itself (1e-6 at TP 1, 1e-5 at TP 2).
The speed knobs (--fsdp-reshard-after-forward, --fsdp-grad-sync, --fsdp-prefetch) change when FSDP2 communicates,
not what is summed: each is held to the same tolerances (--fsdp-grad-sync step sums the micro-batches before the
reduce-scatter, as ZeRO-1 and one process do), and a probe counts the collectives each one must save.
--fsdp-reduce-dtype bf16 does change the sum (bf16 gradients on the wire): within bf16 rounding, 1e-3.
"""

import json

import pytest
import torch

from tests.engine.helpers import check_rejected, deterministic_fields, loss_lines, run_engine_batch
from tests.once import once_per_run
from tests.parallel.launch import torchrun
from tests.parallel.test_tp_dp_equivalence import assert_trajectories, tensor_rel
from tests.parallel.workers import FSDP_PROBE, single_run, spawn

GAS2 = {"micro_batch_size": 2, "grad_accum_steps": 2}
DP2 = {"micro_batch_size": 2}
DP2_GAS2 = {"micro_batch_size": 1, "grad_accum_steps": 2, "fsdp": True}  # the same 4 samples a step as GAS2
# every speed knob away from its default (tiny has 4 decoder layers)
TUNED = {"fsdp_reshard_after_forward": "never", "fsdp_grad_sync": "step", "fsdp_prefetch": 2}
# each fp32-exact knob alone (prefetch with `always`, so that backward gathers too)
KNOBS = {"always": {"fsdp_reshard_after_forward": "always"}, "never": {"fsdp_reshard_after_forward": "never"},
         "step": {"fsdp_grad_sync": "step"}, "prefetch2": {"fsdp_reshard_after_forward": "always", "fsdp_prefetch": 2}}
# what the probe watches (default run: the three of TUNED at once, each effect seen apart)
PROBES = {"default": {}, "always": KNOBS["always"], "tuned": TUNED, "bf16": {"fsdp_reduce_dtype": "bf16"}}


@pytest.fixture(scope="session")
@once_per_run
def one_process(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks
    try:
        three = single_run(GAS2, 3, save_to=str(tmp_path_factory.mktemp("one_ckpt")))
        return {"gas2": single_run(GAS2, 6), "three": three, "ckpt": three["checkpoint"]}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
@once_per_run
def fsdp_dp2(tmp_path_factory, one_process):
    scenarios = [("fsdp", {**DP2, "fsdp": True}, 3),
                 ("fsdp_from_one", {**DP2, "fsdp": True, "resume": one_process["ckpt"]}, 3),
                 ("tuned", {**DP2_GAS2, **TUNED}, 3), ("bf16", {**DP2_GAS2, "fsdp_reduce_dtype": "bf16"}, 3)]
    scenarios += [(f"probe_{name}", {**DP2_GAS2, **knobs, FSDP_PROBE: True}, 1) for name, knobs in PROBES.items()]
    return spawn(2, scenarios, tmp_path_factory.mktemp("fsdp_dp2"))


def test_fsdp_dp2_matches_one_process(fsdp_dp2, one_process):
    got, want = fsdp_dp2["fsdp"], one_process["gas2"]
    assert got["layout"] == (1, 2)
    assert tensor_rel(got["logits0"], want["logits0"]) == 0.0  # the same init, gathered for the forward
    assert_trajectories(got["steps"], want["steps"][:3], 1e-6, "fsdp dp2 vs gas2")
    assert tensor_rel(got["logits"], one_process["three"]["logits"]) < 1e-5


def test_fsdp_dp2_resumes_a_one_process_zero1_checkpoint(fsdp_dp2, one_process):
    """Plain per-parameter tensors of one process, loaded as FSDP2's row shards: steps 4-6 continue that run."""
    assert_trajectories(fsdp_dp2["fsdp_from_one"]["steps"], one_process["gas2"]["steps"][3:6], 1e-6,
                        "fsdp dp2 from a dp1 checkpoint")


def test_fsdp_speed_knobs_match_one_process(fsdp_dp2, one_process):
    """All three knobs at once, DP 2 x GAS 2: one all-gather a step, one reduce-scatter, two layers prefetched."""
    assert_trajectories(fsdp_dp2["tuned"]["steps"], one_process["gas2"]["steps"][:3], 1e-6, "fsdp tuned vs gas2")
    assert tensor_rel(fsdp_dp2["tuned"]["logits"], one_process["three"]["logits"]) < 1e-5


def test_fsdp_bf16_reduce_stays_within_bf16_rounding(fsdp_dp2, one_process):
    """--fsdp-reduce-dtype bf16 rounds each rank's micro-batch gradient to bf16 (2^-9 relative) before the sum; over
    3 steps the losses and grad norms stay within 1e-3 of fp32's (observed <= 1e-4: the roundings average out)."""
    assert_trajectories(fsdp_dp2["bf16"]["steps"], one_process["gas2"]["steps"][:3], 1e-3, "fsdp bf16 reduce vs gas2")
    assert fsdp_dp2["probe_bf16"]["reduce_dtypes"] == ["torch.bfloat16"]
    assert fsdp_dp2["probe_default"]["reduce_dtypes"] == ["torch.float32"]


def test_fsdp_speed_knobs_change_what_fsdp2_communicates(fsdp_dp2):
    """One step of two micro-batches, 4 decoder layers + the root (5 FSDP groups): all-gathers and reduce-scatters
    per forward / backward, which layers are sharded (True) after each, and the sharded gradients' presence."""
    probe = {name: fsdp_dp2[f"probe_{name}"] for name in PROBES}
    sharded, four = [True] * 4, [False] * 4
    for name, run in probe.items():  # whatever the knobs: a layer computes on gathered (plain) weights
        assert all(not own for forward in run["at_forward"] for _, own in forward), name
    # default: every layer but the last resharded after forward (3 gathered again in backward), every micro-batch
    # reduce-scattered (5 groups); the root is never resharded after forward
    d = probe["default"]
    assert d["forward"] == [{"all_gather": 5, "reduce_scatter": 0}] * 2
    assert d["backward"] == [{"all_gather": 3, "reduce_scatter": 5}] * 2
    assert d["after_forward"] == [[True, True, True, False]] * 2 and d["after_backward"] == [sharded] * 2
    assert d["grads"] == [True, True]
    assert probe["always"]["backward"] == [{"all_gather": 4, "reduce_scatter": 5}] * 2
    assert probe["always"]["after_forward"] == [sharded] * 2
    # tuned = never + step + prefetch 2, each seen apart:
    # never: gathered once a step, kept through the first backward and the second micro-batch, resharded at the end
    t = probe["tuned"]
    assert [f["all_gather"] for f in t["forward"]] == [5, 0] and [b["all_gather"] for b in t["backward"]] == [0, 0]
    assert t["after_forward"] == [four, four] and t["after_backward"] == [four, sharded]
    # step: no reduce-scatter (and no sharded gradient) until the last micro-batch
    assert [b["reduce_scatter"] for b in t["backward"]] == [0, 5] and t["grads"] == [False, True]
    # prefetch 2: when layer i starts, the all-gathers of layers i + 1 and i + 2 are issued already (the root's
    # forward prefetches layers 0 and 1); FSDP2's implicit prefetch issues only layer i's own by then
    assert [n for n, _ in probe["always"]["at_forward"][0]] == [2, 3, 4, 5]
    assert [n for n, _ in t["at_forward"][0]] == [4, 5, 5, 5]


@pytest.mark.slow
def test_fsdp_matches_zero1_at_dp2(tmp_path):
    """ZeRO-1 and --fsdp on the same two ranks (TP 1 x DP 2), with two KV heads and with one; TP 2 with the TP
    gradient sums (a replicated KV head, SP norm gains) is the TP 2 x DP 2 launch below."""
    zero_gas2 = {k: v for k, v in DP2_GAS2.items() if k != "fsdp"}
    runs = spawn(2, [("zero", DP2, 5), ("fsdp", {**DP2, "fsdp": True}, 5),
                     ("zero_kv1", {**DP2, "num_kv_heads": 1}, 3), ("fsdp_kv1", {**DP2, "num_kv_heads": 1, "fsdp": True}, 3),
                     ("zero_gas2", zero_gas2, 3)] + [(name, {**DP2_GAS2, **knob}, 3) for name, knob in KNOBS.items()],
                 tmp_path)
    assert_trajectories(runs["fsdp"]["steps"], runs["zero"]["steps"], 1e-6, "fsdp vs zero-1")
    assert tensor_rel(runs["fsdp"]["logits"], runs["zero"]["logits"]) < 1e-5
    assert_trajectories(runs["fsdp_kv1"]["steps"], runs["zero_kv1"]["steps"], 1e-6, "fsdp vs zero-1, one KV head")
    for name in KNOBS:  # each fp32-exact speed knob alone at GAS 2
        assert_trajectories(runs[name]["steps"], runs["zero_gas2"]["steps"], 1e-6, f"fsdp {name} vs zero-1")


# TP 2 x DP 2 through torchrun: 8 steps, checkpoints at 4 and 8, global batch 4 = 2 micro-batches of 1 per DP rank
TINY = ["--preset", "tiny", "--device", "cpu", "--seq-length", "64", "--eval-samples", "0", "--warmup-steps", "2"]
STEPS = ["--num-steps", "8", "--save-every", "4", "--keep-last", "5"]
TP2DP2 = ["--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2"]


# FSDP2's defaults, and every speed knob away from its default (TUNED as flags)
FSDP_FLAGS = {"default": ["--fsdp"], "tuned": ["--fsdp", "--fsdp-reshard-after-forward", "never", "--fsdp-grad-sync",
                                               "step", "--fsdp-prefetch", "2"]}


@pytest.fixture(scope="session", params=sorted(FSDP_FLAGS))
def fsdp_tp2dp2(request, tmp_path_factory):
    """(run dir, [LOSS] fields, stdout, the --fsdp flags) of an 8-step TP 2 x DP 2 run, with and without the knobs."""
    flags = FSDP_FLAGS[request.param]
    run_dir = tmp_path_factory.mktemp(f"fsdp_tp2dp2_{request.param}")
    proc = torchrun(4, "pretrain", *TINY, *STEPS, *TP2DP2, *flags, "--sequence-parallel", "--num-kv-heads", "1",
                    "--run-dir", str(run_dir))
    return run_dir, [deterministic_fields(x) for x in loss_lines(proc.stdout)], proc.stdout, flags


@pytest.fixture(scope="session")
@once_per_run
def one_tp2_reference(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return single_run({"micro_batch_size": 2, "grad_accum_steps": 2, "num_steps": 8, "num_kv_heads": 1,
                           "eval_samples": 0}, 8)
    finally:
        torch.set_num_threads(threads)


def _rel(a: str, b: float) -> float:
    return abs(float(a) - b) / abs(b)


@pytest.mark.slow
def test_fsdp_tp2_dp2_matches_one_process(fsdp_tp2dp2, one_tp2_reference):
    """Sequence parallelism and one KV head on both TP ranks: the TP gradient sums run on FSDP2's shards."""
    _, lines, stdout, flags = fsdp_tp2dp2
    assert "layout launcher=torchrun world=4 tp=2 dp=2" in stdout and '"fsdp": true' in stdout
    assert ('"fsdp_grad_sync": "step"' in stdout) == ("step" in flags)
    assert [x[0] for x in lines] == [str(i) for i in range(1, 9)]
    for (step, loss, norm, *_), (ref_loss, ref_norm) in zip(lines, one_tp2_reference["steps"]):
        assert _rel(loss, ref_loss) < 1e-5 and _rel(norm, ref_norm) < 1e-5, (step, loss, norm, ref_loss, ref_norm)


@pytest.mark.slow
def test_fsdp_resume_is_bitwise(fsdp_tp2dp2, tmp_path):
    run_dir, lines, _, flags = fsdp_tp2dp2
    ckpt = run_dir / "checkpoints" / "step_00000004"
    assert json.loads((ckpt / "meta.json").read_text())["layout"] == {"tp": 2, "dp": 2}
    proc = torchrun(4, "pretrain", *TINY, *STEPS, *TP2DP2, *flags, "--sequence-parallel", "--num-kv-heads", "1",
                    "--resume", str(ckpt), "--run-dir", str(tmp_path / "resumed"))
    assert [deterministic_fields(x) for x in loss_lines(proc.stdout)] == lines[4:]


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_under_zero1_on_one_dp_rank(fsdp_tp2dp2, tmp_path):
    """--fsdp TP 2 x DP 2 -> ZeRO-1 TP 2 x DP 1 (GAS 4 keeps the global batch): DCP reshards the row pieces."""
    run_dir, lines, _, _ = fsdp_tp2dp2
    proc = torchrun(2, "pretrain", *TINY, *STEPS, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "4",
                    "--sequence-parallel", "--num-kv-heads", "1", "--resume",
                    str(run_dir / "checkpoints" / "step_00000004"), "--run-dir", str(tmp_path / "zero1"))
    resumed = [deterministic_fields(x) for x in loss_lines(proc.stdout)]
    assert [x[0] for x in resumed] == ["5", "6", "7", "8"]
    for got, want in zip(resumed, lines[4:]):
        assert _rel(got[1], float(want[1])) < 1e-5 and _rel(got[2], float(want[2])) < 1e-5, (got, want)


def test_fsdp_bad_input_is_one_line_and_writes_nothing(tmp_path):
    """Each refusal is `python -m engine pretrain ...` as the CLI runs it, all in one process (tests/engine/engine_batch.py:
    torch is imported once, not once per refusal)."""
    cases = [
        (["--fsdp"], "--fsdp=True has no data-parallel ranks to shard over (world size 1, --tp 1: DP 1)"),
        (["--fsdp", "--ddp-bucket-mb", "40"], "--ddp-bucket-mb=40.0 configures the ZeRO-1 distributed optimizer"),
        (["--fsdp", "--no-overlap-param-gather"], "--overlap-param-gather=False configures the ZeRO-1"),
        (["--fsdp", "--optimizer", "muon"], "--optimizer='muon' is not supported with --fsdp"),
        (["--fsdp-grad-sync", "step"], "--fsdp-grad-sync='step' configures FSDP2, and this run uses the ZeRO-1"),
        (["--fsdp", "--fsdp-reshard-after-forward", "sometimes"],
         "--fsdp-reshard-after-forward='sometimes' is not a valid choice"),
        (["--fsdp", "--fsdp-prefetch", "4"], "--fsdp-prefetch=4 reaches past the model's 4 decoder layers"),
        (["--fsdp", "--fsdp-reduce-dtype", "bf16", "--fsdp-grad-sync", "step"],
         "--fsdp-reduce-dtype='bf16' would make FSDP2 accumulate the step's micro-batch gradients in bf16"),
        (["--fsdp-fp8-all-gather", "--fp8", "tensorwise"],
         "--fsdp-fp8-all-gather=True configures FSDP2, and this run uses the ZeRO-1 optimizer (no --fsdp): add --fsdp"),
        (["--fsdp", "--fsdp-fp8-all-gather"], "--fsdp-fp8-all-gather=True gathers each weight's tensorwise FP8 copy "
         "(one scale a weight), and --fp8 is off: add --fp8 tensorwise, or leave out --fsdp-fp8-all-gather"),
        (["--fsdp", "--fsdp-fp8-all-gather", "--fp8", "rowwise"], "and --fp8 is rowwise (a scale per row"),
        (["--fsdp", "--fsdp-fp8-all-gather", "--fp8", "tensorwise", "--fp8-weight-cache"],
         "--fsdp-fp8-all-gather=True hands the linears the gathered FP8 copies, and --fp8-weight-cache keeps copies "
         "cast from the gathered bf16 weights: leave out --fp8-weight-cache"),
    ]
    run_dirs = [tmp_path / f"run-{i}" for i in range(len(cases))]
    procs = run_engine_batch([["pretrain", *TINY, "--num-steps", "2", "--run-dir", str(run_dir), *args]
                              for run_dir, (args, _) in zip(run_dirs, cases)])
    for run_dir, (args, fragment), proc in zip(run_dirs, cases, procs):
        check_rejected(proc, run_dir, fragment, " ".join(args))
