"""The exact batches of a train job's steps, as the BASE commit's engine states them (never the candidate's).

Part of the judge: nothing here imports the engine. claims/verify_train.py runs
`python -m engine batches` of a checkout of the base commit, sandboxed, with the job's own argv, and
reads back `batches.json` (engine/data/step_batches.py of the base) with `read_batches`: plain JSON, size
limited, every row checked against the sequence length and the vocabulary. The data order is the
base's: a candidate that trains on other tokens, fewer of them or shorter sequences than the engine the
user trusts would have fed is then caught by the exact-step check (harness/judge/claims/exactstep.py).

Why the base and not the candidate: the data order is part of what the judge verifies. Why the base
without the milestone's setup patch: a setup may plant the very defect the agent must repair in the data
pipeline (repair-data-order salts the order with the wall clock); claims/verify_train.py reverse-applies it in the
checkout the batches come from. A base whose engine has no `batches` command (older than this judge)
cannot state its batches: `MISSING_COMMAND` tells claims/verify_train.py, which then skips the check with a flag on
the verdict rather than reject every candidate.
"""

import json
from pathlib import Path
from typing import Sequence

import torch

from harness.judge.baseconfig import flag_values
from harness.judge.claims.exactstep import StepBatch

__all__ = ["BatchesError", "FILE", "MISSING_COMMAND", "batches_argv", "read_batches"]

FILE = "batches.json"
# What argparse of a base without the command prints (exit 2).
MISSING_COMMAND = "invalid choice: 'batches'"
_MAX_BYTES = 1 << 30
# Flags of the job that say where it writes or resumes from; they do not change what a step trains on,
# and the paths need not exist where the batches are stated.
_DROPPED = ("run-dir", "save-dir", "resume", "data-cache-dir")


class BatchesError(ValueError):
    """batches.json is missing, malformed or inconsistent; the message says what."""


def batches_argv(job_argv: Sequence[str], *, steps: Sequence[int], world_size: int, out: Path) -> list[str]:
    """`engine batches` arguments for the train job `job_argv` (its `pretrain ...` argv as the judge rendered it)."""
    args = list(job_argv[1:]) if job_argv and job_argv[0] == "pretrain" else list(job_argv)
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, sep, _ = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in _DROPPED:
            skip = not sep and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        kept.append(arg)
    assert not any(k in flag_values(kept) for k in _DROPPED)
    return ["batches", *kept, "--steps", ",".join(str(s) for s in sorted(steps)), "--world-size", str(world_size),
            "--out", str(out)]


def read_batches(path: Path | str, *, seq_length: int, vocab_size: int) -> dict[int, StepBatch]:
    """{step: StepBatch} of a batches.json; raises BatchesError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise BatchesError(f"{path} was not written")
    if path.stat().st_size > _MAX_BYTES:
        raise BatchesError(f"{path} is larger than the {_MAX_BYTES} bytes the judge reads")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise BatchesError(f"{path} is not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != "temper-batches" or doc.get("version") != 1:
        raise BatchesError(f"{path} is not a temper-batches version 1 document")
    if doc.get("seq_length") != seq_length:
        raise BatchesError(f"{path} states sequences of {doc.get('seq_length')} tokens, the job asked for {seq_length}")
    out: dict[int, StepBatch] = {}
    for key, entry in (doc.get("steps") or {}).items():
        try:
            inputs = torch.tensor(entry["inputs"], dtype=torch.int64)
            labels = torch.tensor(entry["labels"], dtype=torch.int64)
            step = int(key)
        except (KeyError, TypeError, ValueError) as err:
            raise BatchesError(f"{path}: step {key!r} is malformed ({err})") from None
        if inputs.ndim != 2 or inputs.shape != labels.shape or inputs.shape[1] != seq_length or inputs.shape[0] < 1:
            raise BatchesError(f"{path}: step {key} has inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)}, "
                               f"not [rows, {seq_length}]")
        if inputs.min() < 0 or inputs.max() >= vocab_size or ((labels < 0) & (labels != -100)).any() or labels.max() >= vocab_size:
            raise BatchesError(f"{path}: step {key} holds token ids outside the vocabulary of {vocab_size}")
        out[step] = StepBatch(inputs=inputs, labels=labels)
    return out
