"""`build_data`: the training and validation samples of a run, from wherever the config says.

Why and how: docs/engine/data.md, section `engine/data/sources.py`.
"""

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig, parse_mix
from engine.data.embedded import embedded_file, read_embedded
from engine.data.format import COMPLETE_FILE, FAILED_FILE, INDEX_FILE, write_json_atomic
from engine.data.loader import PackedSamples, check_eval_samples
from engine.data.mix import MixedSamples
from engine.data.prepare import TextRenderer, check_vocab, is_local_source, prepare_from_config, resolve_local_splits
from engine.data.shards import InMemoryTokens, TokenShards, read_index
from engine.data.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from engine.errors import ConfigError

__all__ = ["DataBundle", "build_data", "cache_key", "default_cache_dir", "embedded_tokens", "PREPARE_WAIT_TIMEOUT_S"]

# How long non-zero ranks wait for rank 0 to prepare --hf-dataset. Preparing ~10B tokens on one
# host takes hours; beyond that, `prepare` ahead of time is the right tool anyway.
PREPARE_WAIT_TIMEOUT_S = 6 * 3600.0
_POLL_S = 1.0
# A failed.json older than this (relative to when we started waiting) is from an earlier launch.
_STALE_FAILURE_S = 120.0


@dataclass(frozen=True)
class DataBundle:
    tokenizer: Tokenizer
    train: PackedSamples
    validation: PackedSamples | None
    description: str


def _describe(kind: str, train: PackedSamples | MixedSamples, val: PackedSamples | None, tokenizer: Tokenizer) -> str:
    def part(name: str, s: PackedSamples) -> str:
        return f"{name} {s.shards.num_tokens:,} tokens / {s.shards.num_bytes:,} bytes = {len(s):,} samples of {s.seq_length}"

    trains = ([part(f"train {name}", p) for name, p in zip(train.names, train.parts)]
              if isinstance(train, MixedSamples) else [part("train", train)])
    parts = trains + ([part("validation", val)] if val is not None else ["no validation"])
    return f"{kind}; {'; '.join(parts)}; tokenizer {tokenizer.name} (vocab {tokenizer.vocab_size}, eos {tokenizer.eos_id})"


# --- 3. embedded corpus ---------------------------------------------------------------------------


def embedded_tokens(split: str, tokenizer: Tokenizer, renderer: TextRenderer) -> InMemoryTokens:
    """One embedded split as an in-memory stream, documents joined with EOS exactly as `prepare`."""
    records = read_embedded(split)
    renderer.check_columns(list(records[0]), "the embedded corpus")
    ids: list[int] = []
    num_bytes = docs = 0
    texts = []
    for record in records:
        text = renderer.render(record)
        if text:
            texts.append(text)
            num_bytes += len(text.encode("utf-8"))
    for doc in tokenizer.encode_batch(texts):
        ids.extend(doc)
        ids.append(tokenizer.eos_id)
        docs += 1
    return InMemoryTokens(torch.tensor(ids, dtype=torch.int64), eos_id=tokenizer.eos_id, vocab_size=tokenizer.vocab_size,
                          tokenizer_name=tokenizer.name, num_bytes=num_bytes, num_documents=docs,
                          description=f"embedded corpus {split} ({embedded_file(split).name})")


# --- 1. prepared folder ---------------------------------------------------------------------------


def _tokenizer_for(index: dict[str, Any], cfg: EngineConfig, flag_value: str) -> Tokenizer:
    """The tokenizer that wrote `index`: --tokenizer-path if given (must match), else the one the
    index names (the byte tokenizer, or the file it recorded, if it still matches)."""
    recorded = index["tokenizer"]
    if cfg.tokenizer_path:
        tok = load_tokenizer(cfg.tokenizer_path)
    elif recorded["name"] == ByteTokenizer().name:
        tok = ByteTokenizer()
    elif recorded.get("path") and Path(recorded["path"]).is_file():
        tok = load_tokenizer(recorded["path"])
    else:
        raise ConfigError("--tokenizer-path", "", f"pass the tokenizer {flag_value} was prepared with "
                          f"({recorded['name']}, recorded path {recorded.get('path') or 'none'})", "is needed")
    if tok.name != recorded["name"] or tok.eos_id != int(recorded["eos_id"]):
        raise ConfigError("--tokenizer-path", cfg.tokenizer_path or recorded.get("path", ""),
                          f"pass the tokenizer {flag_value} was prepared with ({recorded['name']}), or prepare again",
                          f"is {tok.name} (eos {tok.eos_id}), not the shards' {recorded['name']} (eos {recorded['eos_id']})")
    return tok


