"""Bad input: one line naming the field and the fix, exit code 2, nothing written."""

import json
from pathlib import Path

import pytest

from tests.engine.helpers import TINY_FAST, run_engine


def assert_rejected(tmp_path: Path, *args: str, fragment: str) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("pretrain", *TINY_FAST, "--run-dir", str(run_dir), *args, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0], lines[0]
    assert not run_dir.exists(), "a rejected run must write nothing"


def test_unknown_preset(tmp_path):
    assert_rejected(tmp_path, "--preset", "gpt5", fragment="preset='gpt5'")


def test_inconsistent_batch_sizes(tmp_path):
    assert_rejected(tmp_path, "--micro-batch-size", "2", "--grad-accum-steps", "8", "--global-batch-size", "64",
                    fragment="global batch 64 != mbs 2 x GAS 8 x DP 1")


def test_tp_larger_than_one_process_says_to_launch_with_torchrun(tmp_path):
    assert_rejected(tmp_path, "--tp", "3", fragment="--tp=3 does not divide the number of processes (1): launch with "
                                                    "torchrun --nproc-per-node 3")


def test_more_eval_samples_than_validation_data(tmp_path):
    # the embedded validation split holds 912 samples of 64 tokens
    assert_rejected(tmp_path, "--eval-samples", "5000", fragment="--eval-samples=5000 needs more validation samples than "
                                                                 "the 912 of --seq-length 64 there are: use at most 912")


def test_missing_text_field(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"body": f"document number {i} " * 50}) for i in range(20)) + "\n")
    assert_rejected(tmp_path, "--hf-dataset", str(data), "--eval-samples", "0", fragment="--hf-text-field")


def test_empty_dataset(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    assert_rejected(tmp_path, "--hf-dataset", str(data), "--eval-samples", "0", fragment="--hf-dataset")


def test_tokenizer_vocab_exceeds_model(tmp_path, shared_data):
    assert_rejected(tmp_path, "--tokenizer-path", str(shared_data / "tokenizers" / "minicpm4"), fragment="--vocab-size")


def test_corrupt_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt" / "step_00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text("{not json")
    (ckpt / ".metadata").write_bytes(b"garbage")
    assert_rejected(tmp_path, "--resume", str(ckpt), fragment="--resume")


def test_truncated_checkpoint_shards(tmp_path):
    src = tmp_path / "src"
    run_engine("pretrain", *TINY_FAST, "--num-steps", "2", "--run-dir", str(src))
    ckpt = src / "checkpoints" / "step_00000002"
    for shard in ckpt.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    assert_rejected(tmp_path, "--resume", str(ckpt), fragment="--resume")


def test_cuda_graphs_without_cuda(tmp_path):
    assert_rejected(tmp_path, "--cuda-graphs", "--device", "cpu",
                    fragment="--cuda-graphs=True captures CUDA graphs, and this run's device is cpu: run on a CUDA GPU")


def test_override_schedule_without_resume(tmp_path):
    assert_rejected(tmp_path, "--override-schedule", fragment="--override-schedule=True")


def test_fresh_run_into_a_save_dir_with_checkpoints(tmp_path):
    """Without --resume, a second run in the same folder would overwrite the first one's checkpoints step by
    step (and --keep-last would prune the rest): refused before anything is written; --resume auto continues."""
    run_dir = tmp_path / "run"
    run_engine("pretrain", *TINY_FAST, "--num-steps", "2", "--save-every", "1", "--run-dir", str(run_dir))
    before = {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    proc = run_engine("pretrain", *TINY_FAST, "--num-steps", "2", "--seed", "7", "--run-dir", str(run_dir), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --save-dir={str(run_dir / 'checkpoints')!r} already holds checkpoints of an earlier run (newest "
        "step_00000002): pass --resume auto to continue that run, or give this run its own --run-dir (or --save-dir); "
        "delete them to start over in the same place"]
    assert {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    resumed = run_engine("pretrain", *TINY_FAST, "--num-steps", "2", "--run-dir", str(run_dir), "--resume", "auto")
    assert "[RUN] resumed from" in resumed.stdout


def test_output_folder_that_is_a_file(tmp_path):
    """Found before any work (it used to surface as a FileExistsError traceback at the first checkpoint)."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    assert_rejected(tmp_path, "--save-dir", str(blocker), fragment=f"--save-dir={str(blocker)!r} is not a folder: choose a folder path")
    assert_rejected(tmp_path, "--save-dir", str(blocker / "ckpt"),
                    fragment=f"is not a folder ({blocker} is a file): choose a folder path")
    assert blocker.read_text() == "keep me"
