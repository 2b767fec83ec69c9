"""Read a prepared split (engine/data/format.py) as one memory-mapped token stream.

`TokenShards` validates index.json against the files beside it when it opens (a corrupt or missing
index, a missing or truncated shard: ConfigError naming the folder and the fix, re-run
`python -m engine prepare`) and then serves `tokens(start, length)` spans that may cross shard
boundaries. Shards are mapped read-only with the stdlib `mmap` and opened lazily, so the object is
cheap to pickle into DataLoader workers. `InMemoryTokens` offers the same surface for a stream that
lives in memory (the embedded corpus), so packing and loading never care where tokens come from.
"""

import array
import bisect
import hashlib
import json
import mmap
from pathlib import Path
from typing import Any

import torch

from engine.data.format import FORMAT_NAME, FORMAT_VERSION, INDEX_FILE, itemsize
from engine.errors import ConfigError

__all__ = ["TokenShards", "InMemoryTokens", "read_index"]

_DATA_PATH_FLAG = "--data-path"
# Read raw shard bytes as signed ints of the same width, widen to int64, then mask: works on every
# torch version (unsigned 16/32-bit dtypes have patchy op support before 2.3).
_SIGNED = {"uint16": (torch.int16, 0xFFFF), "uint32": (torch.int32, 0xFFFFFFFF)}


def _fix(path: Path) -> str:
    return f"re-run `python -m engine prepare --out {path.parent}` (or delete {path} so it is prepared again)"


def read_index(path: str | Path) -> dict[str, Any]:
    """Load and check a split's index.json; ConfigError (naming the folder and the fix) if unusable."""
    path = Path(path)
    index_file = path / INDEX_FILE
    if not index_file.is_file():
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path), f"has no {INDEX_FILE} (not a prepared split)")
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path), f"has a corrupt {INDEX_FILE} ({err})") from err
    if not isinstance(index, dict) or index.get("format") != FORMAT_NAME:
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path), f"has an {INDEX_FILE} that is not a {FORMAT_NAME} index")
    if index.get("version") != FORMAT_VERSION:
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path),
                          f"was written in format version {index.get('version')!r}; this engine reads {FORMAT_VERSION}")
    try:
        shards = [(str(s["file"]), int(s["num_tokens"]), str(s["sha256"])) for s in index["shards"]]
        tok = index["tokenizer"]
        checks = [index["dtype"] in _SIGNED, int(index["num_tokens"]) == sum(n for _, n, _ in shards),
                  int(index["num_tokens"]) > 0, all(n > 0 and "/" not in f for f, n, _ in shards),
                  isinstance(tok["name"], str), 0 <= int(tok["eos_id"]) < int(tok["vocab_size"]),
                  int(index["num_bytes"]) >= 0, int(index["num_documents"]) > 0]
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path), f"has an incomplete {INDEX_FILE} (missing or bad {err})") from err
    if not all(checks):
        raise ConfigError(_DATA_PATH_FLAG, str(path), _fix(path), f"has an inconsistent {INDEX_FILE}")
    return index


