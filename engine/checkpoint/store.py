"""Checkpoints with torch.distributed.checkpoint (DCP): sharded, atomic, checksummed, resumable bit for bit.

Why and how: docs/engine/checkpoint.md, section `engine/checkpoint/store.py`.
"""

import json
import re
import shlex
import shutil
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch.distributed as dist

from engine.atomic_files import replace_dir, write_text_atomic
from engine.checkpoint.checksums import check_listing, files_to_hash, hash_files, manifest_text, read_manifest, verify_blocks, MANIFEST
from engine.config import EngineConfig, flag_name, to_dict
from engine.errors import ConfigError
from engine.optim.schedule import schedule_fields

__all__ = ["save_checkpoint", "load_checkpoint", "remove_stale_temporaries", "select_checkpoint", "refuse_earlier_run", "newest_checkpoint", "checkpoints_in_write_order",
           "verify_checkpoint", "read_meta", "check_compatible", "check_schedule", "meta_for", "MODEL_FIELDS",
           "STATE_FIELDS"]

# torch.distributed.checkpoint is imported where it is used: it pulls in DTensor and sympy, ~1.2 s of CPU that
# every engine process without a checkpoint to save or load (a refusal, `engine batches`, a short run) would pay.

_STEP_DIR = re.compile(r"^step_(\d{8})$")
# Fields that must match between a checkpoint and the run resuming from it: the shapes, and the muP scalings,
# which change what the weights compute and each tensor's learning rate (engine/optim/mup.py).
MODEL_FIELDS = ("vocab_size", "vocab_pad_multiple", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "ffn_hidden_size", "mup", "scale_emb", "scale_depth", "dim_model_base")
# Fields whose state the checkpoint holds, so a resume must keep them: {field: (its value in checkpoints
# written before the field existed, why)}. The optimizer's state (AdamW moments, Muon momentum); the data
# mix's loader state (one cursor per source; a changed mix is refused again by its fingerprint).
STATE_FIELDS = {"optimizer": ("adamw", "its optimizer state belongs to the other optimizer"),
                "data_mix": ("", "its loader state belongs to another data mix"),
                "seq_length": (None, "its data position counts windows of that length")}
FORMAT = 2  # 2: manifest.json and write_seq
_FIELD_NAMES = tuple(f.name for f in fields(EngineConfig))


def _barrier(group: Any = None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def _no_dist() -> bool:
    return not dist.is_initialized()


def _rank_world(group: Any = None) -> tuple[int, int]:
    return (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)


def _all_gather(obj: Any, group: Any = None) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


# --- saving ---------------------------------------------------------------------------------------


def save_checkpoint(save_dir: Path, step: int, state: dict[str, Any], meta: dict[str, Any], *, keep_last: int,
                    group: Any = None) -> Path:
    """Collective over `group` (None: the default group, or a single process): every rank calls it with
    its own `state` (tensors and picklable objects). Returns the published step_N folder."""
    rank, world = _rank_world(group)
    final = save_dir / f"step_{step:08d}"
    tmp = save_dir / f"step_{step:08d}.tmp"
    if rank == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier(group)
    import torch.distributed.checkpoint as dcp  # (see the comment at the top)

    with warnings.catch_warnings():  # DCP warns that a single process saves without a process group
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(tmp), process_group=group, no_dist=_no_dist())
    # dcp.save returns on every rank after every rank's shards and the .metadata are written and fsynced
    if rank == 0:
        meta = {**meta, "write_seq": _next_write_seq(save_dir)}
        write_text_atomic(tmp / "meta.json", json.dumps(meta, indent=2, sort_keys=True))
    digests: dict[str, Any] = {}
    for part in _all_gather(hash_files(tmp, files_to_hash(tmp, rank, world)), group):
        digests.update(part)
    _check_shared(save_dir, tmp, digests, rank, group)
    if rank == 0:
        write_text_atomic(tmp / MANIFEST, manifest_text(digests))
        _publish(save_dir, tmp, final, keep_last)
    _barrier(group)
    return final


def _check_shared(save_dir: Path, tmp: Path, digests: dict[str, Any], rank: int, group: Any) -> None:
    """Every rank's shards must be in the folder rank 0 publishes. On several nodes a --save-dir on each
    host's own disk leaves them elsewhere and the checkpoint would not resume; refused on every rank alike."""
    seen = _all_gather(sorted(p.name for p in tmp.iterdir()) if rank == 0 else None, group)[0]
    missing = sorted(set(digests) - set(seen))
    if missing:
        raise ConfigError("--save-dir", str(save_dir), "put --run-dir / --save-dir on a filesystem every node sees "
                          "(NFS, Lustre, ...)", f"is not shared by the nodes: rank 0 does not see {len(missing)} "
                          f"shard file(s) other ranks wrote there (e.g. {missing[0]})")


def _publish(save_dir: Path, tmp: Path, final: Path, keep_last: int) -> None:
    """Rank 0, once `tmp` is complete and fsynced: make it step_N, then point `latest` at it, then prune."""
    replace_dir(tmp, final)  # re-saving a step (e.g. after a resume) keeps the old one until the swap
    write_text_atomic(save_dir / "latest", final.name + "\n")
    _prune(save_dir, keep_last, final)


