"""Bad input: one line naming the field and the fix, exit code 2, nothing written."""

import json
from pathlib import Path

from tests.engine.helpers import TINY_FAST, check_rejected, run_engine, run_engine_batch


def assert_rejected(tmp_path: Path, *args: str, fragment: str) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("pretrain", *TINY_FAST, "--run-dir", str(run_dir), *args, check=False)
    check_rejected(proc, run_dir, fragment)


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
        "a --save-at step past the run": (["--save-at", "5,6,7"], "--save-at='5,6,7' has a bad part '7': write step "
                                                                 "numbers from 1 to --num-steps 6"),
        "more --save-at steps than --keep-last keeps": (["--save-at", "1,2,3,4"], "--keep-last=3 would delete checkpoints "
                                                                                  "--save-at asks for: use at least 4"),
        "a CUDA-only FP8 op version on CPU": (["--fp8", "tensorwise", "--op-fp8-wgrad", "quack"],
                                             "--op-fp8-wgrad='quack' (op 'fp8_wgrad') runs only on cuda, not on cpu"),
        "an FP8 weight-gradient version the run never calls": (["--fp8", "rowwise", "--op-fp8-wgrad", "quack"],
                                                               "--op-fp8-wgrad='quack' adds tensorwise FP8 weight "
                                                               "gradients into the fp32 accumulators"),
        "unknown FP8 recipe": (["--fp8", "fp4"], "--fp8='fp4' is not a valid choice: use one of: off, tensorwise, rowwise"),
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

# Refusals that need a trained checkpoint (truncated shards, a fresh run into a folder that holds checkpoints) are
# batched with the other checkpoint refusals in tests/engine/test_checkpoints.py (the `refused` fixture).
