"""Stress harness for GPU kernels: run a version next to noisy neighbours, compare it throughout.

`run_stress(case, seconds)` runs forward + backward of `case.version` over and over on its own
stream for `seconds` (counted from the end of the first iteration, which compiles), while other threads keep the GPU busy in the ways a training step does:

  gemm       cuBLAS GEMMs on another stream
  copy       large device-to-device copies on another stream (HBM bandwidth pressure)
  churn      allocation churn: caching-allocator alloc / fill / free of random sizes
  graph      replay of a captured CUDA graph (GEMM + elementwise) on another stream
  events     cross-stream producer / consumer: a producer stream rewrites the op's inputs before
             every call and the op's stream waits on its event; a consumer stream waits on the
             op's event and reduces its outputs. A kernel that ignores the current stream (or
             reads before its inputs are written) shows up as a mismatch.

Every iteration's outputs and input gradients are compared with the baseline's (computed once per
input set before the neighbours start): NaN/Inf, or a relative error ||x - ref|| / ||ref|| above
`case.tol`, is a failure. A watchdog (the calling thread) fails the run when no iteration finishes
within `hang_s` seconds. The report lists every failure; tests assert it is empty, and the negative
controls assert that broken versions are caught.
"""

import faulthandler
import math
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["StressCase", "StressReport", "run_stress"]


@dataclass(kw_only=True)
class StressCase:
    """What to stress: inputs, how to call the op, the version and its baseline."""

    name: str
    make_inputs: Callable[[int], dict[str, Any]]  # seed -> inputs (float leaves require grad)
    call: Callable[[Callable[..., Any], dict[str, Any]], list[torch.Tensor]]  # (op fn, inputs) -> outputs
    version: Callable[..., Any]
    baseline: Callable[..., Any]
    tol: float = 2e-2
    input_sets: int = 2