def _from_folder(folder: Path, cfg: EngineConfig, flag: str,
                 tokenizer: Tokenizer | None = None) -> tuple[Tokenizer, PackedSamples, PackedSamples | None]:
    train_dir, val_dir = folder / "train", folder / "validation"
    if not (train_dir / INDEX_FILE).is_file():
        raise ConfigError(flag, str(folder), f"run `python -m engine prepare --out {folder}` first (it writes train/ and "
                          "validation/)", "has no prepared train/ split")
    if tokenizer is None:
        tokenizer = _tokenizer_for(read_index(train_dir), cfg, str(folder))
    check_vocab(tokenizer, cfg.vocab_size)
    train = PackedSamples(TokenShards(train_dir), cfg.seq_length)
    val = None
    if (val_dir / INDEX_FILE).is_file():
        val_shards = TokenShards(val_dir)
        if val_shards.tokenizer_name != train.shards.tokenizer_name:
            raise ConfigError(flag, str(folder), "prepare both splits with one tokenizer", "has train/ and validation/ "
                              "from different tokenizers")
        val = PackedSamples(val_shards, cfg.seq_length)
    return tokenizer, train, val


# --- 2. prepared on the fly -----------------------------------------------------------------------


def _local_stamp(source: str, flag: str) -> list[Any]:
    """Sizes and mtimes of a local source's files, so edited files get a new cache key."""
    if not source or not is_local_source(source):
        return []
    path = Path(source).expanduser()
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        files = sorted(str(p) for p in path.rglob("*") if p.is_file())
    else:
        files = sorted(f for split_files in resolve_local_splits(source, flag).values() for f in split_files)
    return [(str(Path(f).resolve()), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]


def cache_key(cfg: EngineConfig, tokenizer: Tokenizer) -> str:
    """Folder name under the cache for this config's --hf-dataset preparation."""
    def where(source: str) -> str:
        return str(Path(source).expanduser().resolve()) if source and is_local_source(source) else source

    ident = {"v": 1, "source": where(cfg.hf_dataset), "config": cfg.hf_dataset_config, "split": cfg.hf_split,
             "val_source": where(cfg.hf_val_dataset), "val_split": cfg.hf_val_split,
             "text_field": "" if cfg.hf_text_template else cfg.hf_text_field, "template": cfg.hf_text_template,
             "tokenizer": tokenizer.name, "eos": tokenizer.eos_id, "want_val": cfg.eval_samples > 0,
             "files": _local_stamp(cfg.hf_dataset, "--hf-dataset") + _local_stamp(cfg.hf_val_dataset, "--hf-val-dataset")}
    return "hf-" + hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]


