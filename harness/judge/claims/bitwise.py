"""Bitwise claims held against the checkpoints, not the printed numbers.

A milestone that claims two runs are the same run (one seed twice, a resumed run and the uninterrupted one,
one layout twice) says so of every number the run carries, not of the ten digits its `[LOSS]` line prints:
a run can print rounded numbers (or numbers no step depends on) while its weights, fp32 masters or Adam moments
drift from one run to the next. So the judge reads both jobs' checkpoints with its own reader
(harness/judge/claims/checkpoint_reader.py: an allow-list unpickler, `weights_only` tensors) and compares them:

- `compare_bitwise`: same layout. Every key either folder stores, at every step both kept: each tensor
  (masters, Adam moments, Muon state, RNG states) in its saved dtype and shape, bit for bit; each saved value
  (step, Adam step, data-loader position) equal in type and value. Only `IGNORED` is left out: the wall-clock
  time a run has spent, which no two runs share, and the saved states of torch's global generators, which torch
  seeds from the OS at start-up (torch 2.13: two runs of one seed differ there) and from which the engine draws
  nothing (a run whose numbers did depend on them differs in its weights, which are compared). A key one folder has and the other lacks, another dtype or
  another shape is a difference. The report names the first differing tensor, how many of its elements differ
  and their largest absolute difference.
- `compare_layouts`: another layout (TP 2 against one process). The judge reassembles each parameter's whole
  fp32 master and moments from the TP and DP shards itself (checkpoint.load_checkpoint) and holds each
  tensor's relative L2 difference ||a - b|| / ||b|| against the milestone's tolerance; the step, Adam step and
  data position must be equal. RNG states are per rank, so they are not compared across layouts. Not element by
  element: Adam's first steps move every element by about lr whatever its gradient's size, so an element whose
  gradient is near zero (a sum that cancels, added in another order by another layout) can move by lr in one
  layout and less in the other; measured on CPU (tiny, fp32, 5 steps), TP 2 against one process: single
  elements up to 2e-5 of their tensor's largest value, relative L2 at most 4e-6 (second moments of norm gains;
  masters 5.6e-7); DP 2: 2.5e-7.

Which checkpoints: the job gate makes every verified train job save (harness/judge/claims/saveplan.py: every step on
CPU, the final pair on GPU); the folders are found from the job's own argv (`--save-dir`, which the judge set or
the milestone named) and the keeper's links. The step both jobs printed last must be among the compared ones.
"""

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.judge.baseconfig import flag_values
from harness.judge.claims.checkpoint_reader import KINDS, CheckpointError, list_checkpoints, load_checkpoint, read_stored, stored_entries

__all__ = ["IGNORED", "Difference", "Comparison", "compare_bitwise", "compare_layouts", "job_checkpoints",
           "diff_tensors", "diff_values"]

# Saved keys (prefixes) no two honest runs share (engine/train.py `_state`): the seconds of wall clock the run has
# spent, and the global generators' states, seeded by torch from the OS at start-up and never drawn from.
IGNORED = ("trainer.elapsed_s", "rng/")
_GROUP_ELEMS = 32 * 2**20  # elements read at a time from each folder (an 8B model's state never sits in memory whole)


@dataclass(frozen=True)
class Difference:
    """One key whose contents differ between the job's checkpoint and the reference's at one step."""

    step: int
    key: str
    what: str  # "bits", "value", "missing", "extra", "dtype", "shape", "tolerance"
    count: int = 1  # elements that differ
    numel: int = 1
    max_abs: float = math.nan  # largest |a - b| over the differing elements (nan: not comparable)
    detail: str = ""

    def __str__(self) -> str:
        where = f"step {self.step}, {self.key}"
        if self.what in ("bits", "tolerance"):
            return (f"{where}: {self.count} of {self.numel} element(s) differ, max abs diff {self.max_abs:.3g}"
                    + (f" ({self.detail})" if self.detail else ""))
        return f"{where}: {self.detail or self.what}"


