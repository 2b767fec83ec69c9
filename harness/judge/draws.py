"""What a judging draws from its secret: the configurations its jobs and hidden tests run.

A judge that runs fixed, small configurations accepts an engine that is right only for them (one seed,
20 steps, sequences of 64, width 128, DP 2, the first epoch). So every judging draws, from its secret
seed, the values a milestone's `[draw]` table names (harness/spec/milestone.py `DrawVar`): seeds (the small ones
people type, 0..100, and large ones up to 2**63 - 1), sequence lengths, widths, layer and step counts,
parallel layouts, and a corpus so small that a job's run crosses an epoch boundary. Job argv reads them
as {name} / {name.key}; hidden tests read them from the JSON file TEMPER_JUDGE_DRAW names (and may draw
more from TEMPER_JUDGE_SEED, the secret itself).

The draw is a pure function of the secret (`random.Random(secret)`, the table's entries in file order), and
the verdict records both: `temper gate ID --judge-seed N` judges again with secret N (the same draw, the same
held-out windows and secret steps), `temper gate ID --draw FILE|JSON` with the values of a recorded draw (a
verdict.json, its "draw" object, or {name: value}) over a fresh secret. Either replays a rejection.

The agent's dry runs (`run_gates`) draw from PUBLIC_SEED instead: one fixed configuration per milestone, the same
at every dry run, and outside the secrets' range (1 .. 2**31 - 2), so no dry run shows a draw a judging makes.

The corpus (`corpus = "epoch-crossing"`, read as {corpus}) is cut by the judge, never by candidate code:
a contiguous slice of the BASE commit's bundled training text (byte tokenizer) at a drawn offset, sized
per job from the job's own batch so that its first epoch ends after a drawn fraction (0.25..0.75) of its
steps, plus a drawn remainder of fewer samples than a step that the loader drops at the epoch's end;
the base's validation text whole. Written as `engine prepare` would (engine/data/format.py: index.json
and raw uint16 shards), read-only to the job, and read by the judge's own evidence and by the base's
`engine batches` like any --data-path. Jobs of the same batch shape (the runs a bitwise milestone
compares) get the same corpus.
"""

from __future__ import annotations

import array
import hashlib
import json
import random
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from harness.spec import DrawVar, JobGate

if TYPE_CHECKING:  # write_corpus's streams; a judging that runs no job never imports torch (2 s a process)
    import torch

__all__ = ["Draw", "DrawError", "draw_values", "load_override", "corpus_tokens", "write_corpus", "SMALL_SEEDS",
           "LARGE_SEEDS", "DRAW_FILE_ENV", "PUBLIC_SEED", "public_draw", "secret_seed"]

SMALL_SEEDS = (0, 100)  # the seeds people type
LARGE_SEEDS = (2**32, 2**63 - 1)  # past 32 bits, up to what a signed 64-bit generator seed holds
DRAW_FILE_ENV = "TEMPER_JUDGE_DRAW"  # hidden tests: the path of the draw's JSON
PUBLIC_SEED = 0  # the dry runs' draw: public, fixed, never a secret (secret_seed is >= 1)
_EPOCH_AT = (0.25, 0.75)  # where in a job's run its first epoch ends


class DrawError(ValueError):
    """An override that does not fit the milestone's [draw] table (the message names the entry)."""


@dataclass(frozen=True)
class Draw:
    """One judging's draw: its secret and the values of every [draw] entry (`seed` always)."""

    secret: int
    values: dict[str, Any] = field(default_factory=dict)
    overridden: tuple[str, ...] = ()  # names given by --draw rather than drawn
    public: bool = False  # drawn from PUBLIC_SEED for a dry run, not from a judging's secret

    def placeholders(self) -> dict[str, str]:
        """{name} and {name.key} for job argv ({corpus} is per job: the job gate fills it)."""
        out: dict[str, str] = {}
        for name, value in self.values.items():
            if name == "corpus":
                continue
            if isinstance(value, dict):
                out |= {f"{name}.{k}": str(v) for k, v in value.items()}
            else:
                out[name] = str(value)
        return out

    def bind(self, gate: JobGate) -> JobGate:
        """The gate with a drawn process count ("{layout.nproc}") replaced by its value."""
        if isinstance(gate.nproc, int):
            return gate
        return gate.model_copy(update={"nproc": int(self.placeholders()[gate.nproc.strip("{}")])})

    def as_json(self) -> dict[str, Any]:
        return {"secret": self.secret, "values": self.values, "overridden": list(self.overridden), "public": self.public}

    def describe(self) -> str:
        shown = ", ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in self.values.items())
        if self.public:
            return f"the public draw (seed {self.secret}; a judging draws anew from a secret): {shown}"
        return f"judge seed {self.secret}: {shown}" + (f" (given: {', '.join(self.overridden)})" if self.overridden else "")


def secret_seed() -> int:
    """A judging's secret: 1 .. 2**31 - 2 (never PUBLIC_SEED)."""
    return secrets.randbelow(2**31 - 2) + 1


def _seed(rng: random.Random, kind: str) -> int:
    if kind == "any":
        kind = rng.choice(("small", "large"))
    lo, hi = SMALL_SEEDS if kind == "small" else LARGE_SEEDS
    return rng.randint(lo, hi)


