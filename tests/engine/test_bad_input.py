"""Bad input: one line naming the field and the fix, exit code 2, nothing written."""

import json
from pathlib import Path

import pytest

from tests.engine.helpers import TINY_FAST, run_engine, run_engine_batch


def assert_rejected(tmp_path: Path, *args: str, fragment: str) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("pretrain", *TINY_FAST, "--run-dir", str(run_dir), *args, check=False)
    check_rejected(proc, run_dir, fragment)


def check_rejected(proc, run_dir: Path, fragment: str, case: str = "") -> None:  # noqa: ANN001 -- a CompletedProcess
    assert proc.returncode == 2, (case, proc.stdout + proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, (case, proc.stderr)
    assert fragment in lines[0], (case, lines[0])
    assert not run_dir.exists(), f"{case}: a rejected run must write nothing"


def test_each_bad_flag_is_one_line_exit_2_and_nothing_written(tmp_path):
    """Refusals of flags, data, checkpoints and output folders. Each is `python -m engine pretrain ...` as the CLI runs
    it (engine.cli.main, its stdout and stderr at the file-descriptor level), all in one process
    (tests/engine/engine_batch.py): torch is imported once, not once per refusal."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"body": f"document number {i} " * 50}) for i in range(20)) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    ckpt = tmp_path / "ckpt" / "step_00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text("{not json")
    (ckpt / ".metadata").write_bytes(b"garbage")
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    cases = {
        "unknown preset": (["--preset", "gpt5"], "preset='gpt5'"),
        "inconsistent batch sizes": (["--micro-batch-size", "2", "--grad-accum-steps", "8", "--global-batch-size", "64"],
                                     "global batch 64 != mbs 2 x GAS 8 x DP 1"),
        "tp larger than one process": (["--tp", "3"], "--tp=3 does not divide the number of processes (1): launch with "
                                                      "torchrun --nproc-per-node 3"),
        # the embedded validation split holds 912 samples of 64 tokens
        "more eval samples than validation data": (["--eval-samples", "5000"],
                                                   "--eval-samples=5000 needs more validation samples than the 912 of "
                                                   "--seq-length 64 there are: use at most 912"),
        "missing text field": (["--hf-dataset", str(docs), "--eval-samples", "0"], "--hf-text-field"),
        "empty dataset": (["--hf-dataset", str(empty), "--eval-samples", "0"], "--hf-dataset"),
        "corrupt checkpoint": (["--resume", str(ckpt)], "--resume"),
        "cuda graphs without cuda": (["--cuda-graphs", "--device", "cpu"],
                                     "--cuda-graphs=True captures CUDA graphs, and this run's device is cpu: run on a CUDA GPU"),
        "override schedule without resume": (["--override-schedule"], "--override-schedule=True"),
        # found before any work (it used to surface as a FileExistsError traceback at the first checkpoint)
        "output folder that is a file": (["--save-dir", str(blocker)],
                                         f"--save-dir={str(blocker)!r} is not a folder: choose a folder path"),
        "output folder inside a file": (["--save-dir", str(blocker / "ckpt")],
                                        f"is not a folder ({blocker} is a file): choose a folder path"),
    }
    run_dirs = {case: tmp_path / f"run-{i}" for i, case in enumerate(cases)}
    procs = run_engine_batch([["pretrain", *TINY_FAST, "--run-dir", str(run_dirs[case]), *args]
                              for case, (args, _) in cases.items()])
    for (case, (_, fragment)), proc in zip(cases.items(), procs):
        check_rejected(proc, run_dirs[case], fragment, case)
    assert blocker.read_text() == "keep me"


def test_tokenizer_vocab_exceeds_model(tmp_path, shared_data):
    assert_rejected(tmp_path, "--tokenizer-path", str(shared_data / "tokenizers" / "minicpm4"), fragment="--vocab-size")


def test_truncated_checkpoint_shards(tmp_path):
    src = tmp_path / "src"
    run_engine("pretrain", *TINY_FAST, "--num-steps", "2", "--run-dir", str(src))
    ckpt = src / "checkpoints" / "step_00000002"
    for shard in ckpt.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    assert_rejected(tmp_path, "--resume", str(ckpt), fragment="--resume")


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
