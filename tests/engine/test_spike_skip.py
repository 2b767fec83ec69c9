"""--skip-spike-factor: a step whose loss spikes is not applied, logged, counted, bounded, agreed by all ranks.

The spike is planted: the loader's batch at a chosen data position is replaced by one repeated input
token and one rare label (loss 6.32 at step 8 where the mean of the last 3 steps is 3.89; factor 1.5). The
reference for "skipped" is the same run whose loader simply never yields that batch: skipping must
leave no trace in the weights (bit for bit), while the skip off lets the poisoned update through.
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.errors import ConfigError, TrainingDiverged
from engine.optim import LossSpikeGuard
from engine.train import Trainer
from tests.parallel.workers import launch

CPU = torch.device("cpu")
BASE = dict(preset="tiny", device="cpu", compute_dtype="fp32", seq_length=64, micro_batch_size=4, eval_samples=0,
            num_steps=10, warmup_steps=2, save_final=False, skip_spike_factor=1.5, skip_spike_window=3,
            skip_spike_max_consecutive=3)
POISON_AT = 7  # the 8th batch of the run (0-based global batch index)


def trainer(tmp: Path, **overrides) -> Trainer:
    return Trainer(resolve(build_config({**BASE, "run_dir": str(tmp), **overrides})), ParallelState.single(CPU), torch.float32)


def plant(t: Trainer, poisoned: set[int], drop: bool = False) -> list[int]:
    """Replace (or, with drop, skip over) the batches at the given global positions; returns the positions served."""
    served: list[int] = []
    real = t.loader.next_step

    def next_step():
        position = t.loader.consumed_samples // t.cfg.global_batch_size
        micro = real()
        if position in poisoned and drop:
            return next_step()
        served.append(position)
        if position in poisoned:  # "AAAA..." followed by byte 200 everywhere
            return [(torch.full_like(x, 65), torch.full_like(y, 200)) for x, y in micro]
        return micro

    t.loader.next_step = next_step
    return served


def weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.model.named_parameters()}


def test_a_spiking_batch_is_skipped_without_a_trace(tmp_path, capsys):
    skipped = trainer(tmp_path / "skip")
    served = plant(skipped, {POISON_AT})
    assert skipped.run() == 0
    out = capsys.readouterr().out
    skips = [line for line in out.splitlines() if line.startswith("[SKIP]")]
    assert len(skips) == 1 and skips[0].startswith(f"[SKIP] step={POISON_AT + 1} ") and "skipped_batches=1" in skips[0]
    assert skipped.step == 10 and served == list(range(11))  # 10 applied steps, one batch more read
    last = (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()[-1]
    assert '"step": 10' in last and '"skipped_batches": 1' in last

    dropped = trainer(tmp_path / "drop")  # the reference: a loader that never yields the poisoned batch
    plant(dropped, {POISON_AT}, drop=True)
    assert dropped.run() == 0
    assert all(torch.equal(a, b) for a, b in zip(weights(skipped).values(), weights(dropped).values()))

    applied = trainer(tmp_path / "off", skip_spike_factor=0.0)  # the skip off: the poisoned update goes through
    plant(applied, {POISON_AT})
    assert applied.run() == 0
    assert "[SKIP]" not in capsys.readouterr().out
    assert not all(torch.equal(a, b) for a, b in zip(weights(applied).values(), weights(dropped).values()))


def test_consecutive_spikes_stop_the_run(tmp_path, capsys):
    t = trainer(tmp_path / "run")
    plant(t, set(range(POISON_AT, 100)))
    with pytest.raises(TrainingDiverged, match=r"step 8: 3 batches in a row skipped as loss spikes .* --skip-spike-factor 1.5"):
        t.run()
    assert len([x for x in capsys.readouterr().out.splitlines() if x.startswith("[SKIP]")]) == 2


def test_resume_keeps_the_running_mean(tmp_path, capsys):
    """The window is checkpointed: resumed at step 5, the run skips the same batch and ends on the same weights."""
    full = trainer(tmp_path / "full", save_every=5, keep_last=2)
    plant(full, {POISON_AT})
    full.run()
    resumed = trainer(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoints" / "step_00000005"))
    assert resumed.spike_guard.state_dict()["history"].isfinite().all()
    plant(resumed, {POISON_AT})
    resumed.run()
    assert resumed.spike_guard.skipped_total == 1
    assert all(torch.equal(a, b) for a, b in zip(weights(full).values(), weights(resumed).values()))


@pytest.mark.parametrize("factor", [0.5, 1.0, -2.0])
def test_factor_must_be_off_or_above_one(factor):
    with pytest.raises(ConfigError, match="--skip-spike-factor"):
        resolve(build_config({"skip_spike_factor": factor}))


def _agree(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        cfg = resolve(build_config({**BASE, "skip_spike_window": 2}), world)
        par = ParallelState(rank=rank, world_size=world, tp_rank=0, tp_size=1, dp_rank=rank, dp_size=world,
                            tp_group=None, dp_group=dist.group.WORLD, kv_group=None, device=CPU)
        guard = LossSpikeGuard(cfg, par)
        decisions = [guard.check(loss, step) for step, loss in enumerate([4.0, 4.0, 4.1], start=1)]
        # only rank 0 sees a spike (in the engine every rank sees the same all-reduced loss; this proves the
        # decision is agreed even if they ever differed)
        decisions.append(guard.check(9.0 if rank == 0 else 4.0, 4))
        torch.save(decisions, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_the_decision_is_agreed_by_every_rank(tmp_path):
    launch(_agree, (2, str(tmp_path / "init"), str(tmp_path / "out")), 2)
    assert [torch.load(f"{tmp_path / 'out'}.{r}") for r in range(2)] == [[False, False, False, True]] * 2
