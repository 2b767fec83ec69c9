"""SHA-256 checksums of every file of a checkpoint: recorded at save, verified before a resume.

Why and how: docs/engine/checkpoint.md, section `engine/checkpoint/checksums.py`.
"""

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "BLOCK_BYTES", "hash_files", "files_to_hash", "manifest_text", "read_manifest",
           "verify_blocks", "check_listing", "hash_threads"]

MANIFEST = "manifest.json"
BLOCK_BYTES = 64 << 20
_FORMAT = 1


def hash_threads() -> int:
    """Threads per rank for hashing: enough to keep a few cores busy, few enough to leave training its own."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def _block_digest(path: Path, index: int, block_bytes: int) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        fh.seek(index * block_bytes)
        remaining = block_bytes
        while remaining:
            chunk = fh.read(min(remaining, 8 << 20))
            if not chunk:
                break
            h.update(chunk)
            remaining -= len(chunk)
    return h.hexdigest()


def _num_blocks(size: int, block_bytes: int) -> int:
    return max(1, -(-size // block_bytes))  # an empty file still has one (empty) block


def hash_files(folder: Path, names: list[str], threads: int | None = None) -> dict[str, dict[str, Any]]:
    """name -> {"bytes", "blocks"} for the given files of `folder`, blocks hashed in parallel."""
    sizes = {n: (folder / n).stat().st_size for n in names}
    jobs = [(n, i) for n in names for i in range(_num_blocks(sizes[n], BLOCK_BYTES))]
    with ThreadPoolExecutor(max_workers=threads or hash_threads()) as pool:
        digests = list(pool.map(lambda job: _block_digest(folder / job[0], job[1], BLOCK_BYTES), jobs))
    out: dict[str, dict[str, Any]] = {n: {"bytes": sizes[n], "blocks": []} for n in names}
    for (name, _), digest in zip(jobs, digests):
        out[name]["blocks"].append(digest)
    return out


def files_to_hash(folder: Path, rank: int, world: int) -> list[str]:
    """This rank's share at save: the shards DCP wrote for it (`__<rank>_...`); rank 0 also every file
    no rank claims (.metadata, meta.json, anything else), so the manifest covers the whole folder."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)

    def owner(name: str) -> int:
        head = name.split("_")[2] if name.startswith("__") and name.count("_") >= 3 else ""
        return int(head) if head.isdigit() and int(head) < world else 0

    return [n for n in names if owner(n) == rank]


def manifest_text(files: dict[str, dict[str, Any]]) -> str:
    return json.dumps({"format": _FORMAT, "algorithm": "sha256", "block_bytes": BLOCK_BYTES,
                       "files": dict(sorted(files.items()))}, indent=1) + "\n"


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """(manifest, "") or (None, why it cannot be used)."""
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"has no {MANIFEST} (incomplete, or written before checkpoints carried checksums)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{MANIFEST} does not parse ({err})"
    files = data.get("files") if isinstance(data, dict) else None
    if (not isinstance(files, dict) or data.get("algorithm") != "sha256" or data.get("format") != _FORMAT
            or not isinstance(data.get("block_bytes"), int) or data["block_bytes"] <= 0
            or not all(isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("blocks"), list)
                       for e in files.values())):
        return None, f"{MANIFEST} is not a format-{_FORMAT} sha256 manifest"
    return data, ""


def check_listing(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """File-level problems (missing, other size, unlisted), one line each; cheap: stat only."""
    problems = []
    listed = manifest["files"]
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST}
    for name in sorted(listed):
        if name not in present:
            problems.append(f"{name} is missing")
        elif (folder / name).stat().st_size != listed[name]["bytes"]:
            problems.append(f"{name} has {(folder / name).stat().st_size} bytes, {listed[name]['bytes']} were written")
        elif len(listed[name]["blocks"]) != _num_blocks(listed[name]["bytes"], manifest["block_bytes"]):
            problems.append(f"{name} has {len(listed[name]['blocks'])} block checksums in {MANIFEST}, its size needs "
                            f"{_num_blocks(listed[name]['bytes'], manifest['block_bytes'])}")
    for name in sorted(present - set(listed)):
        problems.append(f"{name} is not in {MANIFEST}")
    return problems


def verify_blocks(folder: Path, manifest: dict[str, Any], rank: int = 0, world: int = 1,
                  threads: int | None = None) -> list[str]:
    """Rehash this rank's share of the blocks (round-robin over all of them); a line per damaged block."""
    block = manifest["block_bytes"]
    jobs = [(name, i, digest, entry["bytes"]) for name, entry in sorted(manifest["files"].items())
            if (folder / name).is_file() and (folder / name).stat().st_size == entry["bytes"]
            for i, digest in enumerate(entry["blocks"])][rank::world]
    with ThreadPoolExecutor(max_workers=threads or hash_threads()) as pool:
        got = list(pool.map(lambda job: _block_digest(folder / job[0], job[1], block), jobs))
    return [f"{name} bytes {i * block}..{min(size, (i + 1) * block)} differ from the checksum written at save"
            for (name, i, want, size), have in zip(jobs, got) if have != want]
