"""Real data: the tiny preset trains on the public-domain corpus in ../shared/data with the real
MiniCPM4 tokenizer, and its validation loss falls well below where it started.

200 steps of 256 tokens (mbs 4 x seq 64) on 2 CPU cores, training on the first train shard (6.4M
tokens of 12 books) and evaluating on the held-out validation books. At initialisation the validation loss is
about ln(73448) = 11.2 nats; after 200 steps it is ~6 (observed 5.7-6.2 depending on the batch
size), so "well below" is asserted as at least 3 nats lower, and bits per byte must fall too.
"""

import re

import pytest

from tests.engine.helpers import run_engine

pytestmark = pytest.mark.slow


def test_tiny_learns_real_english_with_minicpm4_tokenizer(tmp_path, shared_data):
    proc = run_engine(
        "pretrain", "--preset", "tiny", "--device", "cpu", "--hf-dataset", str(shared_data / "corpus" / "train-00000-of-00002.parquet"),
        "--hf-val-dataset", str(shared_data / "corpus" / "validation-00000-of-00001.parquet"),
        "--tokenizer-path", str(shared_data / "tokenizers" / "minicpm4"), "--vocab-size", "73448",
        "--seq-length", "64", "--micro-batch-size", "4", "--num-steps", "200", "--warmup-steps", "10",
        "--eval-every", "100", "--eval-samples", "32", "--log-every", "50", "--no-save-final",
        "--run-dir", str(tmp_path / "run"), "--data-cache-dir", str(tmp_path / "cache"), timeout=1200)
    evals = [(int(s), float(loss), float(bpb)) for s, loss, bpb in
             re.findall(r"^\[EVAL\] step=(\d+) val_loss=(\S+) val_bpb=(\S+)", proc.stdout, re.M)]
    print("\n".join(f"step {s}: val_loss {loss:.4f} val_bpb {bpb:.4f}" for s, loss, bpb in evals))
    assert [s for s, _, _ in evals] == [0, 100, 200]
    (_, start, start_bpb), (_, end, end_bpb) = evals[0], evals[-1]
    assert start == pytest.approx(11.2, abs=0.5)  # uniform over 73,448 tokens at init
    assert end < start - 3.0
    assert end_bpb < start_bpb * 0.7
    assert "sentencepiece" in proc.stdout and "(vocab 73448, eos 2)" in proc.stdout
