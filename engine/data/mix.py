"""--data-mix: several prepared datasets sampled by weight, deterministic, resumable, with an anneal phase.

Why and how: docs/engine/data.md, section `engine/data/mix.py`.
"""

import hashlib
import json
from typing import Any

import torch

from engine.config import EngineConfig, parse_mix
from engine.data.loader import BatchLoader, DataMismatch, PackedSamples, check_order_identity, deal
from engine.errors import ConfigError

__all__ = ["MixedSamples", "MixLoader", "make_loader", "mix_line", "MIX_STATE_VERSION"]

MIX_STATE_VERSION = 1


def _seed(*parts: object) -> int:
    """A 63-bit seed from the parts, stable across Python runs (no hash())."""
    text = ":".join(str(p) for p in ("temper-mix",) + parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class MixedSamples:
    """The samples of several sources as one sequence (module doc); PackedSamples' surface for the loader, the
    trainer and `engine batches`."""

    def __init__(self, sources: list[tuple[str, PackedSamples]], cfg: EngineConfig):
        self.names = [name for name, _ in sources]
        self.parts = [samples for _, samples in sources]
        self.shards = self.parts[0].shards  # the EOS id, the tokenizer: the same for every source (build_data checks)
        self.seq_length = cfg.seq_length
        self.offsets = [0]
        for part in self.parts:
            self.offsets.append(self.offsets[-1] + len(part))
        by_name = dict(parse_mix(cfg.data_mix, "--data-mix"))
        self.weights = [by_name[n] for n in self.names]
        anneal = dict(parse_mix(cfg.data_mix_anneal, "--data-mix-anneal")) if cfg.data_mix_anneal else None
        self.anneal_weights = [anneal.get(n, 0.0) for n in self.names] if anneal is not None else None
        # steps 1..switch_step train on --data-mix, the rest on --data-mix-anneal
        self.switch_step = round(cfg.data_mix_anneal_at * cfg.num_steps) if anneal is not None else None
        ident = {"sources": [p.fingerprint for p in self.parts], "weights": self.weights,
                 "anneal": self.anneal_weights, "switch": self.switch_step}
        self.fingerprint = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return self.offsets[-1]

    def locate(self, row: int) -> tuple[int, int]:
        """(source, sample index within it) of a global row."""
        for s in range(len(self.parts)):
            if row < self.offsets[s + 1]:
                return s, row - self.offsets[s]
        raise IndexError(f"row {row} out of range for {len(self)} samples")

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.parts[s][j] for s, j in map(self.locate, indices)])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def weights_at(self, step: int) -> list[float]:
        """The weights of 0-based step `step` (printed step step + 1)."""
        if self.switch_step is not None and step >= self.switch_step:
            return self.anneal_weights
        return self.weights


class MixLoader:
    """Deterministic, resumable global batches of a MixedSamples for one DP rank (module doc)."""

    def __init__(self, samples: MixedSamples, *, micro_batch_size: int, grad_accum_steps: int, dp_rank: int,
                 dp_size: int, seed: int):
        self.samples = samples
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.global_batch_size = micro_batch_size * grad_accum_steps * dp_size
        self.steps = 0  # global batches handed out
        self.cursors = [[0, 0] for _ in samples.parts]  # per source: epoch, position in that epoch's permutation
        self.source_tokens = [0] * len(samples.parts)  # tokens trained on so far, per source (labels of the batches)
        self._perms: dict[int, tuple[int, torch.Tensor]] = {}

    def _permutation(self, source: int, epoch: int) -> torch.Tensor:
        cached = self._perms.get(source)
        if cached is None or cached[0] != epoch:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(_seed(self.seed, self.samples.parts[source].fingerprint, epoch))
            cached = (epoch, torch.randperm(len(self.samples.parts[source]), generator=gen))
            self._perms[source] = cached
        return cached[1]

    def next_global_rows(self) -> list[int]:
        """Rows of the next step's whole global batch (all ranks), and move past it."""
        weights = torch.tensor(self.samples.weights_at(self.steps), dtype=torch.float64)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(_seed(self.seed, "step", self.steps))
        picks = torch.multinomial(weights, self.global_batch_size, replacement=True, generator=gen).tolist()
        rows = []
        for s in picks:
            epoch, pos = self.cursors[s]
            if pos == len(self.samples.parts[s]):
                epoch, pos = epoch + 1, 0
            rows.append(self.samples.offsets[s] + int(self._permutation(s, epoch)[pos]))
            self.cursors[s] = [epoch, pos + 1]
            self.source_tokens[s] += self.samples.seq_length
        self.steps += 1
        return rows

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        rows = self.next_global_rows()
        return [self.samples.batch(part) for part in deal(rows, self.micro_batch_size, self.grad_accum_steps,
                                                          self.dp_rank, self.dp_size)]

    def tokens_by_source(self) -> dict[str, int]:
        return dict(zip(self.samples.names, self.source_tokens))

    def state_dict(self) -> dict[str, Any]:
        """Rank-independent; flat scalars and strings (the checkpoint stores them as they are)."""
        return {"version": MIX_STATE_VERSION, "kind": "mix", "steps": self.steps, "cursors": json.dumps(self.cursors),
                "source_tokens": json.dumps(self.source_tokens), "seed": self.seed,
                "global_batch_size": self.global_batch_size, "fingerprint": self.samples.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != MIX_STATE_VERSION or state.get("kind") != "mix":
            raise ConfigError("--resume", f"loader state {state.get('kind', 'single')!r} version {state.get('version')!r}",
                              "resume with the checkpoint's data flags, or start a fresh run", "is not a --data-mix state "
                              f"this engine reads (version {MIX_STATE_VERSION})")
        if state["fingerprint"] != self.samples.fingerprint:
            raise DataMismatch(f"this run's --data-mix (fingerprint {self.samples.fingerprint}) is not the mix of the "
                               f"checkpoint it resumes (fingerprint {state['fingerprint']}): resume with the checkpoint's "
                               "sources, weights, anneal and --num-steps, or start a fresh run")
        check_order_identity(state, seed=self.seed, global_batch_size=self.global_batch_size)
        self.steps = int(state["steps"])
        self.cursors = [list(map(int, c)) for c in json.loads(state["cursors"])]
        self.source_tokens = [int(n) for n in json.loads(state["source_tokens"])]


def make_loader(samples: PackedSamples | MixedSamples, *, micro_batch_size: int, grad_accum_steps: int, dp_rank: int,
                dp_size: int, seed: int) -> BatchLoader | MixLoader:
    """The loader of the run's training samples: one source or a --data-mix (the trainer and `engine batches`)."""
    kind = MixLoader if isinstance(samples, MixedSamples) else BatchLoader
    return kind(samples, micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps, dp_rank=dp_rank,
                dp_size=dp_size, seed=seed)


def mix_line(step: int, tokens: dict[str, int]) -> str:
    """`[MIX] step=N tokens <source>=N ...`: the tokens each source has given so far, beside the [LOSS] line."""
    return f"[MIX] step={step} tokens " + " ".join(f"{name}={n}" for name, n in tokens.items())
