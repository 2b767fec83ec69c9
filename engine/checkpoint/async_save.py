"""Asynchronous checkpoint saves (`--async-save`): copy to host memory, write in a background thread.

Why and how: docs/engine/checkpoint.md, section `engine/checkpoint/async_save.py`.
"""

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["BackgroundSaver", "FinishedSave"]


@dataclass(frozen=True)
class FinishedSave:
    step: int
    path: Path
    write_s: float  # wall time of the background write, publish included


class BackgroundSaver:
    """Runs one checkpoint save at a time in a thread; errors surface in the main thread."""

    def __init__(self, world_size: int):
        # new_group is collective: every rank builds the saver at the same point of the run
        self.group = dist.new_group(backend="gloo") if world_size > 1 else None
        self._buffers: dict[str, torch.Tensor] = {}
        self._thread: threading.Thread | None = None
        self._finished: FinishedSave | None = None
        self._error: BaseException | None = None
        self._step = -1
        self._device_copies = False

    def reserve(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """This key's host buffer, allocated once. Called for every key when the run starts, so a host that
        cannot hold the copy fails then, not at the first checkpoint, and no save pays for pinning memory."""
        buf = self._buffers.get(key)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            self._buffers[key] = buf
        return buf

    def stage(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of `tensor` in this key's buffer (call synchronize() before handing it on)."""
        assert self._thread is None, "staging over buffers a save is still writing"
        buf = self.reserve(key, tensor)
        buf.copy_(tensor, non_blocking=tensor.is_cuda)
        self._device_copies |= tensor.is_cuda
        return buf

    def synchronize(self) -> None:
        """Wait for the device-to-host copies of stage()."""
        if self._device_copies:
            torch.cuda.synchronize()
            self._device_copies = False

    def submit(self, step: int, save: Callable[[], Path]) -> None:
        """Start `save` (the collective save of step `step`) in the background; wait() first."""
        assert self._thread is None, "submit() while a save is in flight: wait() first"
        self._step = step
        self._thread = threading.Thread(target=self._run, args=(save,), name=f"checkpoint-step-{step}", daemon=True)
        self._thread.start()

    def _run(self, save: Callable[[], Path]) -> None:
        t0 = time.perf_counter()
        try:
            path = save()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which re-raises it in wait()
            self._error = err
            return
        self._finished = FinishedSave(step=self._step, path=path, write_s=time.perf_counter() - t0)

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def poll(self) -> FinishedSave | None:
        """The save that finished since the last call, if any (never blocks); raises if it failed."""
        if self._thread is not None and not self._thread.is_alive():
            return self.wait()
        return None

    def wait(self) -> FinishedSave | None:
        """Block until the save in flight (if any) is published; return it once; raise if it failed."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"the asynchronous checkpoint save of step {self._step} failed: "
                               f"{type(error).__name__}: {error}") from error
        finished, self._finished = self._finished, None
        return finished
