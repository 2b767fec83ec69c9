"""`prepare`: a dataset split -> memory-mapped token shards + index.json (engine/data/format.py).

Why and how: docs/engine/data.md, section `engine/data/prepare.py`.
"""

import array
import glob
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import string
import sys
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from engine.atomic_files import check_replaceable, replace_dir, sibling_dir
from engine.data.embedded import EMBEDDED_SPLITS, embedded_file, read_embedded
from engine.data.format import (
    FORMAT_NAME, FORMAT_VERSION, INDEX_FILE, SHARD_MAX_BYTES, dtype_for_vocab, itemsize,
    shard_file_name, write_json_atomic,
)
from engine.config import EngineConfig
from engine.data.tokenizer import Tokenizer, load_tokenizer
from engine.errors import ConfigError

__all__ = [
    "prepare_split",
    "prepare_from_config",
    "check_vocab",
    "TextRenderer",
    "resolve_local_splits",
    "is_local_source",
    "DATA_EXTENSIONS",
    "PREPARE_FIELDS",
]

# The EngineConfig fields `prepare` reads (its flags; `--help` lists no others). preset and vocab_size size the
# token dtype; eval_samples decides whether a missing validation split is an error.
PREPARE_FIELDS = ("preset", "vocab_size", "tokenizer_path", "hf_dataset", "hf_dataset_config", "hf_split",
                  "hf_val_dataset", "hf_val_split", "hf_text_field", "hf_text_template", "eval_samples")

# Extension -> `datasets` builder. Compression suffixes are looked through (json only in practice).
DATA_EXTENSIONS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json",
                   ".csv": "csv", ".txt": "text"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst")
_RECORDS_PER_BATCH = 1024  # rows read from the dataset at a time
_CHARS_PER_TASK = 1 << 20  # a tokenizer task holds about this much text (whole records, at least one)
_SPLIT_FOLDERS = ("train", "training", "validation", "valid", "val", "dev", "test", "testing", "eval", "evaluation")
_TYPECODE = {"uint16": "H", "uint32": "I"}  # array module codes; sizes checked at import below
assert array.array("H").itemsize == 2 and array.array("I").itemsize == 4


# --- what text a record stands for ----------------------------------------------------------------


class _RecordError(Exception):
    """A bad record found while encoding (possibly in a worker). Unlike ConfigError its args are its
    fields, so it survives pickling back from a worker process; the parent turns it into ConfigError."""

    def __init__(self, field: str, value: Any, fix: str, problem: str):
        super().__init__(field, value, fix, problem)

    def to_config_error(self) -> ConfigError:
        return ConfigError(*self.args)


class TextRenderer:
    """Record -> document text: `text_template.format_map(record)` if a template is given, else
    `record[text_field]`. None renders as "" (and an empty document is skipped)."""

    def __init__(self, text_field: str, text_template: str):
        self.text_field = text_field
        self.text_template = text_template
        if text_template:
            self.fields = self._template_fields(text_template)
            self.flag, self.value = "--hf-text-template", text_template
        else:
            if not text_field:
                raise ConfigError("--hf-text-field", text_field, "name the record field that holds the text, "
                                  "or pass --hf-text-template '{title}\\n\\n{text}'", "is empty")
            self.fields = [text_field]
            self.flag, self.value = "--hf-text-field", text_field

    @staticmethod
    def _template_fields(template: str) -> list[str]:
        names: list[str] = []
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as err:
            raise ConfigError("--hf-text-template", template, f"fix the braces ({err}); write literal braces as {{{{ }}}}",
                              "is not a valid format string") from err
        for _, name, _, _ in parsed:
            if name is None:
                continue
            base = re.split(r"[.\[]", name, maxsplit=1)[0]
            if not base or base.isdigit():
                raise ConfigError("--hf-text-template", template, "use named fields, e.g. '{title}\\n\\n{text}'",
                                  "has a positional field")
            if base not in names:
                names.append(base)
        if not names:
            raise ConfigError("--hf-text-template", template, "use at least one record field, e.g. '{title}\\n\\n{text}'",
                              "uses no record field")
        return names

    def check_columns(self, columns: list[str], source: str) -> None:
        missing = [f for f in self.fields if f not in columns]
        if not missing:
            return
        example = columns[0] if columns else "text"
        if self.flag == "--hf-text-field":
            fix = (f"the records of {source} have fields {columns}: pass one of them as --hf-text-field, "
                   f"or combine them with --hf-text-template (e.g. '{{{example}}}')")
        else:
            fix = f"the records of {source} have fields {columns}: use only those in --hf-text-template (e.g. '{{{example}}}')"
        raise ConfigError(self.flag, self.value, fix, f"names field(s) {missing} that the records do not have")

    def render(self, record: dict[str, Any]) -> str:
        if self.text_template:
            values = {k: ("" if v is None else v) for k, v in record.items()}
            try:
                return self.text_template.format_map(values)
            except (KeyError, IndexError, AttributeError, ValueError, TypeError) as err:
                raise _RecordError("--hf-text-template", self.text_template, f"fix the template for records like "
                                   f"{_preview(record)} ({type(err).__name__}: {err})", "does not render a record") from err
        value = record[self.text_field]
        if value is None:
            return ""
        if not isinstance(value, str):
            raise _RecordError("--hf-text-field", self.text_field,
                               "name a string field, or format it with --hf-text-template (e.g. '{%s}')" % self.text_field,
                               f"holds {type(value).__name__} values, not text")
        return value