def _one(rng: random.Random, entry: DrawVar | str) -> Any:
    if entry == "epoch-crossing":
        return {"epoch_at": round(rng.uniform(*_EPOCH_AT), 4), "spare": round(rng.random(), 4),
                "offset": rng.randrange(2**31)}
    if isinstance(entry, str):
        return _seed(rng, entry)
    if entry.range is not None:
        lo, hi = entry.range
        first = -(-lo // entry.multiple)
        return entry.multiple * rng.randint(first, hi // entry.multiple)
    assert entry.choices is not None
    return rng.choice(entry.choices)


def draw_values(table: Mapping[str, DrawVar | str], secret: int, override: Mapping[str, Any] | None = None) -> Draw:
    """The draw of `secret` over `table` (`seed` = "any" unless the table names it); `override` replaces values by
    name after the draw (so the other names still come out as the secret draws them)."""
    rng = random.Random(secret)
    entries = {"seed": "any", **table}
    values = {name: _one(rng, entry) for name, entry in entries.items()}
    given = dict(override or {})
    unknown = sorted(set(given) - set(values))
    if unknown:
        raise DrawError(f"--draw names {unknown}, which the milestone does not draw (it draws {', '.join(values)})")
    for name, value in given.items():
        if type(value) is not type(values[name]) or (isinstance(value, dict) and set(value) != set(values[name])):
            raise DrawError(f"--draw {name}={json.dumps(value)}: the milestone draws values like "
                            f"{json.dumps(values[name])} there")
    return Draw(secret=secret, values={**values, **given}, overridden=tuple(given))


def public_draw(table: Mapping[str, DrawVar | str]) -> Draw:
    """The dry runs' draw over `table`: PUBLIC_SEED's, the same every time."""
    return replace(draw_values(table, PUBLIC_SEED), public=True)


def load_override(text: str) -> dict[str, Any]:
    """--draw's argument: a JSON object or a file holding one; a verdict.json (its "draw"), a recorded draw (its
    "values") or {name: value}."""
    path = Path(text)
    raw = path.read_text(encoding="utf-8") if not text.lstrip().startswith("{") and path.is_file() else text
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise DrawError(f"--draw {text[:80]!r} is neither a JSON object nor a file holding one ({err})") from None
    if isinstance(doc, dict) and isinstance(doc.get("draw"), dict):
        doc = doc["draw"]
    if isinstance(doc, dict) and isinstance(doc.get("values"), dict):
        doc = doc["values"]
    if not isinstance(doc, dict):
        raise DrawError(f"--draw {text[:80]!r}: expected a JSON object of drawn values")
    return doc


def corpus_tokens(expected: Mapping[str, Any], world: int, corpus: Mapping[str, Any]) -> tuple[int, int]:
    """(training tokens of the job's corpus, the step its first epoch ends at) for the job's expected config.

    The engine cuts the stream into samples of seq + 1 tokens that share one token (seq tokens a sample) and
    drops the samples of an epoch that do not fill a global batch G, so k steps and r < G spare samples take
    (k G + r) seq + 1 tokens."""
    seq, mbs = int(expected["seq_length"]), int(expected["micro_batch_size"])
    tp, gas, gbs = int(expected.get("tp", 1)), int(expected.get("grad_accum_steps", 0)), int(expected.get("global_batch_size", 0))
    dp = max(1, world // max(tp, 1))
    batch = gbs if gbs and not gas else mbs * (gas or 1) * dp
    steps = int(expected["num_steps"])
    k = max(1, min(steps - 1, round(steps * float(corpus["epoch_at"]))))
    spare = int(float(corpus["spare"]) * batch)
    return (k * batch + spare) * seq + 1, k


def write_corpus(folder: Path, train: torch.Tensor, validation: torch.Tensor, *, offset: int, tokens: int,
                 description: str) -> Path:
    """A prepared dataset (train/, validation/) in `folder`: `tokens` training tokens from `offset` (modulo what
    fits) of the `train` stream, the whole `validation` stream; byte tokenizer, uint16 shards."""
    if tokens > train.numel():
        raise DrawError(f"the job's corpus needs {tokens} tokens, the base's training text has {train.numel()}: draw "
                        "smaller batches or fewer steps")
    start = offset % (train.numel() - tokens + 1)
    for split, stream in (("train", train[start:start + tokens]), ("validation", validation)):
        out = folder / split
        out.mkdir(parents=True, exist_ok=True)
        raw = array.array("H", stream.tolist()).tobytes()  # little-endian uint16 (byte ids < 258; hosts are little-endian)
        (out / "tokens-00000.bin").write_bytes(raw)
        eos = int((stream == 257).sum())
        index = {"format": "temper-token-shards", "version": 1,
                 "tokenizer": {"name": "bytes-258", "vocab_size": 258, "eos_id": 257, "bos_id": 256, "kind": "bytes", "path": ""},
                 "dtype": "uint16", "byte_order": "little", "num_documents": max(eos, 1),
                 "num_tokens": int(stream.numel()), "num_bytes": int((stream < 256).sum()),
                 "num_records": max(eos, 1), "num_empty": 0,
                 "shards": [{"file": "tokens-00000.bin", "num_tokens": int(stream.numel()),
                             "sha256": hashlib.sha256(raw).hexdigest()}],
                 "source": {"kind": "judge", "description": f"{description}, {split} tokens {start}..{start + stream.numel()}"
                            if split == "train" else f"{description}, validation"}}
        (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return folder
