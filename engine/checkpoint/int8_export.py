"""`python -m engine export-int8`: a checkpoint -> one compact file of int8 weights, round-tripped and evaluated.

Why and how: docs/engine/checkpoint.md, section `engine/checkpoint/int8_export.py`.
"""

import dataclasses
import hashlib
import io
import struct
import zlib
from pathlib import Path
from typing import Any

import torch

from engine.atomic_files import write_bytes_atomic
from engine.checkpoint.store import read_meta, select_checkpoint
from engine.config import EngineConfig, to_dict
from engine.data.sources import build_data, default_cache_dir
from engine.distributed import ParallelState
from engine.errors import ConfigError
from engine.evaluate import evaluate
from engine.checkpoint.hf_export import check_outside, config_from_saved, load_full_weights
from engine.model import Transformer, build_model
from engine.ops import resolve_ops
from engine.train import resolve_device

__all__ = ["export_int8", "eval_int8", "quantize_rows", "dequantize_rows", "quantize_weights", "encode_int8", "decode_int8",
           "load_int8", "model_from_weights", "QUANTIZE_MIN_NUMEL", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"TEMPER-INT8\n"
FORMAT_VERSION = 1
QUANTIZE_MIN_NUMEL = 65_536  # smaller 2-D tensors (and every 1-D one) stay fp32
_HEADER = struct.Struct("<IQ32s")  # version, payload length, SHA-256 of the payload
_FIELD = "int8 export"


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: (q [rows, cols] int8, scale [rows] fp32) with w ~ q x scale. A row of zeros has
    scale 0 and is read back exactly."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127.0
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / divisor[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[:, None]


def quantize_weights(weights: dict[str, torch.Tensor], min_numel: int = QUANTIZE_MIN_NUMEL) -> dict[str, dict[str, torch.Tensor]]:
    """{name: {"q", "scale"}} for the 2-D tensors of at least min_numel elements, {name: {"w"}} (fp32) for the rest."""
    out = {}
    for name, w in weights.items():
        if w.dim() == 2 and w.numel() >= min_numel:
            q, scale = quantize_rows(w)
            out[name] = {"q": q, "scale": scale}
        else:
            out[name] = {"w": w.float().clone()}
    return out


def encode_int8(cfg: EngineConfig, tensors: dict[str, dict[str, torch.Tensor]], source: str) -> bytes:
    buffer = io.BytesIO()
    torch.save({"config": to_dict(cfg), "source": source, "tensors": tensors}, buffer)
    payload = zlib.compress(buffer.getvalue(), level=9)
    return MAGIC + _HEADER.pack(FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def decode_int8(data: bytes, where: str) -> dict[str, Any]:
    """The document `encode_int8` wrote; ConfigError for anything else (wrong kind of file, truncated, corrupt)."""
    fix = "export it again with `python -m engine export-int8 --checkpoint CKPT --out FILE`"
    head = len(MAGIC) + _HEADER.size
    if not data.startswith(MAGIC):
        raise ConfigError(_FIELD, where, fix, "is not an int8 export of this engine (no TEMPER-INT8 header)")
    if len(data) < head:
        raise ConfigError(_FIELD, where, fix, f"is truncated ({len(data)} bytes, shorter than its {head}-byte header)")
    version, length, digest = _HEADER.unpack_from(data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise ConfigError(_FIELD, where, fix, f"has format version {version}; this engine reads {FORMAT_VERSION}")
    payload = data[head:]
    if len(payload) != length:
        raise ConfigError(_FIELD, where, fix, f"is truncated or padded ({len(payload)} payload bytes, the header says "
                          f"{length})")
    if hashlib.sha256(payload).digest() != digest:
        raise ConfigError(_FIELD, where, fix, "is corrupt (its payload fails the SHA-256 in its header)")
    return torch.load(io.BytesIO(zlib.decompress(payload)), weights_only=True)


def load_int8(path: str | Path) -> tuple[EngineConfig, dict[str, torch.Tensor]]:
    """The round trip: the run's config and its weights as fp32 tensors (int8 ones dequantised), engine names,
    full (unsharded) shapes."""
    document = decode_int8(Path(path).read_bytes(), str(path))
    weights = {name: dequantize_rows(t["q"], t["scale"]) if "q" in t else t["w"] for name, t in document["tensors"].items()}
    return config_from_saved(document["config"]), weights


def model_from_weights(cfg: EngineConfig, weights: dict[str, torch.Tensor], device: torch.device,
                       dtype: torch.dtype) -> Transformer:
    """A one-process model holding `weights` (full shapes, as load_full_weights gathers them). The vocabulary pad
    multiple absorbs the checkpoint's TP size, so the padded vocabulary is the one the weights have."""
    cfg = dataclasses.replace(cfg, tp=1, vocab_pad_multiple=cfg.vocab_pad_multiple * cfg.tp, sequence_parallel=False)
    model = build_model(cfg, ParallelState.single(device), resolve_ops(cfg, device), dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])
    return model


def _evaluate(cfg: EngineConfig, weights: dict[str, torch.Tensor], data: Any, device: torch.device,
              dtype: torch.dtype) -> tuple[float, float, int]:
    model = model_from_weights(cfg, weights, device, dtype)
    token_bytes = torch.tensor(data.tokenizer.token_byte_lengths(), dtype=torch.float64)
    return evaluate(model, data.validation, cfg, ParallelState.single(device), token_bytes)


def _validation_data(cfg: EngineConfig) -> Any:
    """The run's data (its config's sources), which must have a validation split to evaluate on."""
    data = build_data(cfg, cache_dir=default_cache_dir(cfg), dp_rank=0, dp_size=1)
    if data.validation is None:
        raise ConfigError("--eval-samples", cfg.eval_samples, "pass --eval-samples 0, or use a run whose data has a "
                          "validation split", "has no validation data to read")
    return data


def eval_int8(path: str, *, eval_samples: int = -1, device: str = "auto") -> dict[str, Any]:
    """`python -m engine eval-int8`: verify an export (header, length, SHA-256: refused before anything is
    unpickled) and evaluate its round-tripped weights on the first --eval-samples validation samples of the run's
    data, as export-int8 does. Returns (and prints) what it measured."""
    if eval_samples < -1:
        raise ConfigError("--eval-samples", eval_samples, "use 0 (verify only), N, or -1 (the run's own)", "is out of range")
    if not Path(path).is_file():
        raise ConfigError("--int8", path, "name a file written by `python -m engine export-int8`", "does not exist")
    cfg, weights = load_int8(path)
    cfg = dataclasses.replace(cfg, device=device, compute_dtype="auto",
                              eval_samples=cfg.eval_samples if eval_samples == -1 else eval_samples)
    report: dict[str, Any] = {"int8": str(path), "bytes": Path(path).stat().st_size, "tensors": len(weights)}
    print(f"[EVAL-INT8] {path}: {report['bytes']:,} bytes, checksum verified, {len(weights)} tensors "
          f"({cfg.preset}, hidden {cfg.hidden_size}, {cfg.num_layers} layers)")
    if cfg.eval_samples == 0:
        print("[EVAL-INT8] no evaluation (--eval-samples 0)")
        return report
    data = _validation_data(cfg)
    device_type, dtype = resolve_device(cfg)
    loss, bpb, tokens = _evaluate(cfg, weights, data, torch.device(device_type), dtype)
    report.update(val_loss=loss, val_bpb=bpb, tokens=tokens)
    print(f"[EVAL-INT8] val_loss={loss:.6f} val_bpb={bpb:.6f} over {tokens} tokens ({device_type}, "
          f"{str(dtype).removeprefix('torch.')})")
    return report


def _check_target(target: Path, checkpoint: Path) -> None:
    """`--out` names a new file or an earlier int8 export, outside the checkpoint (whose manifest lists its files)."""
    if target.is_dir():
        raise ConfigError("--out", str(target), "name a file (the export is one file)", "is a folder")
    check_outside(target, checkpoint)
    if target.exists():
        with target.open("rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                raise ConfigError("--out", str(target), "name a new file (or an earlier int8 export to replace)",
                                  "is a file that is not an int8 export; replacing it would lose it")


def export_int8(checkpoint: str, out: str, *, min_numel: int = QUANTIZE_MIN_NUMEL, eval_samples: int = -1,
                device: str = "auto") -> dict[str, Any]:
    """Write `out`, read it back, evaluate both; returns (and prints) what it measured."""
    if min_numel < 1:
        raise ConfigError("--quantize-min-numel", min_numel, "use a positive number of elements (default 65536)",
                          "is out of range")
    if eval_samples < -1:
        raise ConfigError("--eval-samples", eval_samples, "use 0 (no evaluation), N, or -1 (the run's own)", "is out of range")
    path, _ = select_checkpoint(checkpoint, Path(checkpoint), flag="--checkpoint")  # verified against its checksums
    target = Path(out)
    _check_target(target, path)
    cfg, weights = load_full_weights(path)
    cfg = dataclasses.replace(cfg, device=device, compute_dtype="auto",
                              eval_samples=cfg.eval_samples if eval_samples == -1 else eval_samples)
    device_type, dtype = resolve_device(cfg)
    tensors = quantize_weights(weights, min_numel)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(target, encode_int8(cfg, tensors, source=str(path)))
    _, loaded = load_int8(target)
    quantized = sorted(n for n, t in tensors.items() if "q" in t)
    report: dict[str, Any] = {
        "checkpoint": str(path), "out": str(target), "bytes": target.stat().st_size,
        "fp32_bytes": sum(4 * w.numel() for w in weights.values()), "int8_tensors": quantized,
        "fp32_tensors": sorted(set(tensors) - set(quantized)), "step": int(read_meta(path)["step"]),
    }
    print(f"[EXPORT-INT8] {path} -> {target}: {report['bytes']:,} bytes (fp32 weights {report['fp32_bytes']:,} bytes, "
          f"{report['fp32_bytes'] / report['bytes']:.2f}x smaller); {len(quantized)} tensors int8 per row, "
          f"{len(report['fp32_tensors'])} kept fp32 (1-D, or 2-D with fewer than {min_numel:,} elements)")
    if cfg.eval_samples == 0:
        print("[EXPORT-INT8] no evaluation (--eval-samples 0)")
        return report
    data = _validation_data(cfg)
    dev = torch.device(device_type)
    report["original"] = _evaluate(cfg, weights, data, dev, dtype)
    report["int8"] = _evaluate(cfg, loaded, data, dev, dtype)
    (loss0, bpb0, tokens), (loss1, bpb1, _) = report["original"], report["int8"]
    print(f"[EXPORT-INT8] step={report['step']} val_loss {loss0:.6f} -> {loss1:.6f} ({loss1 - loss0:+.6f}), "
          f"val_bpb {bpb0:.6f} -> {bpb1:.6f} ({bpb1 - bpb0:+.6f}) over {tokens} tokens ({device_type}, "
          f"{str(dtype).removeprefix('torch.')})")
    return report
