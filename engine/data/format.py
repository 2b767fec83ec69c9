"""On-disk format of a prepared split: raw little-endian token shards plus `index.json`.

Why and how: docs/engine/data.md, section `engine/data/format.py`.
"""

import json
import sys
from pathlib import Path
from typing import Any

from engine.atomic_files import write_text_atomic

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_FILE",
    "SHARD_MAX_BYTES",
    "COMPLETE_FILE",
    "FAILED_FILE",
    "dtype_for_vocab",
    "itemsize",
    "shard_file_name",
    "write_json_atomic",
]

FORMAT_NAME = "temper-token-shards"
FORMAT_VERSION = 1
INDEX_FILE = "index.json"
# A shard holds at most this many bytes of tokens (128 Mi uint16 tokens, 64 Mi uint32 ones): large
# enough that a 1T-token corpus stays at a few thousand files, small enough to copy and checksum.
SHARD_MAX_BYTES = 256 << 20
# Markers of a multi-split folder prepared on the fly by `build_data` (engine/data/sources.py).
COMPLETE_FILE = "complete.json"
FAILED_FILE = "failed.json"

_ITEMSIZE = {"uint16": 2, "uint32": 4}

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("engine.data writes and memory-maps little-endian token shards; this host is big-endian")


def dtype_for_vocab(vocab_size: int) -> str:
    """uint16 while every id fits (vocab <= 65536), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


def shard_file_name(index: int) -> str:
    return f"tokens-{index:05d}.bin"


def write_json_atomic(path: Path, data: Any) -> None:
    """JSON through the engine's one atomic writer (engine/atomic_files.py: temp file, fsync, os.replace, fsync the folder)."""
    write_text_atomic(path, json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
