"""The judge's op bench and stress job: `python -m harness.opbench {bench,stress} --op OP ...`.

The judge runs this inside the sandbox, once in a checkout of the base commit (role `reference`: the
base's `baseline` version) and once in the judged checkout (role `candidate`: the version a milestone
judges), alternately. It loads the op version through the engine's own registry and writes what it
computes to its folder; the judge decides (harness/judge/opjudge.py). The op's time per call is measured
here, on the device, like the checksums and by code guarded alike (below); the judge also times the
segments by the arrival of the `[BENCH]` lines on its pipe, which bounds what the device times can hide.

bench
  1. correctness: the cases harness/judge/opcases.py draws from the judge's seed (fresh shapes every
     judging, in the layouts the model passes and at magnitudes where only a numerically safe form
     survives): outputs and gradients to `case-<i>.tensors`; the judge recomputes them in fp32.
  2. timing at the milestone's shape: segments of `reps` forward + backward calls, each on fresh inputs,
     weights and labels included (redrawn in place on the device from the seed and the rep number, so
     nothing keyed on a tensor's data, address or identity can be served from a cache), after an L2 flush,
     all on the current stream. Every op call is timed on the device by CUDA events recorded on the current
     stream just before the forward and just after the backward (on CPU, the host clock around the call):
     `times.tensors`. So that those events time the GPU's work and not how fast this machine's Python
     launches kernels, every call is paced: the judge's own kernel spins on the GPU's nanosecond timer
     (%globaltimer) for `--pace-us` before the first event, which keeps the host (the bench's launches and the
     version's) ahead of the GPU. Unpaced and timed by the wall clock, an rmsnorm of 0.17 ms on an H200
     behind 0.45 ms of its own launches and 1.3 ms of the bench's read as 0.6-2 ms (bench/opbench_pace.py).
     Overhead segments do the same work minus the op: the judge's wall-clock estimate of the op (op segments
     minus overhead segments) is too coarse to time a 0.2 ms op under ~1 ms of the bench's own work per
     call, but it is an upper bound that work a version moved outside its events cannot escape.
     Each call leaves a checksum row in `checks.tensors`: for every output and gradient, K random rank-one
     projections of all of it (new ones every call) and its norm, which the judge holds against the
     reference process's rows: a skipped, cached or partly computed call cannot match, and the rows together
     estimate how far the version's timed results are from the baseline's.
  Protocol lines (`[BENCH] segment=... start|end`) go out with one write(2) each, on a copy of stdout taken
  before the version was imported: a version's own output cannot split or replace them, and the judge
  refuses any segment line it did not expect (harness/judge/opjudge.py).
stress
  The op at the milestone's shape while another thread keeps the GPU busy with GEMMs, 1 GiB copies and
  allocation churn on a stream of its own, its inputs rewritten before every call on a producer stream
  (the op's stream waits on that event: a kernel that ignores the current stream reads half-written
  inputs), for `--seconds`. Every iteration's checksum row goes to `checks.tensors` beside the unloaded one; the
  judge requires them to agree. On CPU, the load is a thread of matmuls.

What the measurement stands on (this module's functions, the case and file modules, the torch callables
that order, time and checksum the work and the dispatcher's kernels below them, the output channel) is checked
at every segment boundary, and after every call that the version left nothing behind that runs on the bench's
own torch calls (a mode, a tensor subclass); a version that rebinds any of it (or swaps a function's code) gets
the bench's refusal, exit 3, no results.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

from harness.judge.opcases import (DTYPES, OPS, GradSink, call_op, draw_cases, fused_grad, grad_names, make_inputs, redraw,
                                   result_names, timing_case)
from harness.judge.tensorfile import write_tensors

__all__ = ["main"]

_FLUSH_BYTES = 256 * 2**20  # larger than any Hopper L2 (50 MiB)


_CHANNEL: list[tuple[int, tuple[int, int]]] = []  # (fd, (st_dev, st_ino)): the protocol's copy of stdout


class _Tampered(RuntimeError):
    """The version changed what the bench measures with; the bench refuses to hand in results."""


def _open_channel() -> None:
    """Take the protocol's own copy of stdout, before any version code runs."""
    fd = os.dup(1)
    st = os.fstat(fd)
    _CHANNEL[:] = [(fd, (st.st_dev, st.st_ino))]


