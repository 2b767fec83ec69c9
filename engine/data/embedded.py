"""The corpus bundled with the engine (engine/data/corpus/, provenance in its README.md).

A few hundred KB of public-domain English books so `python -m engine pretrain` runs with nothing
but torch installed: read with the stdlib json module, tokenized in memory by `build_data`, and
written to shards by `prepare` like any other source when no --hf-dataset is given.
"""

import json
from pathlib import Path
from typing import Any

__all__ = ["CORPUS_DIR", "EMBEDDED_SPLITS", "embedded_file", "read_embedded"]

CORPUS_DIR = Path(__file__).with_name("corpus")
EMBEDDED_SPLITS = ("train", "validation")


def embedded_file(split: str) -> Path:
    return CORPUS_DIR / f"{split}.jsonl"


def read_embedded(split: str) -> list[dict[str, Any]]:
    """Records ({text, title, author, source}) of one embedded split, in file order."""
    if split not in EMBEDDED_SPLITS:
        raise KeyError(f"embedded corpus has splits {EMBEDDED_SPLITS}, not {split!r}")
    with embedded_file(split).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
