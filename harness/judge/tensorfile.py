"""Tensors passed from a sandboxed job to the judge without pickle.

A bench job writes its outputs here and the judge reads them back: a JSON header line (name, dtype,
shape, byte range), then the raw little-endian bytes. Reading never executes anything the file holds
(torch.load would unpickle), checks every range against the file's size, and refuses files over a size
limit, so a candidate's file can be wrong but never harmful.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import torch

from harness.atomic import write_atomic

__all__ = ["DTYPES", "TensorFileError", "encode_tensors", "decode_tensors", "read_tensors", "write_tensors"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                                  "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
                                  "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class TensorFileError(ValueError):
    """A tensor file the judge cannot read (truncated, malformed, too large, an unknown dtype)."""


def encode_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """`tensors` (moved to CPU, made contiguous) as one JSON header line and their raw bytes."""
    entries, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _NAMES:
            raise TypeError(f"tensor {name!r}: dtype {tensor.dtype} is not one of {', '.join(DTYPES)}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        blob = ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size()) if flat.numel() else b""
        entries[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "offset": offset, "nbytes": len(blob)}
        blobs.append(blob)
        offset += len(blob)
    return json.dumps(entries, separators=(",", ":")).encode() + b"\n" + b"".join(blobs)


def decode_tensors(data: bytes, *, what: str = "tensors") -> dict[str, torch.Tensor]:
    """The tensors `encode_tensors` wrote, read without executing anything. Raises TensorFileError naming `what`
    and the fault."""
    head, _, body = data.partition(b"\n")
    try:
        entries = json.loads(head)
    except ValueError:
        raise TensorFileError(f"{what}: the header is not JSON") from None
    if not isinstance(entries, dict):
        raise TensorFileError(f"{what}: the header is not a table of tensors")
    out = {}
    for name, entry in entries.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(n) for n in entry["shape"]]
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise TensorFileError(f"{what}: tensor {name!r} has a malformed entry {entry!r}") from None
        count = 1
        for n in shape:
            if n < 0:
                raise TensorFileError(f"{what}: tensor {name!r} has a negative dimension")
            count *= n
        if nbytes != count * dtype.itemsize or offset < 0 or offset + nbytes > len(body):
            raise TensorFileError(f"{what}: tensor {name!r} does not fit its byte range")
        raw = bytearray(body[offset:offset + nbytes])
        flat = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        out[str(name)] = flat.reshape(shape)
    return out


def write_tensors(path: Path | str, tensors: dict[str, torch.Tensor]) -> None:
    """Write `tensors` to `path` atomically."""
    write_atomic(path, encode_tensors(tensors))


def read_tensors(path: Path | str, *, max_bytes: int = 1 << 31) -> dict[str, torch.Tensor]:
    """The tensors of a file written by write_tensors. Raises TensorFileError naming what is wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise TensorFileError(f"{path.name}: cannot read ({err.strerror})") from None
    if size > max_bytes:
        raise TensorFileError(f"{path.name}: {size} bytes, more than the {max_bytes} the judge reads")
    return decode_tensors(path.read_bytes(), what=path.name)