def _preview(record: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {str(v)[:30]!r}" for k, v in record.items()) + "}"


@dataclass
class _Chunk:
    data: bytes  # token ids incl. EOS, in the shard dtype
    records: int
    documents: int
    num_bytes: int
    empty: int


class _Encoder:
    """Columns of a batch of records -> _Chunk. Picklable: it is what spawn workers receive."""

    def __init__(self, tokenizer: Tokenizer, renderer: TextRenderer, dtype: str):
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.typecode = _TYPECODE[dtype]
        self.eos = tokenizer.eos_id
        self.vocab_size = tokenizer.vocab_size

    def __call__(self, columns: dict[str, list[Any]], threaded: bool) -> _Chunk:
        names = list(columns)
        rows = len(columns[names[0]]) if names else 0
        texts = []
        num_bytes = 0
        for values in zip(*(columns[n] for n in names)):
            text = self.renderer.render(dict(zip(names, values)))
            if text:
                texts.append(text)
                num_bytes += len(text.encode("utf-8"))
        # In a worker process, encode one text at a time: the backends' batched calls start threads
        # on every core, and num_proc workers each doing that would oversubscribe the machine.
        ids_per_doc = self.tokenizer.encode_batch(texts) if threaded else [self.tokenizer.encode(t) for t in texts]
        out = array.array(self.typecode)
        for ids in ids_per_doc:
            out.extend(ids)
            out.append(self.eos)
        if out and max(out) >= self.vocab_size:
            raise AssertionError(f"tokenizer {self.tokenizer.name} produced id {max(out)} >= its vocab_size {self.vocab_size}")
        return _Chunk(out.tobytes(), rows, len(texts), num_bytes, rows - len(texts))


_WORKER_ENCODER: _Encoder | None = None


def _init_worker(encoder: _Encoder) -> None:
    global _WORKER_ENCODER
    _WORKER_ENCODER = encoder


def _encode_in_worker(columns: dict[str, list[Any]]) -> _Chunk:
    assert _WORKER_ENCODER is not None, "worker not initialised"
    return _WORKER_ENCODER(columns, threaded=False)


