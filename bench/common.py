"""What the GPU benchmark scripts share: the relative error they check with, the event timer, the launcher,
the nvidia-smi poller, and who else is on the GPUs.

METHOD.md (device tool): compare with ||x - ref|| / ||ref|| in float64 (non-finite never passes),
time with device events after a warm-up call, take the median, rotate among input sets so repeated
calls do not measure the cache.
"""

import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["rel_err", "median_call_ms", "torchrun", "launcher", "GpuPoller", "others_on_gpus", "parse_compute_apps"]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64; inf when x has NaN/Inf; a zero ref counts as norm 1."""
    x, ref = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x).all():
        return math.inf
    denom = ref.norm().item()
    return (x - ref).norm().item() / (denom if denom > 0 else 1.0)


def median_call_ms(fn: Callable[[Any], Any], sets: Sequence[Any], iters: int, *, warm: bool = True) -> float:
    """Median device time (ms) of one call of fn(sets[i % len(sets)]), events around each call."""
    if warm:
        fn(sets[0])
        torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iters):
        start.record()
        fn(sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def torchrun(nproc: int) -> list[str]:
    """`torchrun --standalone --nproc-per-node N` under this Python (standalone: a free local rendezvous port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]


def launcher(nproc: int) -> list[str]:
    """How a bench starts `-m engine ...`: this Python for one process, torchrun for several."""
    return torchrun(nproc) if nproc > 1 else [sys.executable]


class GpuPoller:
    """nvidia-smi sampled while a job runs, per GPU: the largest memory.used, and the median SM clock and power draw
    over the samples where the GPU was busy (utilization >= 90 %: not start-up, compilation or idle time).

    The clock says whether two timings compare like with like: an H200 under a sustained GEMM load runs below its
    boost clock (power), which a short benchmark never shows. Without nvidia-smi every list is empty."""

    def __init__(self, interval_ms: int = 500):
        self._samples: dict[int, list[tuple[float, ...]]] = {}  # (MiB, MHz, W, utilization %)
        self._proc = None
        exe = shutil.which("nvidia-smi")
        if exe:
            self._proc = subprocess.Popen([exe, "--query-gpu=index,memory.used,clocks.sm,power.draw,utilization.gpu",
                                           "--format=csv,noheader,nounits", f"-lms={interval_ms}"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self.add_line(line)

    def add_line(self, line: str) -> None:
        """One nvidia-smi CSV line (index, MiB, MHz, W, %); lines that are not numbers ([N/A], headers) are skipped."""
        parts = [p.strip() for p in line.split(",")]
        try:
            index, *values = int(parts[0]), *(float(p) for p in parts[1:5])
        except ValueError:
            return
        if len(values) == 4:
            self._samples.setdefault(index, []).append(tuple(values))

    def stop(self) -> dict[str, list[float]]:
        """{"used_gib": [...], "sm_mhz": [...], "power_w": [...]}, one entry per GPU in index order."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._thread.join(timeout=10)
        gpus = [self._samples[i] for i in sorted(self._samples)]
        busy = [[s for s in g if s[3] >= 90] or g for g in gpus]
        return {"used_gib": [max(s[0] for s in g) / 1024 for g in gpus],
                "sm_mhz": [statistics.median(s[1] for s in g) for g in busy],
                "power_w": [statistics.median(s[2] for s in g) for g in busy]}


def parse_compute_apps(apps_csv: str, gpus_csv: str, visible: str | None = None) -> list[str]:
    """One line per process holding a GPU ("GPU 1: pid 4242 python3, 27503 MiB"), from nvidia-smi's
    `--query-compute-apps=gpu_uuid,pid,process_name,used_memory` and `--query-gpu=index,uuid` CSV (noheader,
    nounits), kept to the GPUs `visible` names (CUDA_VISIBLE_DEVICES: indices or UUIDs; None: every GPU)."""
    index = {}
    for line in gpus_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            index[parts[1]] = parts[0]
    keep = None if visible is None else {v.strip() for v in visible.split(",") if v.strip()}
    out = []
    for line in apps_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or parts[0] not in index:
            continue
        uuid, pid, name, mib = parts
        if keep is not None and not keep & {index[uuid], uuid}:
            continue
        out.append(f"GPU {index[uuid]}: pid {pid} {os.path.basename(name)}, {mib} MiB")
    return sorted(out)


def others_on_gpus(settle_s: float = 3.0) -> list[str]:
    """The processes holding this job's GPUs now (parse_compute_apps); [] without nvidia-smi. A benchmark row timed
    beside them is not a clean measurement: their memory and power share the card. A process seen is looked for
    again after `settle_s`: the driver lists a process that just exited (the previous row's) for a moment."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    query = [[exe, "--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"],
             [exe, "--query-gpu=index,uuid", "--format=csv,noheader,nounits"]]

    def seen() -> list[str]:
        apps, gpus = (subprocess.run(q, capture_output=True, text=True, timeout=30).stdout for q in query)
        return parse_compute_apps(apps, gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))

    if not seen():
        return []
    time.sleep(settle_s)
    return seen()