@dataclass
class Comparison:
    steps: list[int] = field(default_factory=list)  # the steps compared
    keys: int = 0  # keys (tensors and values) compared over all steps
    differences: list[Difference] = field(default_factory=list)
    max_rel: float = 0.0  # compare_layouts: the largest per-tensor relative difference
    worst: str = ""  # compare_layouts: where it was

    @property
    def differing(self) -> int:
        """Elements that differ (every element of a missing, extra, re-typed or re-shaped tensor counts)."""
        return sum(d.count for d in self.differences)

    def describe(self) -> str:
        if not self.differences:
            return f"{self.keys} key(s) over step(s) {_span(self.steps)} equal"
        first = self.differences[0]
        more = len(self.differences) - 1
        return f"first difference: {first}" + (f"; {more} more key(s) differ" if more else "")


def _span(steps: Sequence[int]) -> str:
    return "none" if not steps else f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])


def job_checkpoints(argv: Sequence[str], kept: Iterable[Path] = ()) -> dict[int, Path]:
    """step -> checkpoint folder of a train job: its `--save-dir` (the judge's or the milestone's) and what the
    judge's keeper linked out of the job's sight (harness/judge/claims/keeper.py), the keeper's copy first."""
    found: dict[int, Path] = {}
    save_dir = flag_values(argv).get("save-dir")
    for path in [*(list_checkpoints(Path(save_dir)) if isinstance(save_dir, str) else []), *kept]:
        found[int(path.name.removeprefix("step_"))] = Path(path)
    return found


# --------------------------------------------------------------------------------------------- element-wise


