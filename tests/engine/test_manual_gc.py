"""--gc-every: Python's collector runs between steps, every N, and nowhere else (engine/manual_gc.py).

Observed through gc.callbacks, the interpreter's own report of each pass: with the flag on, the only passes during a
run are the one at its start and one before every N-th step; automatic collection is back on after the run, even one
that fails; and the losses are those of a run with the automatic collector (the collector frees memory, it computes
nothing).
"""

import gc
import json
from pathlib import Path

import pytest
import torch

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.manual_gc import ManualGC
from engine.train import Trainer

BASE = dict(preset="tiny", device="cpu", compute_dtype="fp32", seq_length=64, micro_batch_size=4, eval_samples=0,
            num_steps=7, warmup_steps=2, save_final=False)


class Passes:
    """The collector's passes while inside: (generation) of each."""

    def __enter__(self) -> list[int]:
        self.seen: list[int] = []
        gc.callbacks.append(self._record)
        return self.seen

    def _record(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.seen.append(info["generation"])

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._record)


def trainer(tmp: Path, **overrides) -> Trainer:
    cfg = resolve(build_config({**BASE, "run_dir": str(tmp), **overrides}))
    return Trainer(cfg, ParallelState.single(torch.device("cpu")), torch.float32)


def losses(tmp: Path) -> list[tuple[float, float]]:
    records = [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]
    return [(r["global_loss"], r["grad_norm"]) for r in records if r["kind"] == "loss"]


def test_passes_run_at_the_start_and_before_every_nth_step_only(tmp_path):
    assert gc.isenabled()
    managed = trainer(tmp_path / "managed", gc_every=3)
    with Passes() as seen:
        assert managed.run() == 0
    # the start's pass, then before steps 4 and 7 (3 and 6 done): full passes, no automatic one in between
    assert seen == [2, 2, 2], seen
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert trainer(tmp_path / "automatic").run() == 0
    assert len(losses(tmp_path / "managed")) == 7
    assert losses(tmp_path / "managed") == losses(tmp_path / "automatic")


def test_the_collector_is_restored_when_a_run_fails(tmp_path):
    failing = trainer(tmp_path / "failing", gc_every=2)
    real = failing.train_step

    def train_step():
        if failing.step == 3:
            assert not gc.isenabled() and gc.get_freeze_count() > 0  # inside the run: managed
            raise RuntimeError("planted")
        return real()

    failing.train_step = train_step
    with pytest.raises(RuntimeError, match="planted"):
        failing.run()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_stop_is_idempotent():
    collector = ManualGC(2)
    collector.start()
    collector.stop()
    collector.stop()  # the trainer's finally may follow an earlier stop
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_off_leaves_python_s_collector_alone():
    collector = ManualGC(0)
    collector.start()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with Passes() as seen:
        collector.before_step(10)
    assert seen == []
    collector.stop()
    assert gc.isenabled()


def test_a_negative_interval_is_refused():
    with pytest.raises(ConfigError, match="--gc-every"):
        resolve(build_config({**BASE, "gc_every": -1}))
