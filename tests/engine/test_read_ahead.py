"""A step reads the next step's batches before its loss sync (engine/train.py Trainer._read_ahead), so the host's
reading and pinning overlaps the GPU's backward instead of idling the GPU at the next step's start.

Held to the engine that reads each step's batches at its start (tests/engine/no_read_ahead.py): the same batches in
the same order, so the same bits; the loader read once a step and never past the last; and what a checkpoint records
of the loader is its position after the steps trained, not after the batch read ahead (a resume from it repeats
the uninterrupted run bit for bit).
"""

import json
from pathlib import Path

import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.train import Trainer
from tests.engine.no_read_ahead import no_read_ahead

BASE = dict(preset="tiny", device="cpu", compute_dtype="fp32", seq_length=64, micro_batch_size=2, grad_accum_steps=2,
            eval_samples=0, num_steps=5, warmup_steps=2, save_final=False)


def trainer(tmp: Path, **overrides) -> Trainer:
    cfg = resolve(build_config({**BASE, "run_dir": str(tmp), **overrides}))
    return Trainer(cfg, ParallelState.single(torch.device("cpu")), torch.float32)


def losses(tmp: Path) -> list[tuple[int, float, float]]:
    records = [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["global_loss"], r["grad_norm"]) for r in records if r["kind"] == "loss"]


def test_the_same_batches_as_reading_each_step_at_its_start(tmp_path, monkeypatch):
    ahead = trainer(tmp_path / "ahead")
    reads: list[int] = []
    real = ahead.loader.next_step

    def counted():
        reads.append(ahead.loader.consumed_samples // ahead.cfg.global_batch_size)
        return real()

    ahead.loader.next_step = counted
    assert ahead.run() == 0
    assert reads == [0, 1, 2, 3, 4]  # once a step, in order, none past the last
    with monkeypatch.context() as m:
        m.setattr(Trainer, "_read_ahead", Trainer._read_ahead)  # restored when the block ends
        no_read_ahead()
        assert trainer(tmp_path / "plain").run() == 0
    assert len(losses(tmp_path / "ahead")) == 5
    assert losses(tmp_path / "ahead") == losses(tmp_path / "plain")


def test_a_checkpoint_records_the_position_of_the_steps_trained(tmp_path):
    t = trainer(tmp_path / "run")
    gbs = t.cfg.global_batch_size
    t.train_step()
    t.step += 1
    assert t.ahead is not None and t.loader.consumed_samples == 2 * gbs  # step 2's batches already read
    assert t._state()["trainer"]["data"]["consumed_samples"] == gbs


def test_a_resume_from_a_checkpoint_written_with_a_batch_read_ahead_repeats_the_run(tmp_path):
    whole = trainer(tmp_path / "whole", save_every=2, num_steps=5)
    assert whole.run() == 0
    saved = tmp_path / "whole" / "checkpoints" / "step_00000002"
    resumed = trainer(tmp_path / "resumed", num_steps=5, resume=str(saved))
    assert resumed.run() == 0
    assert losses(tmp_path / "resumed") == losses(tmp_path / "whole")[2:]