def diff_tensors(a: torch.Tensor, b: torch.Tensor) -> tuple[int, float]:
    """(elements whose bits differ, their largest |a - b|) of two tensors of one dtype and shape. Bits, not values:
    -0.0 against 0.0 and two NaNs of other payloads differ; NaN against NaN of the same bits does not."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"diff_tensors needs one dtype and shape, got {a.dtype}{tuple(a.shape)} and {b.dtype}{tuple(b.shape)}")
    width = a.element_size()
    rows_a = a.detach().contiguous().reshape(-1).view(torch.uint8).view(-1, width)
    rows_b = b.detach().contiguous().reshape(-1).view(torch.uint8).view(-1, width)
    differ = (rows_a != rows_b).any(dim=1)
    count = int(differ.sum())
    if not count:
        return 0, 0.0
    if a.dtype.is_complex or a.dtype == torch.bool:
        return count, math.nan
    flat_a, flat_b = a.reshape(-1)[differ].double(), b.reshape(-1)[differ].double()
    return count, float((flat_a - flat_b).abs().max())


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def diff_values(a: Any, b: Any) -> str:
    """"" when two saved values are the same (types equal, floats in their bits, tensors bit for bit,
    containers element by element), else what differs."""
    if type(a) is not type(b):
        return f"{type(a).__name__} {a!r} against {type(b).__name__} {b!r}"
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"tensor {a.dtype}{tuple(a.shape)} against {b.dtype}{tuple(b.shape)}"
        count, _ = diff_tensors(a, b)
        return f"{count} element(s) differ" if count else ""
    if isinstance(a, float):
        return "" if _float_bits(a) == _float_bits(b) else f"{a!r} against {b!r}"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{len(a)} items against {len(b)}"
        return next((f"[{i}]: {d}" for i, (x, y) in enumerate(zip(a, b)) if (d := diff_values(x, y))), "")
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"keys {sorted(map(str, a))} against {sorted(map(str, b))}"
        return next((f"[{k!r}]: {d}" for k in a if (d := diff_values(a[k], b[k]))), "")
    return "" if a == b else f"{a!r} against {b!r}"


# --------------------------------------------------------------------------------------------- same layout


def _groups(entries: Mapping[str, tuple[str, Any, tuple[int, ...]]]) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for key in sorted(entries):
        numel = math.prod(entries[key][2]) if entries[key][0] == "tensor" else 1
        if groups[-1] and size + numel > _GROUP_ELEMS:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += numel
    return groups


def _compare_step(step: int, ours: Path, ref: Path, out: Comparison) -> None:
    mine, theirs = stored_entries(ours), stored_entries(ref)
    both: dict[str, tuple[str, Any, tuple[int, ...]]] = {}
    for key in sorted(set(mine) | set(theirs)):
        if key.startswith(IGNORED):
            continue
        a, b = mine.get(key), theirs.get(key)
        numel = max(math.prod(e[2]) if e and e[0] == "tensor" else 1 for e in (a, b))
        if a is None or b is None:
            out.differences.append(Difference(step, key, "missing" if a is None else "extra", count=numel, numel=numel,
                                              detail="only the reference job saved it" if a is None else
                                              "the reference job did not save it"))
        elif a[0] != b[0] or a[1] != b[1]:
            out.differences.append(Difference(step, key, "dtype", count=numel, numel=numel,
                                              detail=f"stored as {a[1] or 'a value'}, the reference as {b[1] or 'a value'}"))
        elif a[2] != b[2]:
            out.differences.append(Difference(step, key, "shape", count=numel, numel=numel,
                                              detail=f"shape {a[2]}, the reference's {b[2]}"))
        else:
            both[key] = a
    out.keys += len(both)
    for group in _groups(both):
        wanted = {k: both[k] for k in group}
        a_state, b_state = read_stored(ours, wanted), read_stored(ref, wanted)
        for key in group:
            a, b = a_state[key], b_state[key]
            if both[key][0] == "tensor":
                count, max_abs = diff_tensors(a, b)
                if count:
                    out.differences.append(Difference(step, key, "bits", count=count, numel=a.numel(), max_abs=max_abs))
            elif detail := diff_values(a, b):
                out.differences.append(Difference(step, key, "value", detail=detail))


def compare_bitwise(ours: Mapping[int, Path], ref: Mapping[int, Path], steps: Sequence[int]) -> Comparison:
    """Every stored key of the checkpoints of `steps` (each in both mappings), bit for bit (module doc)."""
    out = Comparison(steps=sorted(steps))
    for step in out.steps:
        _compare_step(step, ours[step], ref[step], out)
    return out


# --------------------------------------------------------------------------------------------- across layouts


def _trainer_values(path: Path) -> dict[str, Any]:
    entries = {k: e for k, e in stored_entries(path).items() if k.startswith("trainer.") and not k.startswith(IGNORED)}
    return read_stored(path, entries)


def compare_layouts(ours: Mapping[int, Path], ref: Mapping[int, Path], steps: Sequence[int], tolerance: float) -> Comparison:
    """Whole fp32 masters and Adam moments reassembled from each layout's shards, per tensor ||a - b|| / ||b||
    against `tolerance`; the trainer's values (step, Adam step, data position) exactly."""
    out = Comparison(steps=sorted(steps))
    for step in out.steps:
        a_values, b_values = _trainer_values(ours[step]), _trainer_values(ref[step])
        for key in sorted(set(a_values) | set(b_values)):
            if key not in a_values or key not in b_values:
                out.differences.append(Difference(step, key, "missing" if key not in a_values else "extra",
                                                  detail="saved by one layout only"))
            elif detail := diff_values(a_values[key], b_values[key]):
                out.differences.append(Difference(step, key, "value", detail=detail))
        a, b = load_checkpoint(ours[step]), load_checkpoint(ref[step])
        vocab = int(a.config["vocab_size"])
        for kind in KINDS:
            for name in sorted(set(a.tensors[kind]) | set(b.tensors[kind])):
                key = f"{kind}/{name}"
                x, y = a.tensors[kind].get(name), b.tensors[kind].get(name)
                if x is None or y is None:
                    out.differences.append(Difference(step, key, "missing" if x is None else "extra"))
                    continue
                if name in ("embed.weight", "lm_head"):  # rows past the vocabulary pad to each TP size's multiple
                    x, y = x[:vocab], y[:vocab]
                if x.shape != y.shape:
                    out.differences.append(Difference(step, key, "shape", detail=f"shape {tuple(x.shape)}, the reference's {tuple(y.shape)}"))
                    continue
                out.keys += 1
                diff = (x.double() - y.double()).abs()
                max_abs = float(diff.max()) if diff.numel() else 0.0
                norm = float(y.double().norm())
                rel = float(diff.norm()) / norm if norm > 0 else 0.0 if max_abs == 0 else math.inf
                if math.isnan(rel):
                    rel = math.inf
                if rel > out.max_rel:
                    out.max_rel, out.worst = rel, f"step {step}, {key}"
                if rel > tolerance:
                    out.differences.append(Difference(step, key, "tolerance", count=int((diff > 0).sum()), numel=x.numel(),
                                                      max_abs=max_abs, detail=f"relative L2 {rel:.3g} > {tolerance:g}"))
    return out