@dataclass(kw_only=True)
class StressReport:
    iterations: int = 0
    max_rel_err: float = 0.0
    failures: list[str] = field(default_factory=list)
    neighbour_iterations: dict[str, int] = field(default_factory=dict)

    def fail(self, msg: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(msg)


def _leaves(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad}


def _run(case: StressCase, fn, inputs, gouts) -> list[torch.Tensor]:
    for t in _leaves(inputs).values():
        t.grad = None
    outs = case.call(fn, inputs)
    torch.autograd.backward(outs, gouts)
    return [o.detach() for o in outs] + [t.grad for t in _leaves(inputs).values()]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.float(), ref.float()
    if not bool(torch.isfinite(x).all()):
        return math.inf
    denom = ref.norm().item()
    return (x - ref).norm().item() / (denom if denom > 0 else 1.0)


class _Neighbours:
    """Background GPU load in threads, each on its own stream, until stop()."""

    def __init__(self, device: torch.device, report: StressReport):
        self.device, self.report = device, report
        self.stop_flag = threading.Event()
        self.threads: list[threading.Thread] = []
        self.counts: dict[str, int] = {}
        # The graph is captured before any other thread touches the GPU: capture must not overlap
        # other work in the process.
        self.graph_stream = torch.cuda.Stream(device)
        self.g_in = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
        with torch.cuda.stream(self.graph_stream):
            self.g_out = torch.relu(self.g_in @ self.g_in)  # warm cuBLAS on this stream before capture
            self.graph_stream.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=self.graph_stream):
                self.g_out = torch.relu(self.g_in @ self.g_in) * 0.5
        self.graph_stream.synchronize()

    def _loop(self, name: str, body: Callable[[], None]) -> None:
        stream = self.graph_stream if name == "graph" else torch.cuda.Stream(self.device)
        self.counts[name] = 0
        try:
            with torch.cuda.stream(stream):
                while not self.stop_flag.is_set():
                    body()
                    self.counts[name] += 1
                    if self.counts[name] % 8 == 0:
                        stream.synchronize()  # bound the queue so stop() is prompt
            stream.synchronize()
        except Exception as err:  # a neighbour that breaks is a failure of the run, reported not raised
            self.report.fail(f"neighbour {name} raised {type(err).__name__}: {err}")

    def start(self) -> None:
        dev = self.device
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        src = torch.empty(256 * 2**20, device=dev, dtype=torch.float32).normal_()  # 1 GiB
        dst = torch.empty_like(src)
        rng = random.Random(0)

        def gemm():
            torch.mm(a, a)

        def copy():
            dst.copy_(src)

        def churn():
            t = torch.empty(rng.randint(1, 64) * 2**20, device=dev, dtype=torch.uint8)
            t.fill_(1)
            del t

        def graph():
            self.graph.replay()

        for name, body in (("gemm", gemm), ("copy", copy), ("churn", churn), ("graph", graph)):
            thread = threading.Thread(target=self._loop, args=(name, body), name=f"stress-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stop_flag.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.report.neighbour_iterations = dict(self.counts)


def run_stress(case: StressCase, seconds: float, *, hang_s: float = 60.0, neighbours: bool = True,
               device: torch.device | str = "cuda") -> StressReport:
    """Run case.version for `seconds` next to neighbours; see the module docstring."""
    device = torch.device(device)
    report = StressReport()
    pristine = [case.make_inputs(1000 + i) for i in range(case.input_sets)]
    refs, gouts = [], []
    for inputs in pristine:
        outs = case.call(case.baseline, inputs)
        g = [torch.randn_like(o) if o.dim() else torch.ones_like(o) for o in outs]
        gouts.append(g)
        refs.append([r.clone() for r in _run(case, case.baseline, inputs, g)])
    # The op works on its own copies, rewritten by the producer stream before every call.
    work = [{k: (v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v)
             for k, v in x.items()} for x in pristine]
    torch.cuda.synchronize(device)

    progress = [0]
    done = threading.Event()

    def worker() -> None:
        s_op, s_prod, s_cons = (torch.cuda.Stream(device) for _ in range(3))
        checksum = torch.zeros((), device=device, dtype=torch.float64)
        op_done = torch.cuda.Event()
        op_done.record(s_op)
        # The window opens after the first iteration: that one compiles the version's kernels (a JIT version
        # can spend longer than the whole window doing so beside the neighbours), and a version must be
        # stressed for `seconds` of running, not of compiling.
        deadline = math.inf
        i = 0
        try:
            while time.monotonic() < deadline and not report.failures:
                k = i % len(work)
                inputs = work[k]
                with torch.cuda.stream(s_prod):  # producer: rewrite inputs once the last call is done
                    s_prod.wait_event(op_done)
                    for name, t in inputs.items():
                        if isinstance(t, torch.Tensor):
                            with torch.no_grad():
                                t.copy_(pristine[k][name])
                    ready = torch.cuda.Event()
                    ready.record(s_prod)
                with torch.cuda.stream(s_op):
                    s_op.wait_event(ready)
                    results = _run(case, case.version, inputs, gouts[k])
                    op_done = torch.cuda.Event()
                    op_done.record(s_op)
                with torch.cuda.stream(s_cons):  # consumer: reads the results after the op's event
                    s_cons.wait_event(op_done)
                    for r in results:
                        checksum += r.detach().double().sum()
                s_cons.synchronize()
                for j, (r, ref) in enumerate(zip(results, refs[k])):
                    err = _rel(r, ref)
                    report.max_rel_err = max(report.max_rel_err, err)
                    if not math.isfinite(err):
                        report.fail(f"{case.name}: iteration {i}, result {j}: NaN/Inf")
                    elif err > case.tol:
                        report.fail(f"{case.name}: iteration {i}, result {j}: rel. error {err:.3e} > tol {case.tol:.1e}")
                i += 1
                progress[0] = i
                if i == 1:
                    deadline = time.monotonic() + seconds
            if not math.isfinite(checksum.item()):
                report.fail(f"{case.name}: consumer checksum is not finite")
        except Exception as err:  # reported as a failure of the run; the watchdog thread returns it
            report.fail(f"{case.name}: raised {type(err).__name__}: {err}")
        finally:
            report.iterations = i
            done.set()

    hood = _Neighbours(device, report) if neighbours else None
    if hood is not None:
        hood.start()
    thread = threading.Thread(target=worker, name=f"stress-{case.name}", daemon=True)
    thread.start()
    last, last_t = -1, time.monotonic()
    hung = False
    while not done.wait(timeout=0.2):
        if progress[0] != last:
            last, last_t = progress[0], time.monotonic()
        elif time.monotonic() - last_t > hang_s:
            report.fail(f"{case.name}: hang: no iteration finished in {hang_s:.0f} s (after {last} iterations)")
            faulthandler.dump_traceback(file=sys.stderr)
            hung = True
            break
    if hood is not None:
        hood.stop()
    if hung:
        done.wait(timeout=600)  # let a finite hang drain so the next test gets a clean GPU
    thread.join(timeout=60)
    torch.cuda.synchronize(device)
    return report