def _say(text: str) -> None:
    """One protocol line in one write(2) (atomic on the judge's pipe: nothing can land inside it), on the
    bench's own copy of stdout; refused when that copy no longer is the pipe it was (dup2 over it). Python's
    buffered output goes first, and the line starts with a newline of its own: whatever a version printed
    before (a line without its end, a progress bar) never shares the protocol line."""
    if not _CHANNEL:
        _open_channel()
    fd, identity = _CHANNEL[0]
    sys.stdout.flush()
    sys.stderr.flush()
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != identity:
        raise _Tampered("the bench's output channel was replaced")
    os.write(fd, f"\n[BENCH] {text}\n".encode())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load(op: str, version: str, device: torch.device):
    from engine.ops.dispatch import load_op, resolve_version  # guard: allow dag -- the bench runs in the candidate's process: loading the version is its job

    name = resolve_version(op, "", device.type) if version == "default" else version
    return name, load_op(op, name)


def _results(case, inputs: dict[str, torch.Tensor], outs: list[torch.Tensor],
             sinks: dict[str, GradSink]) -> dict[str, torch.Tensor]:
    """Outputs and gradients by name. An input autograd left without a gradient has gradient zero (what
    None means), recorded as zeros so the judge compares it like any other result; a weight with an fp32
    accumulator (`main_grad`) has the accumulator as the engine ends up with it."""
    expected = len([n for n in result_names(case) if n.startswith("out.")])
    if len(outs) != expected:
        raise RuntimeError(f"{case.label()}: the version returned {len(outs)} output(s), the contract {expected}")
    got = {f"out.{i}": o for i, o in enumerate(outs)}
    for name in grad_names(case):
        grad = inputs[name].grad
        if name in sinks:
            got[f"grad.{name}"] = fused_grad(sinks[name], grad)
        else:
            got[f"grad.{name}"] = torch.zeros_like(inputs[name]) if grad is None else grad
    return got


