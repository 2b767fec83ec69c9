"""TP = 2 x DP = 2 through torchrun (4 real processes, gloo): against one process, bitwise resume,
resume on another DP size (resharded ZeRO-1 optimizer shards), export to HF weights and to int8, checksums of
every rank's shards. The run saves with --async-save (host copies of the ZeRO-1 ShardedTensors written
by a background thread on its own gloo group), so every resume and export here reads async-written
checkpoints; the resumed runs save blocking.

Reference: the same config (8 steps, global batch 4 = 2 micro-batches of 2) in one process, built
in-process (no launcher, so no second subprocess start-up). Tolerances: losses and grad norms 1e-5
relative (row-parallel partial sums and per-rank grad-norm squares add in another order; observed
<= 3e-7); resume on the same layout: bit for bit; on DP = 1 (GAS 2 instead of DP 2): 1e-6 (the two
micro-batch gradients are summed by an all-reduce or by accumulation; observed: equal bit for bit).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.checkpoint.hf_export import export_hf, to_llama_state_dict
from tests.engine.helpers import deterministic_fields, loss_lines, run_engine
from tests.once import once_per_run
from tests.parallel.launch import TINY_DP, torchrun
from tests.parallel.workers import single_run, spawn

STEPS = ["--num-steps", "8", "--save-every", "4", "--keep-last", "5"]


@pytest.fixture(scope="session")
@once_per_run
def tp2dp2(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tp2dp2")
    proc = torchrun(4, "pretrain", *TINY_DP, *STEPS, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2",
                    "--async-save", "--run-dir", str(run_dir))
    return run_dir, [deterministic_fields(x) for x in loss_lines(proc.stdout)], proc.stdout


@pytest.fixture(scope="session")
@once_per_run
def single(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torchrun gives each rank one thread
    try:
        return single_run({"micro_batch_size": 2, "grad_accum_steps": 2, "num_steps": 8, "ddp_bucket_mb": 0.3}, 8)
    finally:
        torch.set_num_threads(threads)


def rel(a: str, b: float) -> float:
    return abs(float(a) - b) / abs(b)


def test_tp2_dp2_matches_single_process(tp2dp2, single):
    _, lines, stdout = tp2dp2
    assert "layout launcher=torchrun world=4 tp=2 dp=2" in stdout
    assert [x[0] for x in lines] == [str(i) for i in range(1, 9)]
    for (step, loss, norm, *_), (ref_loss, ref_norm) in zip(lines, single["steps"]):
        assert rel(loss, ref_loss) < 1e-5, f"step {step}: loss {loss} vs {ref_loss}"
        assert rel(norm, ref_norm) < 1e-5, f"step {step}: grad norm {norm} vs {ref_norm}"


@pytest.mark.slow  # ~15 s; by default test_resume_auto_at_tp2_dp2_skips_a_damaged_newest_checkpoint resumes step 4 bit for bit
def test_resume_at_tp2_dp2_is_bitwise(tp2dp2, tmp_path):
    run_dir, lines, _ = tp2dp2
    ckpt = run_dir / "checkpoints" / "step_00000004"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["layout"] == {"tp": 2, "dp": 2}
    proc = torchrun(4, "pretrain", *TINY_DP, *STEPS, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2",
                    "--resume", str(ckpt), "--run-dir", str(tmp_path / "resumed"))
    assert [deterministic_fields(x) for x in loss_lines(proc.stdout)] == lines[4:]


def test_resume_on_another_dp_size_reshards(tp2dp2, tmp_path):
    """tp=2 x dp=2 -> tp=2 x dp=1 (two processes, GAS 4 keeps the global batch of 4): steps 5-8 continue the torchrun
    run (1e-6). The resuming ranks are forked from this process (tests/parallel/workers.py: no interpreter start-up);
    what is tested is the checkpoint's resharding, the launcher is the fixture's."""
    run_dir, lines, _ = tp2dp2
    resume = {"tp": 2, "micro_batch_size": 1, "grad_accum_steps": 4, "eval_samples": 0, "ddp_bucket_mb": 0.3,
              "num_steps": 8, "resume": str(run_dir / "checkpoints" / "step_00000004")}
    resumed = spawn(2, [("dp1", resume, 4)], tmp_path)["dp1"]
    assert resumed["layout"] == (2, 1) and len(resumed["steps"]) == 4
    for (loss, norm), want in zip(resumed["steps"], lines[4:]):
        assert rel(want[1], loss) < 1e-6 and rel(want[2], norm) < 1e-6, ((loss, norm), want)


def test_export_hf_gathers_tp_and_dp_shards(tp2dp2, single, tmp_path):
    """export-hf of the TP 2 x DP 2 checkpoint: every HF tensor equals the single-process run's
    weights after the same 8 steps, mapped by to_llama_state_dict (rel. 1e-5 per tensor; a row or
    column block from the wrong rank, or a missing DP shard, is off by 100%)."""
    from safetensors.torch import load_file

    run_dir, _, _ = tp2dp2
    out = export_hf(str(run_dir / "checkpoints" / "step_00000008"), str(tmp_path / "hf"), dtype="float32")
    exported = load_file(str(out / "model.safetensors"))
    want = to_llama_state_dict(single["config"], single["weights"])
    assert sorted(exported) == sorted(want)
    for name, ref in want.items():
        assert exported[name].shape == ref.shape, name
        assert ((exported[name] - ref).norm() / ref.norm()).item() < 1e-5, name


def test_export_int8_gathers_tp_shards_and_evaluates_as_one_process(tp2dp2, single, tmp_path):
    """export-int8 of the TP 2 x DP 2 checkpoint (vocabulary padded to 512 at TP 2, 384 at TP 1): its evaluation of
    the original weights equals the single-process run's validation loss on the same 12 samples (rel. 1e-5, as the
    losses), and every round-tripped tensor is within half a quantisation step of the single run's weights
    (plus the 1e-5 relative TP / single difference of the weights themselves)."""
    from engine.checkpoint.int8_export import export_int8, load_int8

    run_dir, _, _ = tp2dp2
    report = export_int8(str(run_dir / "checkpoints" / "step_00000008"), str(tmp_path / "m.int8"), min_numel=1024,
                         eval_samples=12, device="cpu")
    assert abs(report["original"][0] - single["val"]) / single["val"] < 1e-5
    cfg, loaded = load_int8(tmp_path / "m.int8")
    for name, ref in single["weights"].items():
        ref = ref.float()
        if name in ("embed.weight", "lm_head"):  # the rows past the vocabulary are padding, of another length
            ref, loaded[name] = ref[:cfg.vocab_size], loaded[name][:cfg.vocab_size]
        if ref.dim() == 2:
            step = ref.abs().amax(dim=1, keepdim=True) / 127
            assert bool(((loaded[name] - ref).abs() <= step / 2 + 1e-5 * ref.abs().amax()).all()), name
        else:
            assert ((loaded[name] - ref).norm() / ref.norm()).item() < 1e-5, name


def test_resume_with_another_tp_size_is_refused(tp2dp2, tmp_path):
    run_dir, _, _ = tp2dp2
    target = tmp_path / "run"
    proc = run_engine("pretrain", *TINY_DP, *STEPS, "--micro-batch-size", "2", "--grad-accum-steps", "2",
                      "--resume", str(run_dir / "checkpoints" / "step_00000004"), "--run-dir", str(target), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert "--tp=1" in lines[0] and "tp=2 x dp=2" in lines[0] and "tp=1 x dp=1" in lines[0], lines[0]
    assert not Path(target).exists()


def test_every_ranks_shards_are_checksummed(tp2dp2):
    """manifest.json covers the shards of all four ranks (each hashed by the rank that wrote it) plus
    .metadata and meta.json. That a damaged shard of another rank than 0 is found by a resume at TP 2 x DP 2:
    test_resume_auto_at_tp2_dp2_skips_a_damaged_newest_checkpoint (rank 2's)."""
    run_dir, _, stdout = tp2dp2
    assert "[CKPT] step=4 path=" in stdout and "(async)" in stdout
    ckpt = run_dir / "checkpoints" / "step_00000004"
    listed = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert set(listed) == {p.name for p in ckpt.iterdir()} - {"manifest.json"}
    assert {name.split("_")[2] for name in listed if name.endswith(".distcp")} == {"0", "1", "2", "3"}


@pytest.mark.slow  # ~12 s; by default the auto resume below finds rank 2's damaged shard, test_checkpoints.py an explicit one
def test_an_explicit_resume_of_a_damaged_shard_names_it(tp2dp2, tmp_path):
    """A same-size overwrite of rank 3's shard stops a resume at TP 2 x DP 2 before any step, naming that file."""
    run_dir, _, _ = tp2dp2
    ckpt = tmp_path / "step_00000004"
    shutil.copytree(run_dir / "checkpoints" / "step_00000004", ckpt)
    shard = next(ckpt.glob("__3_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    proc = torchrun(4, "pretrain", *TINY_DP, *STEPS, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2",
                    "--resume", str(ckpt), "--run-dir", str(tmp_path / "resumed"), check=False)
    assert proc.returncode != 0 and not loss_lines(proc.stdout)
    assert f"{ckpt.name}/{shard.name} bytes 0.." in proc.stderr and "fails verification" in proc.stderr, proc.stderr[-3000:]


def test_resume_auto_at_tp2_dp2_skips_a_damaged_newest_checkpoint(tp2dp2, tmp_path):
    """Every rank walks rank 0's list of candidates, verifies its share, and all agree: step 8 (rank 2's
    shard damaged) is skipped with one line, step 4 resumes bit for bit (the async-saved checkpoint, on the same
    layout)."""
    run_dir, lines, _ = tp2dp2
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shard = next((copy / "checkpoints" / "step_00000008").glob("__2_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x80
    shard.write_bytes(bytes(data))
    proc = torchrun(4, "pretrain", *TINY_DP, *STEPS, "--tp", "2", "--micro-batch-size", "1", "--grad-accum-steps", "2",
                    "--resume", "auto", "--run-dir", str(copy))
    skipped = [x for x in proc.stdout.splitlines() if x.startswith("[CKPT] skipped")]
    assert len(skipped) == 1 and f"step_00000008/{shard.name}" in skipped[0], proc.stdout[-3000:]
    assert [deterministic_fields(x) for x in loss_lines(proc.stdout)] == lines[4:]
