"""Packing the token stream into samples and dealing them to data-parallel ranks, resumably.

Why and how: docs/engine/data.md, section `engine/data/loader.py`.
"""

import hashlib
from typing import Any, Iterator, Protocol

import torch

from engine.errors import ConfigError

__all__ = ["TokenSource", "PackedSamples", "BatchLoader", "deal", "check_order_identity", "DataMismatch", "eval_batches", "check_eval_samples",
           "LOADER_STATE_VERSION"]

LOADER_STATE_VERSION = 1


class TokenSource(Protocol):
    """What PackedSamples reads: TokenShards (mmap) or InMemoryTokens."""

    num_tokens: int
    num_bytes: int
    eos_id: int
    tokenizer_name: str
    fingerprint: str

    def tokens(self, start: int, length: int) -> torch.Tensor: ...


class PackedSamples:
    """Samples of seq_length + 1 tokens; sample i is tokens [i * seq_length, i * seq_length + seq_length + 1)."""

    def __init__(self, shards: TokenSource, seq_length: int):
        if seq_length <= 0:
            raise ConfigError("--seq-length", seq_length, "use a positive number", "is out of range")
        self.shards = shards
        self.seq_length = seq_length
        self._len = max(0, (shards.num_tokens - 1) // seq_length)
        self.fingerprint = hashlib.sha256(f"{shards.fingerprint}:{seq_length}".encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> torch.Tensor:
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"sample {i} out of range for {self._len} samples")
        return self.shards.tokens(i * self.seq_length, self.seq_length + 1)

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [n, seq], labels [n, seq]) of the given samples, labels = inputs shifted by one."""
        rows = torch.stack([self[i] for i in indices])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def __repr__(self) -> str:
        return f"PackedSamples({len(self)} x {self.seq_length + 1} tokens from {self.shards!r})"


def _epoch_seed(seed: int, epoch: int) -> int:
    """Decorrelated 63-bit seed per (seed, epoch); stable across Python runs (no hash())."""
    return int.from_bytes(hashlib.sha256(f"temper-data:{seed}:{epoch}".encode()).digest()[:8], "little") >> 1


class BatchLoader:
    """Deterministic, resumable global batches of `samples` for one DP rank (see the module doc)."""

    def __init__(self, samples: PackedSamples, *, micro_batch_size: int, grad_accum_steps: int, dp_rank: int,
                 dp_size: int, seed: int):
        if micro_batch_size <= 0 or grad_accum_steps <= 0 or dp_size <= 0:
            raise ConfigError("--global-batch-size", (micro_batch_size, grad_accum_steps, dp_size),
                              "use positive --micro-batch-size, --grad-accum-steps and data-parallel size", "is out of range")
        assert 0 <= dp_rank < dp_size, f"dp_rank {dp_rank} outside dp_size {dp_size}"
        self.samples = samples
        self.micro_batch_size = micro_batch_size
        self.grad_accum_steps = grad_accum_steps
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.global_batch_size = micro_batch_size * grad_accum_steps * dp_size
        self.steps_per_epoch = len(samples) // self.global_batch_size
        if self.steps_per_epoch == 0:
            seq = samples.seq_length
            fits = max(0, samples.shards.num_tokens - 1) // self.global_batch_size
            raise ConfigError("--global-batch-size", self.global_batch_size,
                              f"use a smaller --global-batch-size (at most {len(samples)}) or --seq-length "
                              f"(at most {fits} for this batch), or more data",
                              f"needs {self.global_batch_size} samples of --seq-length {seq} per step, but the data "
                              f"({samples.shards.num_tokens} tokens) has only {len(samples)}")
        self.epoch = 0
        self.step_in_epoch = 0
        self._perm_epoch = -1
        self._perm = torch.empty(0, dtype=torch.int64)

    @property
    def consumed_samples(self) -> int:
        """Samples every rank together has consumed since the start of training (dropped tails excluded)."""
        return (self.epoch * self.steps_per_epoch + self.step_in_epoch) * self.global_batch_size

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(_epoch_seed(self.seed, self.epoch))
            self._perm = torch.randperm(len(self.samples), generator=gen)
            self._perm_epoch = self.epoch
        return self._perm

    def global_rows(self) -> list[int]:
        """Sample indices of the next step's whole global batch (all ranks), in global-batch order."""
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0
        g = self.global_batch_size
        return self._permutation()[self.step_in_epoch * g:(self.step_in_epoch + 1) * g].tolist()

    def next_global_rows(self) -> list[int]:
        """global_rows() of the next step, and move past it (what `engine batches` walks without training)."""
        rows = self.global_rows()
        self.step_in_epoch += 1
        return rows

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The grad_accum_steps micro-batches (inputs, labels), each [mbs, seq], of this rank's next step."""
        rows = self.next_global_rows()
        return [self.samples.batch(part) for part in deal(rows, self.micro_batch_size, self.grad_accum_steps,
                                                          self.dp_rank, self.dp_size)]

    def state_dict(self) -> dict[str, Any]:
        """Rank-independent position: every rank holds the same dict, so one copy resumes all."""
        return {"version": LOADER_STATE_VERSION, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "consumed_samples": self.consumed_samples, "seed": self.seed, "global_batch_size": self.global_batch_size,
                "num_samples": len(self.samples), "fingerprint": self.samples.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where `state` left off; refuses a state from other data, seed or batch."""
        if state.get("version") != LOADER_STATE_VERSION:
            raise ConfigError("--resume", f"loader state version {state.get('version')!r}",
                              f"resume with an engine that writes version {LOADER_STATE_VERSION}, or start a fresh run",
                              "is not readable")
        if state["fingerprint"] != self.samples.fingerprint or state["num_samples"] != len(self.samples):
            raise DataMismatch(f"this run's data ({len(self.samples)} samples of --seq-length {self.samples.seq_length}, "
                               f"fingerprint {self.samples.fingerprint}) is not the data of the checkpoint it resumes "
                               f"({state['num_samples']} samples, fingerprint {state['fingerprint']}): resume with the "
                               "same dataset, tokenizer and --seq-length as the checkpoint, or start a fresh run")
        check_order_identity(state, seed=self.seed, global_batch_size=self.global_batch_size)
        epoch, step = int(state["epoch"]), int(state["step_in_epoch"])
        if not (epoch >= 0 and 0 <= step <= self.steps_per_epoch):
            raise ConfigError("--resume", f"loader position epoch {epoch} step {step}", "resume from an intact checkpoint",
                              "is out of range")
        self.epoch, self.step_in_epoch = epoch, step
        assert self.consumed_samples == state["consumed_samples"], "inconsistent loader state"


class DataMismatch(ConfigError):
    """A resume on other data than the checkpoint's. A ConfigError (one line, exit 2) whose text is about the data,
    not posing as the value of one flag."""

    def __init__(self, message: str):
        self.field, self.value, self.fix = "--resume", None, message
        ValueError.__init__(self, message)


def check_order_identity(state: dict[str, Any], *, seed: int, global_batch_size: int) -> None:
    """A loader position means the same rows only for the seed and global batch size it was taken with."""
    if state["seed"] != seed:
        raise ConfigError("--seed", seed, f"resume with --seed {state['seed']} (the data order depends on it)",
                          "differs from the checkpoint's")
    if state["global_batch_size"] != global_batch_size:
        raise ConfigError("--global-batch-size", global_batch_size,
                          f"resume with --global-batch-size {state['global_batch_size']} (any mbs x GAS x DP layout "
                          "giving it resumes exactly)", "differs from the checkpoint's")


def deal(rows: list[int], micro_batch_size: int, grad_accum_steps: int, dp_rank: int, dp_size: int) -> list[list[int]]:
    """DP rank `dp_rank`'s micro-batches of a step's global rows: micro-batch m takes rows
    [(m * dp + r) * mbs, (m * dp + r + 1) * mbs) (module doc), so the ranks' rows are disjoint and cover the batch."""
    mbs, dp, r = micro_batch_size, dp_size, dp_rank
    return [rows[(m * dp + r) * mbs:(m * dp + r + 1) * mbs] for m in range(grad_accum_steps)]


def check_eval_samples(samples: PackedSamples, num_samples: int) -> None:
    """An evaluation reads the first `num_samples` validation samples: refuse more than there are."""
    if num_samples > len(samples):
        raise ConfigError("--eval-samples", num_samples, f"use at most {len(samples)} (or a smaller --seq-length, or more "
                          "validation data)", f"needs more validation samples than the {len(samples)} of "
                          f"--seq-length {samples.seq_length} there are")


def eval_batches(samples: PackedSamples, *, num_samples: int, micro_batch_size: int, dp_rank: int,
                 dp_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Validation micro-batches, unshuffled and identical every evaluation: the first `num_samples`
    samples, sample i on DP rank i % dp_size, in micro-batches of up to micro_batch_size. The ranks
    together cover those samples once whatever mbs and DP are, so a summed loss over them depends on
    num_samples alone (GAS never enters; TP ranks of one DP rank read the same rows)."""
    check_eval_samples(samples, num_samples)
    mine = list(range(dp_rank, num_samples, dp_size))
    for start in range(0, len(mine), micro_batch_size):
        yield samples.batch(mine[start:start + micro_batch_size])