def _run(fn, case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Forward, then backward with the case's upstream gradients; every output and gradient by name."""
    for name in grad_names(case):
        inputs[name].grad = None
    sinks: dict[str, GradSink] = {}
    outs = call_op(fn, case, inputs, sinks)
    torch.autograd.backward(outs, [inputs[f"dout.{i}"].to(o.dtype) for i, o in enumerate(outs)])
    results = _results(case, inputs, outs, sinks)
    _check_left_behind(results)
    return results


# Dispatch keys under which torch runs Python code on every op (a dispatch mode, the Python dispatcher).
_PYTHON_KEYS = ("Python", "PythonDispatcher", "PythonTLSSnapshot")


def _check_left_behind(results: dict[str, torch.Tensor]) -> None:
    """What a call may not leave running in the bench: a mode that sees every torch call after it (the checksum's
    first op would then run whatever work the version deferred, after the call's stop event, so its events time
    less than it did) or results of a tensor subclass (whose methods would do the same). Checked after every call."""
    # guard: allow public-surface -- torch has no public query of its mode stacks and dispatch keys
    dispatch = torch._C
    keys = [k for k in _PYTHON_KEYS if dispatch._dispatch_tls_is_dispatch_key_included(getattr(dispatch.DispatchKey, k))]
    modes = dispatch._len_torch_function_stack() + dispatch._len_torch_dispatch_stack()
    odd = sorted(f"{name} ({type(t).__qualname__})" for name, t in results.items() if type(t) is not torch.Tensor)
    if modes or keys or odd:
        raise _Tampered("the op version left code behind its call that runs on the bench's own torch calls: "
                        + "; ".join([f"{modes} torch function/dispatch mode(s) still active"] * bool(modes)
                                    + [f"dispatch keys {', '.join(keys)} on"] * bool(keys)
                                    + [f"results of a tensor subclass: {', '.join(odd)}"] * bool(odd)))


def _matrix(shape: torch.Size) -> tuple[int, int]:
    """(rows, columns) a result is read as: its last dimension against all the others (a scalar: 1 x 1)."""
    columns = shape[-1] if len(shape) and shape[-1] else 1
    return max(1, int(torch.Size(shape).numel()) // columns), columns


class _Checksums:
    """One row per call: for each result, K rank-one random projections of all of it, `pr^T M pc` with M the
    result as a (rows x columns) matrix, and its norm (fp32). Every element counts, so a call computed only
    where a sample would look cannot match; the projections are drawn anew for every call (from the seed and
    the row, the same in both processes), and E[(pr^T D pc)^2] = ||D||^2 lets the judge estimate the relative
    difference of two processes' results from the rows alone. Reading each result once (a GEMM with K columns,
    fp32 accumulation) keeps the checksum to about the cost of writing the result, which the overhead
    segments measure and the judge subtracts."""

    K = 4

    def __init__(self, case, shapes: dict[str, torch.Size], device: torch.device, seed: int, rows: int,
                 moving: bool = True):
        self.names = result_names(case)
        self.seed, self.moving, self.device = seed, moving, device  # stress: one projection for every call
        self.dims = {n: _matrix(shapes[n]) for n in self.names}
        self.rows = torch.zeros(rows, len(self.names), self.K + 1, device=device)
        self._g = torch.Generator(device=device)
        self._fixed = None if moving else self._draw(0)

    def _draw(self, row: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        self._g.manual_seed((self.seed ^ 0x5EED) * 1_000_003 + row)
        return {n: (torch.randn(r, self.K, generator=self._g, device=self.device),
                    torch.randn(c, self.K, generator=self._g, device=self.device)) for n, (r, c) in self.dims.items()}

    def record(self, row: int, results: dict[str, torch.Tensor], *, into: torch.Tensor | None = None,
               draw_row: int | None = None) -> None:
        """Row `row` of `into` (default: the rows kept for the judge) from `results`, on the device;
        `draw_row`: whose projections to use (default `row`; the overhead segments draw as the op's call would)."""
        rows = self.rows if into is None else into
        projections = self._fixed if self._fixed is not None else self._draw(row if draw_row is None else draw_row)
        with torch.no_grad():  # outputs carry autograd history: a row written from them would keep every graph
            for j, name in enumerate(self.names):
                m = results[name].detach().reshape(self.dims[name])
                pr, pc = projections[name]
                y = torch.mm(m, pc.to(m.dtype))  # fp32 accumulation, one rounding to the result's dtype
                rows[row, j, : self.K] = (y.float() * pr).sum(dim=0)
                rows[row, j, self.K] = torch.linalg.vector_norm(m, dtype=torch.float32)


def _fresh(case, inputs: dict[str, torch.Tensor], g: torch.Generator, seed: int, rep: int) -> None:
    """Redraw every input but the upstream gradients in place (weights and labels too), from (seed, rep)."""
    g.manual_seed(seed * 1_000_003 + rep)
    redraw(case, inputs, g)


# One thread reads %globaltimer (ns) until `ns` have passed: a wait of wall time on the GPU's queue. Compiled at
# run time by NVRTC through torch's jiterator (no host compiler needed), once per process.
_SPIN_CODE = """
template <typename T> T temper_spin(T x, T ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < (unsigned long long)ns);
  return x;
}
"""


class _Pace:
    """The judge's spin before a timed call (see the module docstring); nothing on CPU, where nothing is queued."""

    def __init__(self, device: torch.device, us: float):
        self.ns = float(us) * 1e3 if device.type == "cuda" else 0.0
        if self.ns:
            # guard: allow public-surface -- torch's only runtime CUDA compiler without a host compiler (NVRTC)
            self._spin = torch.cuda.jiterator._create_jit_fn(_SPIN_CODE, ns=0.0)
            self._token = torch.zeros(1, dtype=torch.float64, device=device)

    def __call__(self) -> None:
        if self.ns:
            self._spin(self._token, ns=self.ns)


class _CallTimer:
    """Each timed call's duration: CUDA events around it on the current stream (read once, after the last segment),
    on CPU the host clock (the work is synchronous there)."""

    def __init__(self, device: torch.device, calls: int):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                            for _ in range(calls)]
        else:
            self._host = torch.zeros(calls, 2, dtype=torch.float64)

    def start(self, call: int) -> None:
        if self.cuda:
            self._events[call][0].record()
        else:
            self._host[call, 0] = time.perf_counter()

    def stop(self, call: int) -> None:
        if self.cuda:
            self._events[call][1].record()
        else:
            self._host[call, 1] = time.perf_counter()

    def milliseconds(self) -> torch.Tensor:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.tensor([a.elapsed_time(b) for a, b in self._events], dtype=torch.float32)
        return ((self._host[:, 1] - self._host[:, 0]) * 1e3).float()


def bench(args: argparse.Namespace, fn, device: torch.device, dtype: torch.dtype, out: Path,
          watch: Callable[[str], None] = lambda stage: None) -> None:
    for i, case in enumerate(draw_cases(args.op, args.seed, args.cases, scale=args.case_scale)):
        inputs = make_inputs(case, dtype=dtype, device=device)
        results = _run(fn, case, inputs)
        write_tensors(out / f"case-{i}.tensors", results)
        _say(f"case={i} {case.label()}")
    case = timing_case(args.op, _shape(args.shape), args.seed)
    inputs = make_inputs(case, dtype=dtype, device=device)
    g = torch.Generator(device=device)
    flush = torch.empty(_FLUSH_BYTES // 4, dtype=torch.float32, device=device) if device.type == "cuda" else None
    first = _run(fn, case, inputs)
    dummies = {k: torch.zeros_like(v) for k, v in first.items()}  # what the overhead segments checksum
    checks = _Checksums(case, {k: v.shape for k, v in first.items()}, device, args.seed, rows=args.reps * args.segments)
    discard = torch.zeros(1, len(checks.names), checks.K + 1, device=device)
    del first
    pace = _Pace(device, args.pace_us)
    timer = _CallTimer(device, args.reps * args.segments)

    def segment(kind: str, index: int) -> None:
        watch(f"before {kind} segment {index}")
        _sync(device)
        _say(f"segment={kind} index={index} reps={args.reps} start")
        for rep in range(args.reps):
            call = index * args.reps + rep
            _fresh(case, inputs, g, args.seed, call)
            if flush is not None:
                flush.zero_()
            pace()
            if kind == "op":
                timer.start(call)
                results = _run(fn, case, inputs)
                timer.stop(call)
                checks.record(call, results)
                del results
            else:
                checks.record(0, dummies, into=discard, draw_row=call)
        _sync(device)
        _say(f"segment={kind} index={index} end")
        watch(f"after {kind} segment {index}")

    for rep in range(args.warmup):
        _fresh(case, inputs, g, args.seed, 10**6 + rep)
        _run(fn, case, inputs)
    for index in range(args.segments):
        segment("overhead", index)
        segment("op", index)
    write_tensors(out / "checks.tensors", {"rows": checks.rows})
    write_tensors(out / "times.tensors", {"op_ms": timer.milliseconds()})
    _say("done")


def _load_thread(device: torch.device, stop: threading.Event, count: list[int]) -> None:
    """Keep the device busy: GEMMs, large copies and allocation churn, on a stream of its own."""
    n = 4096 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    big = torch.empty(2**28 if device.type == "cuda" else 2**20, dtype=torch.float32, device=device)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    while not stop.is_set():
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for _ in range(4):
                a = torch.tanh(a @ a) * 0.5
            big.copy_(torch.flip(big, dims=[0]))
            churn = [torch.empty(int(s), device=device) for s in torch.randint(1, 2**22, (8,))]
            del churn
        if stream is not None:
            stream.synchronize()
        count[0] += 1


def stress(args: argparse.Namespace, fn, device: torch.device, dtype: torch.dtype, out: Path,
           watch: Callable[[str], None] = lambda stage: None) -> None:
    case = timing_case(args.op, _shape(args.shape), args.seed)
    pristine = make_inputs(case, dtype=dtype, device=device)
    inputs = {k: (v.detach().clone().requires_grad_(v.requires_grad)) for k, v in pristine.items()}
    quiet = _run(fn, case, inputs)
    shapes = {k: v.shape for k, v in quiet.items()}
    rows_cap = args.max_iterations + 1
    checks = _Checksums(case, shapes, device, args.seed, rows=rows_cap, moving=False)
    checks.record(0, quiet)
    _sync(device)
    iterations = 0
    if args.seconds > 0:
        stop, loads = threading.Event(), [0]
        loader = threading.Thread(target=_load_thread, args=(device, stop, loads), daemon=True)
        loader.start()
        producer = torch.cuda.Stream(device) if device.type == "cuda" else None
        deadline = time.monotonic() + args.seconds
        try:
            while time.monotonic() < deadline and iterations < args.max_iterations:
                if producer is not None:
                    # The inputs are rewritten on another stream; the op's stream must wait for that event.
                    with torch.cuda.stream(producer), torch.no_grad():
                        for k, v in pristine.items():
                            inputs[k].copy_(v)
                        ready = torch.cuda.Event()
                        ready.record(producer)
                    torch.cuda.current_stream(device).wait_event(ready)
                else:  # an accumulator input (`main_grad`) changes in every call: each starts from the same one
                    with torch.no_grad():
                        for k, v in pristine.items():
                            inputs[k].copy_(v)
                checks.record(iterations + 1, _run(fn, case, inputs))
                # One iteration in flight: the host never queues work far ahead of the GPU.
                _sync(device)
                iterations += 1
            _sync(device)
        finally:
            stop.set()
            loader.join(timeout=60)
        _say(f"iterations={iterations} load_rounds={loads[0]}")
    watch("after the loaded iterations")
    write_tensors(out / "checks.tensors", {"rows": checks.rows[: iterations + 1]})
    _say("done")


# What the measurement stands on: this module, the modules it draws cases and writes files with, the torch
# callables that order, time and checksum the work, and the process's output. The op runs in this process, so a
# version could rebind any of them (a no-op synchronize would end a timed segment before the GPU does, a stdout
# filter could drop the bench's lines); the bench refuses to hand in results when one of them is not the object
# it was before the version was imported, or a function of them runs other code (`__code__` swapped).
_GUARDED_MODULES = ("harness.judge.opcases", "harness.judge.tensorfile")
_GUARDED_TORCH = (
    (torch, ("dot", "mm", "randn", "randint", "rand", "zeros", "zeros_like", "empty", "manual_seed", "Generator")),
    (torch.linalg, ("vector_norm",)), (torch.autograd, ("backward",)),
    (torch.cuda, ("synchronize", "Event", "Stream", "stream", "current_stream", "set_device")),
    (torch.cuda.Event, ("record", "elapsed_time", "synchronize", "query")), (time, ("perf_counter",)),
    (torch.cuda.jiterator, ("_create_jit_fn",)),
    (torch.Tensor, ("copy_", "zero_", "float", "reshape", "detach", "__setitem__", "__mul__", "sum", "to")),
    (sys, ("stdout", "stderr")),
)
# Below those callables, the dispatcher: a kernel registered over an aten op's (torch.library, any dispatch key)
# changes what the same callable computes, say a zero_ that skips the L2 flush or a norm that returns what the
# reference's would. The ops the bench draws, flushes, checksums and copies with keep the kernels they had.
_GUARDED_ATEN = ("mm", "linalg_vector_norm", "sum", "mul", "add", "copy_", "zero_", "fill_", "detach", "view", "reshape",
                 "_reshape_alias", "_to_copy", "normal_", "random_", "uniform_", "randn", "randint", "rand", "empty",
                 "empty_like", "zeros", "zeros_like", "t", "transpose", "select", "slice", "as_strided", "index_put_",
                 "lt", "clone", "expand")


# torch rebinds some of its own callables when a lazily imported part of it first loads: torch._dynamo wraps
# torch.manual_seed (torch/_dynamo/__init__.py). A version that uses torch.compile, or a library that imports
# dynamo (flash-attn-4, quack), would look like a version that rebinds the bench's tools: these parts are
# loaded before the snapshot is taken.
_TORCH_SELF_PATCHING = ("torch._dynamo",)


def _load_self_patching_torch() -> None:
    for name in _TORCH_SELF_PATCHING:
        importlib.import_module(name)


def _held(value: object) -> tuple[object, ...]:
    """What must stay the same of a guarded value: the object, and for a function the code it runs."""
    if isinstance(value, types.FunctionType):
        return (value, value.__code__, value.__defaults__, value.__kwdefaults__)
    return (value,)


def _snapshot() -> dict[tuple[str, ...], tuple[object, ...]]:
    import builtins

    snap: dict[tuple[str, ...], tuple[object, ...]] = {("builtins", "print"): _held(builtins.print),
                                                      ("os", "write"): _held(os.write), ("os", "fstat"): _held(os.fstat)}
    for module in (sys.modules[__name__], *(sys.modules[m] for m in _GUARDED_MODULES)):
        for name, value in vars(module).items():
            snap[(module.__name__, name)] = _held(value)
            if isinstance(value, type) and value.__module__ == module.__name__:
                snap.update({(module.__name__, name, attr): _held(v) for attr, v in vars(value).items()})
    for owner, names in _GUARDED_TORCH:
        snap.update({(getattr(owner, "__name__", str(owner)), name): _held(getattr(owner, name)) for name in names})
    # guard: allow public-surface -- the dispatcher's kernel table has no public reader
    snap.update({("dispatcher", op): (torch._C._dispatch_dump(op),) for op in _aten_overloads()})
    return snap


def _aten_overloads() -> list[str]:
    """Every overload of the aten ops in _GUARDED_ATEN, as the dispatcher names them."""
    return [f"aten::{name}" + ("" if overload == "default" else f".{overload}")
            for name in _GUARDED_ATEN for overload in getattr(torch.ops.aten, name).overloads()]


def _rebound(before: dict[tuple[str, ...], tuple[object, ...]]) -> list[str]:
    """Names of `before` that no longer hold the same object (or run the same code, or, for an aten op, the same
    kernels: its dispatcher table is text, compared by value)."""
    now = _snapshot()
    same = lambda key, a, b: a == b if key[0] == "dispatcher" else a is b  # noqa: E731
    return sorted(".".join(key) for key, held in before.items()
                  if len(now.get(key, ())) != len(held) or not all(same(key, a, b) for a, b in zip(now[key], held)))


def _shape(text: str) -> dict[str, int]:
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    return {k.strip(): int(v) for k, v in pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.opbench", description=__doc__.splitlines()[0])
    p.add_argument("task", choices=("bench", "stress"))
    p.add_argument("--op", required=True, choices=OPS)
    p.add_argument("--version", default="default", help="a version in the op's register.toml; default: its default")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--shape", required=True, help="the timed shape, e.g. tokens=8192,hidden=4096,ffn=8192")
    p.add_argument("--cases", type=int, default=6)
    p.add_argument("--case-scale", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--pace-us", type=float, default=0.0, help="microseconds of the judge's GPU spin before every timed "
                   "call (0: none)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-iterations", type=int, default=100_000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    _load_self_patching_torch()
    torch.manual_seed(args.seed)
    _open_channel()
    before = _snapshot()

    def watch(stage: str) -> None:
        rebound = _rebound(before)
        if rebound:
            raise _Tampered(f"the op version rebound what the bench measures with ({stage}): {', '.join(rebound[:10])}")

    args.out.mkdir(parents=True, exist_ok=True)
    try:
        version, fn = _load(args.op, args.version, device)
        watch("import")
        _say(f"task={args.task} op={args.op} version={version} "
             f"device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
        (bench if args.task == "bench" else stress)(args, fn, device, DTYPES[args.dtype], args.out, watch)
        watch("run")
    except _Tampered as err:
        for path in args.out.glob("*.tensors"):
            path.unlink()
        os.write(2, f"[BENCH] refused: {err}\n".encode())
        return 3
    return 0

if __name__ == "__main__":
    sys.exit(main())
