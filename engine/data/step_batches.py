"""`python -m engine batches`: the exact token batch of given optimizer steps of a run, without training.

Why and how: docs/engine/data.md, section `engine/data/step_batches.py`.
"""

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from engine.config import EngineConfig, resolve
from engine.data.format import write_json_atomic
from engine.data.mix import make_loader
from engine.data.sources import build_data
from engine.errors import ConfigError

__all__ = ["BATCHES_FILE", "BATCHES_FORMAT", "DATA_GROUPS", "step_batches", "write_batches", "parse_steps"]

BATCHES_FILE = "batches.json"
BATCHES_FORMAT = "temper-batches"
# EngineConfig field groups that decide which tokens a step trains on: the seed, the data and tokenizer, the
# sequence length and batch sizes, the vocabulary size the tokenizer is checked against, and the TP size
# that with the world size gives the DP size (the model fields come along: resolve checks TP against them).
DATA_GROUPS = ("run", "model", "batch", "data", "parallel")
_MAX_STEPS = 10_000
# Fields of DATA_GROUPS that decide when a run stops, never which tokens a step trains on (--max-wall-s is validated
# against the schedule, which is reset: kept, it would refuse the flags of a budgeted run).
_NOT_DATA = ("max_wall_s",)


def parse_steps(text: str) -> list[int]:
    """'7,8' or '2-8' or '1,4-6' -> sorted step numbers (each >= 1)."""
    steps: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ConfigError("--steps", text, "give step numbers like 7,8 or 2-8", "is not a list of steps") from None
        if first < 1 or last < first or last - first >= _MAX_STEPS:
            raise ConfigError("--steps", text, f"give steps from 1 on, ranges low-high, at most {_MAX_STEPS} at a time",
                              "is out of range")
        steps.update(range(first, last + 1))
    if not steps:
        raise ConfigError("--steps", text, "name at least one optimizer step, e.g. --steps 7,8", "is empty")
    return sorted(steps)


def step_batches(cfg: EngineConfig, steps: Sequence[int], *, world_size: int, cache_dir: Path) -> dict[str, Any]:
    """The batches.json document for `steps` of a run of `cfg` launched on `world_size` processes."""
    if world_size < 1:
        raise ConfigError("--world-size", world_size, "give the number of processes the run had (1 for a single one)",
                          "is out of range")
    defaults = EngineConfig()
    cfg = dataclasses.replace(cfg, **{f.name: getattr(defaults, f.name) for f in dataclasses.fields(EngineConfig)
                                      if f.metadata["group"] not in DATA_GROUPS or f.name in _NOT_DATA})
    cfg = resolve(dataclasses.replace(cfg, eval_samples=0), world_size)
    dp = world_size // cfg.tp
    data = build_data(cfg, cache_dir=cache_dir, dp_rank=0, dp_size=1)
    loader = make_loader(data.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps,
                         dp_rank=0, dp_size=dp, seed=cfg.seed)
    wanted = set(steps)
    out: dict[str, Any] = {}
    for step in range(1, max(wanted) + 1):
        rows = loader.next_global_rows()
        if step in wanted:
            inputs, labels = data.train.batch(rows)
            out[str(step)] = {"rows": rows, "inputs": inputs.tolist(), "labels": labels.tolist()}
    return {"format": BATCHES_FORMAT, "version": 1, "seq_length": cfg.seq_length,
            "global_batch_size": loader.global_batch_size, "seed": cfg.seed, "world_size": world_size,
            "data": data.description, "fingerprint": data.train.fingerprint, "steps": out}


def write_batches(cfg: EngineConfig, *, steps: Sequence[int], world_size: int, out_dir: Path | str) -> Path:
    """Write `<out_dir>/batches.json` (module doc); returns its path."""
    out_dir = Path(out_dir)
    document = step_batches(cfg, steps, world_size=world_size, cache_dir=out_dir / "data")  # checks before it writes
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / BATCHES_FILE
    write_json_atomic(path, document)
    return path