# What an interrupted save leaves: the folder being written, the atomic writer's temp file, a folder set aside.
_STALE = re.compile(r"^(step_\d{8}\.tmp|\.latest\.tmp-\d+|\.step_\d{8}\.old-\d+-[0-9a-f]+)$")


def remove_stale_temporaries(save_dir: Path) -> list[str]:
    """Rank 0 at the start of a run, before any save: remove what killed saves left in `save_dir` (nothing
    else writes there while a run starts). Returns the names removed."""
    if not save_dir.is_dir():
        return []
    removed = []
    for path in sorted(save_dir.iterdir()):
        if not _STALE.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path.name)
    return removed


def _write_seq(path: Path) -> int:
    """A checkpoint's place in write order; -1 for one without a readable write_seq (older, or damaged)."""
    try:
        seq = json.loads((path / "meta.json").read_text(encoding="utf-8")).get("write_seq")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return -1
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else -1


def checkpoints_in_write_order(save_dir: Path) -> list[Path]:
    """Every step_N folder of save_dir, oldest written first (by write_seq; unknown order first, by step)."""
    if not save_dir.is_dir():
        return []
    found = [p for p in save_dir.iterdir() if _STEP_DIR.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: (_write_seq(p), p.name))


def _next_write_seq(save_dir: Path) -> int:
    return 1 + max((_write_seq(p) for p in checkpoints_in_write_order(save_dir)), default=0)


def _prune(save_dir: Path, keep_last: int, just_written: Path) -> None:
    ordered = checkpoints_in_write_order(save_dir)
    assert ordered and ordered[-1] == just_written, f"{just_written} is not the newest checkpoint of {save_dir}"
    for old in ordered[:-keep_last]:
        shutil.rmtree(old)


def newest_checkpoint(save_dir: Path) -> Path | None:
    ordered = checkpoints_in_write_order(save_dir)
    return ordered[-1] if ordered else None


# --- verifying and choosing -----------------------------------------------------------------------


def _meta_problem(path: Path) -> tuple[dict[str, Any] | None, str]:
    if not (path / "meta.json").is_file() or not (path / ".metadata").is_file():
        return None, "is an incomplete or corrupt checkpoint (meta.json or .metadata missing)"
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return None, f"is a corrupt checkpoint (meta.json: {err})"
    if not isinstance(meta, dict):
        return None, "is a corrupt checkpoint (meta.json is not an object)"
    for key in ("step", "config", "layout"):
        if key not in meta:
            return None, f"is a corrupt checkpoint (meta.json lacks {key!r})"
    return meta, ""


def verify_checkpoint(path: Path) -> list[str]:
    """Problems with checkpoint `path` (empty: it verifies), the same list on every rank. Collective when
    a process group is up: each rank rehashes a share of the blocks, then the ranks exchange findings."""
    rank, world = _rank_world()
    problems = []
    _, problem = _meta_problem(path)
    manifest, why = read_manifest(path)
    if problem:
        problems.append(f"{path.name} {problem}")
    elif manifest is None:
        problems.append(f"{path.name} {why}")
    else:
        problems += [f"{path.name}/{p}" for p in check_listing(path, manifest)]
        if not problems:
            problems += [f"{path.name}/{p}" for p in verify_blocks(path, manifest, rank, world)]
    merged: list[str] = []
    for part in _all_gather(problems):
        merged += [p for p in part if p not in merged]
    return merged


def _summary(problems: list[str]) -> str:
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    return "; ".join(problems[:2]) + more


def refuse_earlier_run(save_dir: Path) -> None:
    """A fresh run (no --resume) must not write into a save dir that holds another run's checkpoints: it would
    overwrite them step by step, and --keep-last would prune the rest. Collective (rank 0's listing)."""
    earlier = _all_gather(newest_checkpoint(save_dir))[0]
    if earlier is not None:
        raise ConfigError("--save-dir", str(save_dir), "pass --resume auto to continue that run, or give this run its "
                          "own --run-dir (or --save-dir); delete them to start over in the same place",
                          f"already holds checkpoints of an earlier run (newest {earlier.name})")


