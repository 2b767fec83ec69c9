"""On-disk format of a prepared split: raw little-endian token shards plus `index.json`.

A prepared split is a folder:

    index.json          what the shards hold (schema below), written last
    tokens-00000.bin    raw token ids, little-endian uint16 (vocab <= 65536) or uint32
    tokens-00001.bin    ... the stream continues; a document may span two shards

The token stream is every document's ids followed by the tokenizer's EOS, documents in dataset
order. There is no per-document offset table: training packs the stream into fixed-length samples
and never needs document boundaries beyond the EOS tokens themselves.

`index.json` (FORMAT_VERSION 1):

    format, version           "temper-token-shards", 1
    tokenizer                 {name, vocab_size, eos_id, bos_id, kind, path}
    dtype, byte_order         "uint16" | "uint32", "little"
    num_documents, num_tokens documents written (empty ones are skipped) and tokens incl. EOS
    num_bytes                 UTF-8 bytes of the rendered texts (for bits-per-byte)
    num_records, num_empty    records read, records whose rendered text was empty (skipped)
    shards                    [{file, num_tokens, sha256}] in stream order
    source                    {kind, source, config, split, files, builder, text_field,
                               text_template, description}

This module holds only constants and stdlib helpers so that tokenizer worker processes, which
import engine.data.prepare, never pay for importing torch.
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