class TokenShards:
    """A prepared split, read-only. `verify=True` also checks every shard's sha256 (reads it all)."""

    def __init__(self, path: str | Path, *, verify: bool = False):
        self.path = Path(path)
        self.index = read_index(self.path)
        self.dtype: str = self.index["dtype"]
        self._itemsize = itemsize(self.dtype)
        self._files = [self.path / s["file"] for s in self.index["shards"]]
        counts = [int(s["num_tokens"]) for s in self.index["shards"]]
        self._starts = [0]
        for n in counts:
            self._starts.append(self._starts[-1] + n)
        for file, n, shard in zip(self._files, counts, self.index["shards"]):
            size = file.stat().st_size if file.is_file() else -1
            if size != n * self._itemsize:
                what = "is missing" if size < 0 else f"has {size} bytes, index.json says {n * self._itemsize}"
                raise ConfigError(_DATA_PATH_FLAG, str(self.path), _fix(self.path), f"shard {file.name} {what}")
            if verify:
                digest = hashlib.sha256()
                with file.open("rb") as fh:
                    for block in iter(lambda: fh.read(1 << 24), b""):
                        digest.update(block)
                if digest.hexdigest() != shard["sha256"]:
                    raise ConfigError(_DATA_PATH_FLAG, str(self.path), _fix(self.path), f"shard {file.name} fails its sha256 check")
        tok = self.index["tokenizer"]
        self.num_tokens: int = int(self.index["num_tokens"])
        self.num_bytes: int = int(self.index["num_bytes"])
        self.num_documents: int = int(self.index["num_documents"])
        self.eos_id: int = int(tok["eos_id"])
        self.vocab_size: int = int(tok["vocab_size"])
        self.tokenizer_name: str = tok["name"]
        self.description: str = self.index.get("source", {}).get("description", str(self.path))
        # Content identity: tokenizer + every shard's hash, independent of where the folder lives.
        ident = {"tokenizer": tok["name"], "eos": self.eos_id, "dtype": self.dtype,
                 "shards": [(int(s["num_tokens"]), s["sha256"]) for s in self.index["shards"]]}
        self.fingerprint: str = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self._maps: list[mmap.mmap | None] = [None] * len(self._files)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self._files)
        return state

    def _map(self, shard: int) -> mmap.mmap:
        mapped = self._maps[shard]
        if mapped is None:
            with self._files[shard].open("rb") as fh:
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = mapped
        return mapped

    def __len__(self) -> int:
        return self.num_tokens

    def tokens(self, start: int, length: int) -> torch.Tensor:
        """Tokens [start, start + length) of the stream as int64, crossing shards as needed."""
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside the stream of {self.num_tokens}")
        signed, mask = _SIGNED[self.dtype]
        parts = []
        pos, end = start, start + length
        shard = bisect.bisect_right(self._starts, pos) - 1
        while pos < end:
            lo = pos - self._starts[shard]
            hi = min(end, self._starts[shard + 1]) - self._starts[shard]
            # bytearray copy: the mapping is read-only and torch.frombuffer wants a writable buffer.
            raw = bytearray(self._map(shard)[lo * self._itemsize:hi * self._itemsize])
            parts.append(torch.frombuffer(raw, dtype=signed).to(torch.int64) & mask)
            pos += hi - lo
            shard += 1
        if not parts:
            return torch.empty(0, dtype=torch.int64)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def __repr__(self) -> str:
        return f"TokenShards({str(self.path)!r}, num_tokens={self.num_tokens}, tokenizer={self.tokenizer_name!r})"


class InMemoryTokens:
    """A token stream held in memory with the TokenShards surface (used for the embedded corpus)."""

    def __init__(self, tokens: torch.Tensor, *, eos_id: int, vocab_size: int, tokenizer_name: str,
                 num_bytes: int, num_documents: int, description: str):
        if tokens.dim() != 1 or tokens.numel() == 0:
            raise ValueError("InMemoryTokens needs a non-empty 1-D tensor")
        self._tokens = tokens.to(torch.int64).contiguous()
        self.num_tokens = int(self._tokens.numel())
        self.num_bytes = num_bytes
        self.num_documents = num_documents
        self.eos_id = eos_id
        self.vocab_size = vocab_size
        self.tokenizer_name = tokenizer_name
        self.description = description
        digest = hashlib.sha256(tokenizer_name.encode())
        digest.update(array.array("q", self._tokens.tolist()).tobytes())  # no numpy: torch-only installs
        self.fingerprint = digest.hexdigest()[:16]

    def __len__(self) -> int:
        return self.num_tokens

    def tokens(self, start: int, length: int) -> torch.Tensor:
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside the stream of {self.num_tokens}")
        return self._tokens[start:start + length].clone()

    def __repr__(self) -> str:
        return f"InMemoryTokens(num_tokens={self.num_tokens}, tokenizer={self.tokenizer_name!r})"
