"""Run candidate code in a child process that hands back data only; the test asserts on it in its own process.

The judge's test process never imports candidate code (harness/judge/barrier.py), so a test that needs the engine
calls it here:

    with Candidate(REPO) as engine:
        out = engine.call("tests.milestones.alignment_calls:forward", "tiny", weights, tokens)

The child (`python -m harness.judge.candidate FD_IN FD_OUT`) imports the named module, calls the function and
sends back its result. What crosses is data: None, bools, numbers, strings, lists, tuples, dicts with string keys,
torch dtypes and tensors (raw bytes, harness/judge/tensorfile.py; never a pickle), on a pipe of its own: the
child's stdout and stderr go to a log, so nothing it prints reaches the judge's pipe. Whatever the child does, the
test process reads a value of that grammar or fails; the child cannot run code in it. An exception in the child
comes back as CandidateError (its type's names, its message, the traceback as text).

torch and the tensor codec are imported when a value first holds a tensor or a dtype: a call that passes names and
numbers (a constant of the engine's config) costs neither process torch's import (2 s). A value can hold a torch
object only in a process that has imported torch, so encode looks for torch's types only there.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from harness.settings import child_env, python_path

if TYPE_CHECKING:
    import torch

__all__ = ["Candidate", "CandidateError", "encode", "decode", "MAX_FRAME"]

MAX_FRAME = 1 << 33  # 8 GiB: far above any test's tensors, below anything that would exhaust the judge
_LENGTH = struct.Struct(">Q")


class CandidateError(Exception):
    """The child raised, died, or sent something that is not data. `types`: the exception's class and its bases
    by name (outermost first), so a test can ask `err.is_a("ConfigError")` without importing the engine."""

    def __init__(self, message: str, *, types: tuple[str, ...] = (), details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.types = types
        self.details = details  # the child's traceback or log tail

    def is_a(self, name: str) -> bool:
        return name in self.types

    def __str__(self) -> str:
        kind = f"{self.types[0]}: " if self.types else ""
        return f"{kind}{self.message}" + (f"\n{self.details}" if self.details else "")


# ---------------------------------------------------------------- the value grammar


def _tensorfile() -> ModuleType:
    """harness/judge/tensorfile.py (and torch), for the first value that holds a tensor or a dtype."""
    from harness.judge import tensorfile

    return tensorfile


def encode(value: Any) -> bytes:
    """One value of the grammar as a frame body: a JSON line (tensors by reference), then the tensors' bytes (none
    at all when it holds no tensor)."""
    tensors: dict[str, torch.Tensor] = {}
    loaded = sys.modules.get("torch")  # None: this process holds no torch object

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if loaded is not None and isinstance(v, loaded.Tensor):
            key = str(len(tensors))
            tensors[key] = v
            return {"$t": key}
        if loaded is not None and isinstance(v, loaded.dtype):
            return {"$dtype": str(v).removeprefix("torch.")}
        if isinstance(v, tuple):  # torch.Size too
            return {"$tuple": [walk(x) for x in v]}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise TypeError("a dict crossing to or from the candidate needs string keys")
            return {"$dict": {k: walk(x) for k, x in v.items()}}
        raise TypeError(f"a {type(v).__name__} cannot cross to or from the candidate (data only: numbers, strings, "
                        "lists, tuples, dicts, dtypes, tensors)")

    tree = json.dumps(walk(value), separators=(",", ":")).encode()
    return tree + b"\n" + (_tensorfile().encode_tensors(tensors) if tensors else b"")


def decode(body: bytes) -> Any:
    """The value `encode` wrote. Raises ValueError for anything outside the grammar."""
    head, _, rest = body.partition(b"\n")
    try:
        tree = json.loads(head)
        tensors = _tensorfile().decode_tensors(rest, what="the candidate's answer") if rest else {}
    except ValueError as err:  # TensorFileError too
        raise ValueError(f"not a value of the grammar: {err}") from None

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict) and len(v) == 1:
            (tag, inner), = v.items()
            if tag == "$t" and isinstance(inner, str) and inner in tensors:
                return tensors[inner]
            if tag == "$dtype" and inner in _tensorfile().DTYPES:
                return _tensorfile().DTYPES[inner]
            if tag == "$tuple" and isinstance(inner, list):
                return tuple(walk(x) for x in inner)
            if tag == "$dict" and isinstance(inner, dict):
                return {str(k): walk(x) for k, x in inner.items()}
        raise ValueError(f"not a value of the grammar: {str(v)[:80]}")

    return walk(tree)


def _write_frame(fd: int, body: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None) -> bytes:
    (length,) = _LENGTH.unpack(_read_exact(fd, _LENGTH.size, deadline))
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes, more than the {MAX_FRAME} the judge reads")
    return _read_exact(fd, length, deadline)


# ---------------------------------------------------------------- the test's side


class Candidate:
    """A child process serving calls into the checkout at `root` (its code first on the child's path)."""

    def __init__(self, root: Path | str, *, timeout_s: float = 900.0, env: dict[str, str] | None = None) -> None:
        self.root = Path(root).resolve()
        self.timeout_s = timeout_s
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._log = None

    def __enter__(self) -> Candidate:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        path = os.pathsep.join(dict.fromkeys([str(self.root), *python_path()]))
        env = child_env({**(self.env or {}), "PYTHONPATH": path})
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-m", "harness.judge.candidate", str(to_child_r), str(from_child_w)],
                                      cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, pass_fds=(to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        self._to, self._from = to_child_w, from_child_r
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is None:
            return
        for fd in (self._to, self._from):
            os.close(fd)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._log.close()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of what the child printed (stdout and stderr)."""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-chars:]

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        """`module:function` (a dotted attribute path after the colon) called in the child with `args`, `kwargs`;
        its return value. Raises CandidateError when it raises, dies, times out or answers outside the grammar."""
        return self._ask(target, {"call": target, "args": list(args), "kwargs": kwargs})

    def value(self, target: str) -> Any:
        """The value of `module:attribute` in the child (a constant such as a tuple of names), as `call` answers."""
        return self._ask(target, {"get": target})

    def _ask(self, target: str, request: dict) -> Any:
        if self._proc is None:
            raise RuntimeError("Candidate used outside `with Candidate(...)`")
        _write_frame(self._to, encode(request))
        try:
            answer = decode(_read_frame(self._from, time.monotonic() + self.timeout_s))
        except TimeoutError:
            self._proc.kill()
            raise CandidateError(f"{target} did not answer within {self.timeout_s:g} s (the child was killed)",
                                 details=self.log_tail()) from None
        except EOFError:
            code = self._proc.wait()
            raise CandidateError(f"the candidate's process died during {target} (exit {code})", details=self.log_tail()) from None
        except ValueError as err:
            raise CandidateError(f"{target} answered with something that is not data: {err}") from None
        if not isinstance(answer, dict) or not ({"value"} == set(answer) or {"error"} == set(answer)):
            raise CandidateError(f"{target} answered outside the protocol")
        if "error" in answer:
            err = answer["error"]
            if not isinstance(err, dict):
                raise CandidateError(f"{target} answered outside the protocol")
            types = tuple(str(t) for t in err.get("types", ()) if isinstance(t, str))
            raise CandidateError(str(err.get("message", "")), types=types, details=str(err.get("traceback", "")))
        return answer["value"]


# ---------------------------------------------------------------- the child's side


def _resolve(target: str) -> Any:
    module, _, attrs = target.partition(":")
    obj: Any = importlib.import_module(module)
    for name in attrs.split("."):
        obj = getattr(obj, name)
    return obj


def serve(fd_in: int, fd_out: int) -> None:
    """Answer calls until the test closes its end of the pipe."""
    while True:
        try:
            request = decode(_read_frame(fd_in))
        except EOFError:
            return
        try:
            if "get" in request:
                value = _resolve(request["get"])
            else:
                value = _resolve(request["call"])(*request["args"], **request["kwargs"])
            body = encode({"value": value})
        except BaseException as err:  # everything goes back to the test, which decides
            types = tuple(c.__name__ for c in type(err).__mro__)
            body = encode({"error": {"types": list(types), "message": str(err),
                                     "traceback": "".join(traceback.format_exception(err))[-6000:]}})
        _write_frame(fd_out, body)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