def _encode_all(batches: Iterable[dict[str, list[Any]]], encoder: _Encoder, num_proc: int,
                consume: Callable[[_Chunk], None]) -> None:
    """Encode batches in order; with num_proc > 1, in spawn workers with a bounded window of work
    in flight (bounded memory, results consumed in dataset order)."""
    try:
        if num_proc <= 1:
            for columns in batches:
                consume(encoder(columns, threaded=True))
            return
        # spawn, not fork: the parent may hold torch / tokenizers threads, which fork would copy
        # in whatever state they are in.
        # guard: allow isolation -- asks only whether spawn workers can re-import the main program
        main = sys.modules.get("__main__")
        main_file = getattr(main, "__file__", None)
        if main_file is not None and getattr(main, "__spec__", None) is None and not os.path.exists(main_file):
            # spawn re-imports the main program in each worker; from stdin it hangs instead of failing.
            raise ConfigError("--num-proc", num_proc, "run from a script file or `python -m engine prepare`, or use "
                              "--num-proc 1", f"needs worker processes, which cannot re-import a main program read from {main_file}")
        pool = ProcessPoolExecutor(num_proc, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(encoder,))
        try:
            pending: deque[Future[_Chunk]] = deque()
            for columns in batches:
                pending.append(pool.submit(_encode_in_worker, columns))
                if len(pending) >= 2 * num_proc:
                    consume(pending.popleft().result())
            while pending:
                consume(pending.popleft().result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    except _RecordError as err:
        raise err.to_config_error() from None


# --- writing shards -------------------------------------------------------------------------------


class _ShardWriter:
    """Appends token bytes to tokens-NNNNN.bin files of at most `max_tokens` tokens each."""

    def __init__(self, folder: Path, dtype: str, max_bytes: int):
        self.folder = folder
        self.itemsize = itemsize(dtype)
        self.max_tokens = max(1, max_bytes // self.itemsize)
        self.shards: list[dict[str, Any]] = []
        self._fh = None
        self._digest = hashlib.sha256()
        self._count = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            if self._fh is None:
                self._fh = (self.folder / shard_file_name(len(self.shards))).open("wb")
                self._digest = hashlib.sha256()
                self._count = 0
            room = (self.max_tokens - self._count) * self.itemsize
            part = view[:room]
            self._fh.write(part)
            self._digest.update(part)
            self._count += part.nbytes // self.itemsize
            view = view[room:]
            if self._count == self.max_tokens:
                self._finish()

    def _finish(self) -> None:
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self.shards.append({"file": Path(self._fh.name).name, "num_tokens": self._count, "sha256": self._digest.hexdigest()})
        self._fh = None

    def close(self) -> list[dict[str, Any]]:
        if self._fh is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class _Progress:
    """tqdm when installed, else a plain line every 10 s on stderr; nothing when disabled."""

    def __init__(self, desc: str, total: int | None, enabled: bool):
        self.enabled = enabled
        self.desc = desc
        self.total = total
        self.records = self.tokens = 0
        self._bar = None
        self._last = time.monotonic()
        self._start = self._last
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, unit="rec", file=sys.stderr, dynamic_ncols=True)

    def update(self, records: int, tokens: int) -> None:
        self.records += records
        self.tokens += tokens
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(records)
            self._bar.set_postfix(tokens=f"{self.tokens:,}", refresh=False)
        elif time.monotonic() - self._last >= 10.0:
            self._last = time.monotonic()
            total = f"/{self.total:,}" if self.total is not None else ""
            print(f"{self.desc}: {self.records:,}{total} records, {self.tokens:,} tokens", file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        print(f"{self.desc}: {self.records:,} records -> {self.tokens:,} tokens in {time.monotonic() - self._start:.1f} s",
              file=sys.stderr, flush=True)


# --- staging: build beside the target, publish with os.replace -----------------------------------


class _Staging:
    """A hidden temp folder beside `target`, moved into place only when complete."""

    def __init__(self, target: Path):
        self.target = target
        self.tmp = sibling_dir(target, "tmp")
        self._created: list[Path] = []

    def check_target(self) -> None:
        """Refuse to replace anything that is not an earlier prepared split (or an empty folder)."""
        check_replaceable(self.target, "--out", lambda t: (t / INDEX_FILE).is_file(), "prepared split")

    def create(self) -> None:
        missing = []
        parent = self.target.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for folder in reversed(missing):
            folder.mkdir()
            self._created.append(folder)
        self.tmp.mkdir()

    def publish(self) -> None:
        replace_dir(self.tmp, self.target)
        self._created = []

    def discard(self) -> None:
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        for folder in reversed(self._created):
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        self._created = []


# --- sources --------------------------------------------------------------------------------------


def _builder_of(path: str) -> str | None:
    name = path.lower()
    for suffix in _COMPRESSION:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return DATA_EXTENSIONS.get(os.path.splitext(name)[1])


def is_local_source(source: str) -> bool:
    """A path, a glob, or anything that looks like one; everything else is a Hub name."""
    if glob.has_magic(source) or Path(source).expanduser().exists():
        return True
    return source.startswith(("/", "./", "../", "~")) or _builder_of(source) is not None


def resolve_local_splits(source: str, flag: str = "--hf-dataset") -> dict[str, list[str]]:
    """{split: [files]} of a local file, glob or folder (see the module doc for the naming rules)."""
    path = Path(source).expanduser()
    if glob.has_magic(source):
        files = sorted(f for f in glob.glob(str(path), recursive=True) if os.path.isfile(f) and _builder_of(f))
        if not files:
            raise ConfigError(flag, source, f"check the pattern; data files end in {', '.join(DATA_EXTENSIONS)}",
                              "matches no data files")
        return {"train": files}
    if path.is_file():
        if _builder_of(str(path)) is None:
            raise ConfigError(flag, source, f"pass files ending in {', '.join(DATA_EXTENSIONS)}", "has an unknown data format")
        return {"train": [str(path)]}
    if path.is_dir():
        splits: dict[str, list[str]] = {}

        def by_name(folder: Path, depth: int) -> None:
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith((".", "_")):
                    continue
                if entry.is_file() and _builder_of(entry.name):
                    name = re.match(r"[^-_.]+", entry.name)
                    if name:
                        splits.setdefault(name.group(0), []).append(str(entry))
                elif entry.is_dir() and entry.name in _SPLIT_FOLDERS:
                    inner = sorted(str(f) for f in entry.rglob("*") if f.is_file() and _builder_of(f.name))
                    splits.setdefault(entry.name, []).extend(inner)
                elif entry.is_dir() and depth == 0:
                    by_name(entry, 1)

        by_name(path, 0)
        splits = {name: files for name, files in splits.items() if files}
        if not splits:
            raise ConfigError(flag, source, f"put data files ({', '.join(DATA_EXTENSIONS)}) in it", "has no data files")
        return splits
    raise ConfigError(flag, source, "pass an existing file, glob or folder, or a Hugging Face Hub dataset name", "does not exist")


@dataclass
class _Job:
    """One split to prepare: where it comes from, how it is rendered, where it goes."""

    kind: str  # "files" | "saved" | "hub" | "embedded"
    source: str
    config_name: str
    split: str
    source_flag: str
    split_flag: str
    target: Path
    files: list[str] = field(default_factory=list)
    optional: bool = False  # a validation split that may be absent (--eval-samples 0): dropped if missing
    missing_fix: str = ""  # extra advice when the split turns out not to exist
    staging: _Staging | None = None
    dataset: Any = None  # datasets.Dataset, or a list of records for "embedded"

    def describe(self) -> str:
        if self.kind == "embedded":
            return f"embedded corpus {self.split} ({embedded_file(self.split).name})"
        if self.kind == "files":
            return f"{_builder_of(self.files[0])} files {self.files[0]}" + (f" (+{len(self.files) - 1} more)" if len(self.files) > 1 else "")
        if self.kind == "saved":
            return f"datasets.save_to_disk folder {self.source} [{self.split}]"
        return f"hub {self.source}" + (f" ({self.config_name})" if self.config_name else "") + f" [{self.split}]"


class _MissingSplit(Exception):
    def __init__(self, available: list[str], detail: str = ""):
        super().__init__(available, detail)
        self.available = available
        self.detail = detail


def _saved_splits(path: Path) -> list[str] | None:
    """Splits of a `save_to_disk` folder, or None if it is not one."""
    if (path / "dataset_dict.json").is_file():
        return list(json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"])
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return ["train"]
    return None


def _plan(source: str, config_name: str, split: str, source_flag: str, split_flag: str, target: Path) -> _Job:
    """Resolve where a split comes from without loading it; unknown local splits -> _MissingSplit."""
    if not is_local_source(source):
        return _Job("hub", source, config_name, split, source_flag, split_flag, target)
    if config_name:
        raise ConfigError("--hf-dataset-config", config_name, "leave it empty for local files (it names a Hub configuration)",
                          f"does not apply to local data {source}")
    path = Path(source).expanduser()
    saved = _saved_splits(path) if path.is_dir() else None
    if saved is not None:
        if split not in saved:
            raise _MissingSplit(saved)
        return _Job("saved", str(path), "", split, source_flag, split_flag, target)
    splits = resolve_local_splits(source, source_flag)
    if split not in splits:
        raise _MissingSplit(sorted(splits))
    files = splits[split]
    builders = {_builder_of(f) for f in files}
    if len(builders) > 1:
        raise ConfigError(source_flag, source, "keep one file format per split", f"mixes formats {sorted(map(str, builders))} in split {split!r}")
    return _Job("files", source, "", split, source_flag, split_flag, target, files=files)


def _unknown_split(job_split: str, flag: str, source: str, err: _MissingSplit, extra_fix: str = "") -> ConfigError:
    listed = ", ".join(err.available) if err.available else "(see the dataset card)"
    return ConfigError(flag, job_split, f"use one of: {listed}{extra_fix}", f"is not a split of {source}{err.detail}")


def _quiet_datasets(progress: bool) -> Callable[[], None]:  # noqa: ARG001 - kept for the call sites
    """Silence datasets' own progress bars (our own `prepare` bar reports progress, and an error
    must stay the only line on stderr); returns the undo."""
    import datasets

    was = datasets.is_progress_bar_enabled()
    if was:
        datasets.disable_progress_bars()
        return datasets.enable_progress_bars
    return lambda: None


def _check_not_empty(job: _Job) -> None:
    sizes = [os.path.getsize(f) for f in job.files]
    small_text = [f for f in job.files if _builder_of(f) in ("json", "text", "csv") and not f.endswith(_COMPRESSION)]
    blank = all(s == 0 for s in sizes) or (
        len(small_text) == len(job.files) and sum(sizes) < (1 << 20)
        and all(not Path(f).read_bytes().strip() for f in job.files))
    if blank:
        raise ConfigError(job.source_flag, job.source, "point it at files that hold records", f"split {job.split!r} is empty (no records)")


def _load(job: _Job, num_proc: int, progress: bool) -> None:
    """Load the split with `datasets` into job.dataset (scratch cache inside the staging folder)."""
    if job.kind == "embedded":
        job.dataset = read_embedded(job.split)
        return
    try:
        import datasets
    except ImportError as err:
        raise ConfigError(job.source_flag, job.source, "pip install datasets (or temper-train[data])",
                          f"needs the datasets package ({err})") from err
    undo = _quiet_datasets(progress)
    try:
        if job.kind == "files":
            _check_not_empty(job)
            assert job.staging is not None
            scratch = job.staging.tmp / "hf-cache"
            try:
                ds = datasets.load_dataset(_builder_of(job.files[0]), data_files={job.split: job.files}, split=job.split,
                                           cache_dir=str(scratch),
                                           num_proc=min(num_proc, len(job.files)) if min(num_proc, len(job.files)) > 1 else None)
            except datasets.exceptions.DatasetGenerationError as err:
                raise ConfigError(job.source_flag, job.source, f"check the files of split {job.split!r} ({err.__cause__ or err})",
                                  "could not be read") from err
        elif job.kind == "saved":
            loaded = datasets.load_from_disk(job.source)
            ds = loaded[job.split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            try:
                ds = datasets.load_dataset(job.source, job.config_name or None, split=job.split,
                                           num_proc=num_proc if num_proc > 1 else None)
            except datasets.exceptions.DatasetNotFoundError as err:
                raise ConfigError(job.source_flag, job.source, f"check the name and your access to it ({err})",
                                  "is not a reachable Hugging Face Hub dataset") from err
            except ConnectionError as err:
                raise ConfigError(job.source_flag, job.source, "prepare it on a machine with network access "
                                  "(`python -m engine prepare`) and pass --data-path", f"cannot be downloaded ({err})") from err
            except ValueError as err:
                if str(err).startswith("Unknown split"):
                    raise _MissingSplit([], f" ({err})") from err
                raise
    finally:
        undo()
    if isinstance(ds, datasets.IterableDataset):
        raise AssertionError("expected a map-style dataset")
    job.dataset = ds


def _columns(job: _Job) -> list[str]:
    if job.kind == "embedded":
        return list(job.dataset[0]) if job.dataset else []
    return list(job.dataset.column_names)


def _num_rows(job: _Job) -> int:
    return len(job.dataset)


def _by_size(columns: dict[str, list[Any]]) -> Iterator[dict[str, list[Any]]]:
    """Cut a batch of rows into tasks of about _CHARS_PER_TASK characters, so workers get even
    shares whether records are tweets or 300 KB chapters."""
    names = list(columns)
    rows = len(columns[names[0]]) if names else 0
    start = size = 0
    for i in range(rows):
        size += sum(len(columns[n][i]) for n in names if isinstance(columns[n][i], str))
        if size >= _CHARS_PER_TASK or i == rows - 1:
            yield {n: columns[n][start:i + 1] for n in names}
            start, size = i + 1, 0


def _batches(job: _Job, fields: list[str]) -> Iterator[dict[str, list[Any]]]:
    if job.kind == "embedded":
        records = job.dataset
        for i in range(0, len(records), _RECORDS_PER_BATCH):
            part = records[i:i + _RECORDS_PER_BATCH]
            yield from _by_size({f: [r.get(f) for r in part] for f in fields})
        return
    for columns in job.dataset.select_columns(fields).iter(batch_size=_RECORDS_PER_BATCH):
        yield from _by_size(columns)


def _write(job: _Job, tokenizer: Tokenizer, renderer: TextRenderer, num_proc: int, progress: bool,
           shard_max_bytes: int) -> None:
    """Tokenize job.dataset into shards + index.json inside the staging folder."""
    assert job.staging is not None
    dtype = dtype_for_vocab(tokenizer.vocab_size)
    writer = _ShardWriter(job.staging.tmp, dtype, shard_max_bytes)
    bar = _Progress(f"prepare {job.target.name}", _num_rows(job), progress)
    totals = {"records": 0, "documents": 0, "num_bytes": 0, "empty": 0, "tokens": 0}

    def consume(chunk: _Chunk) -> None:
        writer.write(chunk.data)
        tokens = len(chunk.data) // itemsize(dtype)
        for key, value in (("records", chunk.records), ("documents", chunk.documents), ("num_bytes", chunk.num_bytes),
                           ("empty", chunk.empty), ("tokens", tokens)):
            totals[key] += value
        bar.update(chunk.records, tokens)

    try:
        _encode_all(_batches(job, renderer.fields), _Encoder(tokenizer, renderer, dtype), num_proc, consume)
        shards = writer.close()
    finally:
        writer.abort()
        bar.close()
    if totals["documents"] == 0:
        raise ConfigError(renderer.flag, renderer.value, f"pick the field that holds the text of {job.source}",
                          f"renders empty text for all {totals['records']} records of split {job.split!r}")
    index = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eos_id": tokenizer.eos_id,
                      "bos_id": tokenizer.bos_id, "kind": type(tokenizer).__name__,
                      "path": getattr(tokenizer, "path", "")},
        "dtype": dtype,
        "byte_order": "little",
        "num_documents": totals["documents"],
        "num_tokens": totals["tokens"],
        "num_bytes": totals["num_bytes"],
        "num_records": totals["records"],
        "num_empty": totals["empty"],
        "shards": shards,
        "source": {"kind": job.kind, "source": job.source, "config": job.config_name, "split": job.split,
                   "files": job.files, "text_field": "" if renderer.text_template else renderer.text_field,
                   "text_template": renderer.text_template, "description": job.describe()},
    }
    scratch = job.staging.tmp / "hf-cache"
    job.dataset = None  # drop datasets' memory maps before deleting the scratch cache they point into
    if scratch.exists():
        shutil.rmtree(scratch)
    write_json_atomic(job.staging.tmp / INDEX_FILE, index)


def _run(jobs: list[_Job], tokenizer: Tokenizer, renderer: TextRenderer, num_proc: int, progress: bool,
         shard_max_bytes: int) -> None:
    """Stage, load and check every job before writing any; publish all only when all are built."""
    for job in jobs:
        job.staging = _Staging(job.target)
        job.staging.check_target()
    done = False
    try:
        for job in list(jobs):
            assert job.staging is not None
            job.staging.create()
            try:
                _load(job, num_proc, progress)
            except _MissingSplit as err:  # Hub splits are only known once loading is tried
                if not job.optional:
                    raise _unknown_split(job.split, job.split_flag, job.source, err, job.missing_fix) from None
                job.staging.discard()
                jobs.remove(job)
                continue
            renderer.check_columns(_columns(job), job.source)
            if _num_rows(job) == 0:
                raise ConfigError(job.source_flag, job.source, "point it at a split that holds records",
                                  f"split {job.split!r} is empty (no records)")
        for job in jobs:
            _write(job, tokenizer, renderer, num_proc, progress, shard_max_bytes)
        for job in jobs:
            assert job.staging is not None
            job.staging.publish()
        done = True
    finally:
        if not done:
            for job in reversed(jobs):
                job.dataset = None
                if job.staging is not None:
                    job.staging.discard()


# --- public entry points --------------------------------------------------------------------------


def prepare_split(*, source: str, config_name: str, split: str, text_field: str, text_template: str,
                  tokenizer: Tokenizer, out_dir: Path, num_proc: int = 1, progress: bool = True,
                  shard_max_bytes: int = SHARD_MAX_BYTES, source_flag: str = "--hf-dataset",
                  split_flag: str = "--hf-split") -> Path:
    """Tokenize one split of `source` into `out_dir` (the split folder itself); returns out_dir.

    `source_flag` / `split_flag` are the CLI flags named in errors (validation passes
    --hf-val-dataset / --hf-val-split). Raises ConfigError, having written nothing, for a missing
    text field, an empty dataset or split, an unknown split, or a bad source.
    """
    renderer = TextRenderer(text_field, text_template)
    try:
        job = _plan(source, config_name, split, source_flag, split_flag, Path(out_dir))
    except _MissingSplit as err:
        raise _unknown_split(split, split_flag, source, err) from None
    _run([job], tokenizer, renderer, max(1, num_proc), progress, shard_max_bytes)
    return Path(out_dir)


def check_vocab(tokenizer: Tokenizer, vocab_size: int) -> None:
    """The model's embedding must cover every id the tokenizer can produce."""
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError("--vocab-size", vocab_size, f"pass --vocab-size {tokenizer.vocab_size} (or more)",
                          f"is smaller than the tokenizer's {tokenizer.vocab_size} ids ({tokenizer.name})")


def _val_plan(cfg: EngineConfig, out: Path) -> _Job | None:
    """The validation job, or None when there is none and none is needed (--eval-samples 0)."""
    source = cfg.hf_val_dataset or cfg.hf_dataset
    separate = bool(cfg.hf_val_dataset)
    source_flag = "--hf-val-dataset" if separate else "--hf-dataset"
    split = cfg.hf_val_split
    if separate and is_local_source(source) and not Path(source).expanduser().is_dir():
        split = "train"  # a file or glob is one split: it is the validation set whatever --hf-val-split says
    config_name = "" if separate and is_local_source(source) else cfg.hf_dataset_config
    fix = (", or pass --hf-val-dataset FILES, or --eval-samples 0 to train without validation")
    if not separate and split == cfg.hf_split:
        if cfg.eval_samples == 0:
            return None
        raise ConfigError("--hf-val-split", split, "pick a held-out split" + fix,
                          f"is the training split (--hf-split {cfg.hf_split}): evaluating on training data")
    try:
        job = _plan(source, config_name, split, source_flag, "--hf-val-split", out / "validation")
    except _MissingSplit as err:
        if cfg.eval_samples == 0 and not separate:
            return None
        raise _unknown_split(split, "--hf-val-split", source, err, fix) from None
    job.optional = cfg.eval_samples == 0 and not separate
    job.missing_fix = fix
    return job


def prepare_from_config(cfg: EngineConfig, out_dir: str | Path, num_proc: int = 1, progress: bool = True) -> Path:
    """`python -m engine prepare`: write <out_dir>/train and <out_dir>/validation from cfg.

    Source: --hf-dataset (validation from --hf-val-dataset, else --hf-val-split of --hf-dataset),
    or the embedded corpus when --hf-dataset is empty. Tokenizer: --tokenizer-path (empty: bytes).
    Everything that can be checked (tokenizer vocab vs --vocab-size, splits, text fields) is checked
    before anything is written. Validation may be absent only with --eval-samples 0.
    """
    if num_proc < 1:
        raise ConfigError("--num-proc", num_proc, "use 1 (tokenize in this process) or more worker processes", "is out of range")
    out = Path(out_dir)
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    check_vocab(tokenizer, cfg.vocab_size)
    renderer = TextRenderer(cfg.hf_text_field, cfg.hf_text_template)
    if not cfg.hf_dataset:
        if cfg.hf_val_dataset:
            raise ConfigError("--hf-val-dataset", cfg.hf_val_dataset, "also pass --hf-dataset (or leave both empty for "
                              "the embedded corpus)", "needs a training source")
        jobs = [_Job("embedded", "embedded", "", split, "--hf-dataset", "--hf-split", out / split) for split in EMBEDDED_SPLITS]
    else:
        try:
            train = _plan(cfg.hf_dataset, cfg.hf_dataset_config, cfg.hf_split, "--hf-dataset", "--hf-split", out / "train")
        except _MissingSplit as err:
            raise _unknown_split(cfg.hf_split, "--hf-split", cfg.hf_dataset, err) from None
        val = _val_plan(cfg, out)
        jobs = [train] + ([val] if val is not None else [])
    _run(jobs, tokenizer, renderer, max(1, num_proc), progress, SHARD_MAX_BYTES)
    return out