def select_checkpoint(resume: str, save_dir: Path, flag: str = "--resume") -> tuple[Path | None, list[str]]:
    """The checkpoint to resume and a line for each one passed over.

    'auto': the newest checkpoint of save_dir in write order that verifies (None when save_dir holds
    none at all; an error when it holds some and none verifies). A path: that step_* folder, or a save
    dir meaning its newest; it must verify. Collective, like verify_checkpoint. `flag` names the option
    in errors."""
    if resume == "":
        return None, []
    if resume == "auto":
        notes = []
        # rank 0's listing on every rank: a shared filesystem may show a late rank another one, and all
        # ranks must walk the same candidates through the collective verification
        for name in _all_gather([p.name for p in reversed(checkpoints_in_write_order(save_dir))])[0]:
            path = save_dir / name
            t0 = time.perf_counter()
            problems = verify_checkpoint(path)
            if not problems:
                return path, notes + [f"[CKPT] verified {path} against its manifest in {time.perf_counter() - t0:.1f} s"]
            notes.append(f"[CKPT] skipped {path}: {_summary(problems)}")
        if notes:
            raise ConfigError(flag, "auto", f"delete the damaged checkpoints (or the save dir, to start afresh), or "
                              f"pass --resume PATH of a good copy", f"found no checkpoint in {save_dir} that verifies "
                              f"({notes[0].removeprefix('[CKPT] skipped ')})")
        return None, []
    path = Path(resume)
    if not _STEP_DIR.match(path.name) and not (path / "meta.json").is_file():
        newest = _all_gather(newest_checkpoint(path))[0]
        if newest is None:
            raise ConfigError(flag, resume, "pass a step_* checkpoint folder or a save dir that holds one",
                              "holds no checkpoint")
        path = newest
    t0 = time.perf_counter()
    problems = verify_checkpoint(path)
    if problems:
        also = ", or --resume auto to take the newest one that verifies" if flag == "--resume" else ""
        raise ConfigError(flag, str(path), f"pass an earlier checkpoint{also}", f"fails verification: {_summary(problems)}")
    return path, [f"[CKPT] verified {path} against its manifest in {time.perf_counter() - t0:.1f} s"]


def read_meta(path: Path) -> dict[str, Any]:
    meta, problem = _meta_problem(path)
    if meta is None:
        raise ConfigError("--resume", str(path), "pass an earlier step_* folder or delete this one", problem)
    return meta


def _layout_text(layout: dict[str, Any]) -> str:
    return f"tp={layout.get('tp')} x dp={layout.get('dp')}"


def check_compatible(meta: dict[str, Any], cfg: EngineConfig, path: Path, layout: dict[str, int]) -> bool:
    """Refuse a checkpoint this run cannot continue. Returns True when it was written with another
    data-parallel size: its ZeRO-1 optimizer shards are then resharded on load (engine/sharding/
    zero_state.py). The tensor-parallel size must match: weights are sliced per TP size."""
    saved = meta["config"]
    for name in MODEL_FIELDS:
        if saved.get(name) != getattr(cfg, name):
            raise ConfigError(f"--{name.replace('_', '-')}", getattr(cfg, name),
                              f"use {saved.get(name)!r} as in the checkpoint {path}, or start a new run",
                              "differs from the checkpoint")
    for name, (before, why) in STATE_FIELDS.items():
        if saved.get(name, before) != getattr(cfg, name):
            raise ConfigError(flag_name(name), getattr(cfg, name),
                              f"use {flag_name(name)} {shlex.quote(str(saved.get(name, before)))} as in the checkpoint {path}, or start "
                              "a new run", f"differs from the checkpoint ({why})")
    written = meta["layout"]
    if written.get("tp") != layout["tp"]:
        raise ConfigError("--tp", layout["tp"],
                          f"checkpoint {path} was written with layout {_layout_text(written)} and this run is "
                          f"{_layout_text(layout)}; resume with --tp {written.get('tp')} (any number of processes "
                          f"that is a multiple of it: the data-parallel size may change, the TP size may not)",
                          "does not match the checkpoint's tensor-parallel size")
    return written.get("dp") != layout["dp"]


def check_schedule(meta: dict[str, Any], cfg: EngineConfig, path: Path) -> list[dict[str, Any]]:
    """The learning-rate schedule must continue as it was written, unless --override-schedule says a
    change is meant. Returns the overrides to record in the next checkpoints (the checkpoint's own,
    plus this resume's when it changes the schedule)."""
    # a field the checkpoint's engine did not have yet (e.g. --warmdown-frac) had its default there
    defaults = EngineConfig()
    saved = {n: meta["config"].get(n, getattr(defaults, n)) for n in _FIELD_NAMES}
    names = ("lr_schedule",) + tuple(dict.fromkeys(
        schedule_fields(str(saved["lr_schedule"]), warmdown=bool(saved["warmdown_frac"]))
        + schedule_fields(cfg.lr_schedule, warmdown=bool(cfg.warmdown_frac))))
    changes = {n: [saved[n], getattr(cfg, n)] for n in names if saved[n] != getattr(cfg, n)}
    history = list(meta.get("schedule_overrides", []))
    if not changes:
        return history
    text = ", ".join(f"{flag_name(n)} {old!r} -> {new!r}" for n, (old, new) in changes.items())
    if not cfg.override_schedule:
        raise ConfigError("--resume", str(path), f"resume with the checkpoint's values, or pass --override-schedule to "
                          f"change the schedule from step {meta['step']} on", f"was written with another learning-rate "
                          f"schedule ({text})")
    return history + [{"step": meta["step"], "changes": changes}]


def meta_for(cfg: EngineConfig, step: int, layout: dict[str, int],
             schedule_overrides: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"step": step, "config": to_dict(cfg), "layout": layout, "format": FORMAT,
            "schedule_overrides": schedule_overrides or []}


def load_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Load in place into `state` (same structure as saved). A damaged checkpoint is a ConfigError."""
    import torch.distributed.checkpoint as dcp  # (see the comment at the top)

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
