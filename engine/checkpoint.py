"""Checkpoints with torch.distributed.checkpoint (DCP): sharded, atomic, resumable bit for bit.

Layout of a save dir:
    step_00000050/   DCP shards + .metadata, and meta.json (step, config, layout) for humans/tools
    latest           the name of the newest complete checkpoint
A checkpoint holds the fp32 masters and Adam moments (the bf16 model weights are derived from the
masters), the step, the data-loader position and every rank's RNG state: everything a resumed run
needs to print the same [LOSS] lines as an uninterrupted one. Under data parallelism each rank saves
only its ZeRO-1 pieces, in a form DCP reshards on load (engine/parallel/zero_state.py): a checkpoint
resumes on any DP size with the same TP size (`check_compatible`).

Atomicity: all ranks write into `step_N.tmp`; only when every rank has finished does rank 0 write
meta.json, rename the folder to `step_N` and then rewrite `latest` (tmp + os.replace). A crash at
any point leaves the previous checkpoint and `latest` intact; stale `.tmp` folders are ignored.
"""

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from engine.config import EngineConfig, to_dict
from engine.errors import ConfigError

__all__ = ["save_checkpoint", "load_checkpoint", "find_checkpoint", "read_meta", "check_compatible", "meta_for",
           "write_text_atomic", "MODEL_FIELDS"]

_STEP_DIR = re.compile(r"^step_(\d{8})$")
# Fields that must match between a checkpoint and the run resuming from it.
MODEL_FIELDS = ("vocab_size", "vocab_pad_multiple", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "ffn_hidden_size", "mup")


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _no_dist() -> bool:
    return not dist.is_initialized()


def save_checkpoint(save_dir: Path, step: int, state: dict[str, Any], meta: dict[str, Any], *,
                    is_main: bool, keep_last: int) -> Path:
    """Collective: every rank calls it with its own `state` (tensors and picklable objects)."""
    final = save_dir / f"step_{step:08d}"
    tmp = save_dir / f"step_{step:08d}.tmp"
    if is_main:
        save_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    with warnings.catch_warnings():  # DCP warns that a single process saves without a process group
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(tmp), no_dist=_no_dist())
    _barrier()
    if is_main:
        write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=True))
        if final.exists():  # re-saving a step (e.g. after a resume): keep the old one until the swap
            old = save_dir / f"step_{step:08d}.old"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        write_text_atomic(save_dir / "latest", final.name + "\n")
        _prune(save_dir, keep_last)
    _barrier()
    return final


def _complete_steps(save_dir: Path) -> list[Path]:
    found = [p for p in save_dir.iterdir() if _STEP_DIR.match(p.name) and (p / ".metadata").is_file()
             and (p / "meta.json").is_file()] if save_dir.is_dir() else []
    return sorted(found, key=lambda p: p.name)


def _prune(save_dir: Path, keep_last: int) -> None:
    for old in _complete_steps(save_dir)[:-keep_last]:
        shutil.rmtree(old)


def find_checkpoint(resume: str, save_dir: Path) -> Path | None:
    """'auto' -> the newest complete checkpoint in save_dir (None if there is none);
    a path -> that checkpoint (a step_* folder, or a save dir meaning its newest)."""
    if resume == "":
        return None
    if resume == "auto":
        latest = save_dir / "latest"
        if latest.is_file():
            candidate = save_dir / latest.read_text().strip()
            if candidate.is_dir():
                return candidate
        steps = _complete_steps(save_dir)
        return steps[-1] if steps else None
    path = Path(resume)
    if (path / "meta.json").is_file() or (path / ".metadata").is_file():
        return path
    steps = _complete_steps(path)
    if not steps:
        raise ConfigError("--resume", resume, "pass a step_* checkpoint folder or a save dir that holds one",
                          "holds no complete checkpoint")
    return steps[-1]


def read_meta(path: Path) -> dict[str, Any]:
    meta_file, dcp_meta = path / "meta.json", path / ".metadata"
    if not meta_file.is_file() or not dcp_meta.is_file():
        raise ConfigError("--resume", str(path), "pass an earlier step_* folder or delete this one",
                          "is an incomplete or corrupt checkpoint (meta.json or .metadata missing)")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError("--resume", str(path), "pass an earlier step_* folder or delete this one",
                          f"is a corrupt checkpoint (meta.json: {err})") from err
    for key in ("step", "config", "layout"):
        if key not in meta:
            raise ConfigError("--resume", str(path), "pass an earlier step_* folder or delete this one",
                              f"is a corrupt checkpoint (meta.json lacks {key!r})")
    return meta


def _layout_text(layout: dict[str, Any]) -> str:
    return f"tp={layout.get('tp')} x dp={layout.get('dp')}"


def check_compatible(meta: dict[str, Any], cfg: EngineConfig, path: Path, layout: dict[str, int]) -> bool:
    """Refuse a checkpoint this run cannot continue. Returns True when it was written with another
    data-parallel size: its ZeRO-1 optimizer shards are then resharded on load (engine/parallel/
    zero_state.py). The tensor-parallel size must match: weights are sliced per TP size."""
    saved = meta["config"]
    for name in MODEL_FIELDS:
        if saved.get(name) != getattr(cfg, name):
            raise ConfigError(f"--{name.replace('_', '-')}", getattr(cfg, name),
                              f"use {saved.get(name)!r} as in the checkpoint {path}, or start a new run",
                              "differs from the checkpoint")
    written = meta["layout"]
    if written.get("tp") != layout["tp"]:
        raise ConfigError("--tp", layout["tp"],
                          f"checkpoint {path} was written with layout {_layout_text(written)} and this run is "
                          f"{_layout_text(layout)}; resume with --tp {written.get('tp')} (any number of processes "
                          f"that is a multiple of it: the data-parallel size may change, the TP size may not)",
                          "does not match the checkpoint's tensor-parallel size")
    return written.get("dp") != layout["dp"]


def meta_for(cfg: EngineConfig, step: int, layout: dict[str, int]) -> dict[str, Any]:
    return {"step": step, "config": to_dict(cfg), "layout": layout, "format": 1}


def load_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Load in place into `state` (same structure as saved). A damaged checkpoint is a ConfigError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(path), no_dist=_no_dist())
    # DCP wraps a failing read in CheckpointException, which derives from BaseException.
    except (dcp.CheckpointException, RuntimeError, ValueError, KeyError, OSError, EOFError) as err:
        text = str(err).strip()
        first = text.splitlines()[0][:200] if text else type(err).__name__
        raise ConfigError("--resume", str(path), "pass an earlier step_* folder or delete this one",
                          f"could not be loaded ({first})") from err