def _prepare_shared(cfg: EngineConfig, folder: Path, is_preparer: bool, timeout_s: float, world_size: int) -> None:
    """Rank 0 prepares `folder` unless complete; the others wait for complete.json (module doc).
    A single process records no failure marker, so bad input leaves nothing behind."""
    complete, failed = folder / COMPLETE_FILE, folder / FAILED_FILE
    if complete.is_file():
        return
    if is_preparer:
        if failed.is_file():
            failed.unlink()
        try:
            prepare_from_config(cfg, out_dir=folder, num_proc=max(1, min(8, os.cpu_count() or 1)))
        except BaseException as err:  # recorded for the waiting ranks, then re-raised
            if world_size == 1:
                raise
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(failed, {"error": str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"})
            raise
        write_json_atomic(complete, {"splits": sorted(p.name for p in folder.iterdir() if (p / INDEX_FILE).is_file())})
        return
    start = time.time()
    while not complete.is_file():
        if failed.is_file() and failed.stat().st_mtime >= start - _STALE_FAILURE_S:
            error = json.loads(failed.read_text(encoding="utf-8"))["error"]
            raise ConfigError("--hf-dataset", cfg.hf_dataset, f"fix what rank 0 reported: {error}",
                              "could not be prepared by rank 0")
        if time.time() - start > timeout_s:
            raise ConfigError("--data-cache-dir", str(folder.parent),
                              "put it on a filesystem every rank shares, or run `python -m engine prepare --out DIR` once "
                              "and pass --data-path DIR", f"got no prepared data from rank 0 within {timeout_s:.0f} s")
        time.sleep(_POLL_S)


# --- entry point ----------------------------------------------------------------------------------


def default_cache_dir(cfg: EngineConfig) -> Path:
    """Where a run caches the --hf-dataset it prepares: --data-cache-dir, else <run_dir>/data (run_dir: --run-dir,
    else outputs/<preset>), so a later command with the run's config (export-int8's evaluation) finds it."""
    return Path(cfg.data_cache_dir) if cfg.data_cache_dir else Path(cfg.run_dir or f"outputs/{cfg.preset}") / "data"



def _mixed_folders(cfg: EngineConfig) -> tuple[Tokenizer, MixedSamples, PackedSamples | None]:
    """--data-mix: every source a folder of `engine prepare`, all of one tokenizer; validation is the first's."""
    tokenizer = None
    sources, val = [], None
    for i, (path, _) in enumerate(parse_mix(cfg.data_mix, "--data-mix")):
        folder = Path(path).expanduser()
        if not (folder / "train" / INDEX_FILE).is_file():
            raise ConfigError("--data-mix", cfg.data_mix, f"prepare it first (`python -m engine prepare --out {path}`), "
                              "or fix the path", f"names {path!r}, which has no prepared train/ split")
        tok, train, source_val = _from_folder(folder, cfg, "--data-mix", tokenizer)
        first = sources[0][1].shards if sources else train.shards
        if (train.shards.tokenizer_name, train.shards.eos_id) != (first.tokenizer_name, first.eos_id):
            raise ConfigError("--data-mix", cfg.data_mix, "prepare every source with one tokenizer", f"mixes "
                              f"{path!r} ({train.shards.tokenizer_name}) with {sources[0][0]!r} ({first.tokenizer_name})")
        tokenizer = tokenizer or tok
        val = source_val if i == 0 else val
        sources.append((path, train))
    return tokenizer, MixedSamples(sources, cfg), val


def build_data(cfg: EngineConfig, *, cache_dir: Path, dp_rank: int, dp_size: int, global_rank: int | None = None,
               world_size: int | None = None, wait_timeout_s: float = PREPARE_WAIT_TIMEOUT_S) -> DataBundle:
    """Tokenizer plus packed train / validation samples for `cfg` (see the module doc for the order).

    `global_rank` (default: dp_rank) picks the one process that prepares an --hf-dataset: pass it
    under tensor parallelism, where several processes share dp_rank 0. Raises ConfigError for a
    tokenizer larger than --vocab-size, for missing validation data while --eval-samples > 0, and for
    fewer validation samples than --eval-samples.
    """
    assert 0 <= dp_rank < dp_size, f"dp_rank {dp_rank} outside dp_size {dp_size}"
    rank = dp_rank if global_rank is None else global_rank
    if cfg.data_mix:
        tokenizer, train, val = _mixed_folders(cfg)
        kind = f"data mix {cfg.data_mix}" + (f", anneal {cfg.data_mix_anneal} after step {train.switch_step}"
                                               if cfg.data_mix_anneal else "") + " (validation: the first source's)"
        missing = ("--data-mix", cfg.data_mix, "list first a source prepared with a validation split, or pass "
                   "--eval-samples 0")
    elif cfg.data_path:
        folder = Path(cfg.data_path).expanduser()
        tokenizer, train, val = _from_folder(folder, cfg, "--data-path")
        kind = f"prepared shards {folder}"
        missing = ("--data-path", cfg.data_path, f"prepare it with a validation split (`python -m engine prepare --out "
                   f"{folder}` with --hf-val-split / --hf-val-dataset), or pass --eval-samples 0")
    elif cfg.hf_dataset:
        tokenizer = load_tokenizer(cfg.tokenizer_path)
        check_vocab(tokenizer, cfg.vocab_size)
        folder = Path(cache_dir) / cache_key(cfg, tokenizer)
        _prepare_shared(cfg, folder, rank == 0, wait_timeout_s, dp_size if world_size is None else world_size)
        _, train, val = _from_folder(folder, cfg, "--data-cache-dir", tokenizer)
        kind = f"{cfg.hf_dataset} [{cfg.hf_split}] prepared in {folder}"
        missing = ("--hf-val-split", cfg.hf_val_split, "name an existing split, or pass --hf-val-dataset FILES, "
                   "or --eval-samples 0")
    else:
        tokenizer = load_tokenizer(cfg.tokenizer_path)
        check_vocab(tokenizer, cfg.vocab_size)
        renderer = TextRenderer(cfg.hf_text_field, cfg.hf_text_template)
        train = PackedSamples(embedded_tokens("train", tokenizer, renderer), cfg.seq_length)
        val = PackedSamples(embedded_tokens("validation", tokenizer, renderer), cfg.seq_length)
        kind = "embedded corpus (engine/data/corpus, Standard Ebooks, public domain)"
        missing = ("--eval-samples", cfg.eval_samples, "unreachable: the embedded corpus has validation")
    if val is None and cfg.eval_samples > 0:
        raise ConfigError(missing[0], missing[1], missing[2], "gives no validation data but --eval-samples > 0")
    if val is not None:
        check_eval_samples(val, cfg.eval_samples)
    return DataBundle(tokenizer=tokenizer, train=train, validation=val, description=_describe(kind, train, val, tokenizer))
