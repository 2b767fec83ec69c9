"""The judge's op bench and stress job: `python -m harness.opbench {bench,stress} --op OP ...`.

The judge runs this inside the sandbox, once in a checkout of the base commit (role `reference`: the
base's `baseline` version) and once in the judged checkout (role `candidate`: the version a milestone
judges), alternately. It loads the op version through the engine's own registry and writes what it
computes to its folder; the judge decides (harness/judge/opjudge.py). This process never reports a
time or a verdict: the judge times it by the arrival of its `[BENCH]` lines on the judge's pipe.

bench
  1. correctness: the cases harness/judge/opcases.py draws from the judge's seed (fresh shapes every
     judging): outputs and gradients to `case-<i>.tensors`; the judge recomputes them in fp32.
  2. timing at the milestone's shape: segments of `reps` forward + backward calls, each on fresh inputs
     (drawn on the device from the seed and the rep number, so nothing can be served from a cache), after
     an L2 flush, all on the current stream. Overhead segments do the same minus the op, so the judge can
     subtract input generation, flushing and the checksums. Each call leaves a checksum row (a random
     projection and the norm of a strided sample of every output and gradient, the sample's start moving
     with the call) in `checks.tensors`, which the judge holds against the reference process's rows: a
     skipped or cached call cannot match.
stress
  The op at the milestone's shape while another thread keeps the GPU busy with GEMMs, 1 GiB copies and
  allocation churn on a stream of its own, its inputs rewritten before every call on a producer stream
  (the op's stream waits on that event: a kernel that ignores the current stream reads half-written
  inputs), for `--seconds`. Every iteration's checksum row goes to `checks.tensors` beside the unloaded one; the
  judge requires them to agree. On CPU, the load is a thread of matmuls.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import threading
import time
from pathlib import Path

import torch

from harness.judge.opcases import DTYPES, OPS, call_op, draw_cases, grad_names, make_inputs, result_names, timing_case
from harness.judge.tensorfile import write_tensors

__all__ = ["main"]

_FLUSH_BYTES = 256 * 2**20  # larger than any Hopper L2 (50 MiB)


def _say(text: str) -> None:
    print(f"[BENCH] {text}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load(op: str, version: str, device: torch.device):
    from engine.ops.dispatch import load_op, resolve_version

    name = resolve_version(op, "", device.type) if version == "default" else version
    return name, load_op(op, name)


def _results(case, inputs: dict[str, torch.Tensor], outs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Outputs and gradients by name. An input autograd left without a gradient has gradient zero (what
    None means), recorded as zeros so the judge compares it like any other result."""
    expected = len([n for n in result_names(case) if n.startswith("out.")])
    if len(outs) != expected:
        raise RuntimeError(f"{case.label()}: the version returned {len(outs)} output(s), the contract {expected}")
    got = {f"out.{i}": o for i, o in enumerate(outs)}
    for name in grad_names(case):
        grad = inputs[name].grad
        got[f"grad.{name}"] = torch.zeros_like(inputs[name]) if grad is None else grad
    return got


def _run(fn, case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Forward, then backward with the case's upstream gradients; every output and gradient by name."""
    for name in grad_names(case):
        inputs[name].grad = None
    outs = call_op(fn, case, inputs)
    torch.autograd.backward(outs, [inputs[f"dout.{i}"].to(o.dtype) for i, o in enumerate(outs)])
    return _results(case, inputs, outs)


class _Checksums:
    """One row per call: for each result, the dot product of a strided sample of it with a fixed random vector,
    and the sample's norm (fp32). The sample's start moves with the call (drawn from the seed, the same in both
    processes), so every call is checked at other places; sampling keeps the checksum a small fraction of even
    a bandwidth-bound op's time, so the overhead the judge subtracts stays small and symmetric."""

    STRIDE = 61  # prime: the sample does not line up with rows of power-of-two widths

    def __init__(self, case, shapes: dict[str, torch.Size], device: torch.device, seed: int, rows: int,
                 moving: bool = True):
        g = torch.Generator(device=device).manual_seed(seed ^ 0x5EED)
        self.names = result_names(case)
        self.seed, self.moving = seed, moving  # stress: one sample for every call (they must all agree)
        self.stride = {n: self.STRIDE if shapes[n].numel() >= 64 * self.STRIDE else 1 for n in self.names}
        self.length = {n: shapes[n].numel() // self.stride[n] for n in self.names}
        self.proj = {n: torch.randn(self.length[n], generator=g, device=device) for n in self.names}
        self.rows = torch.zeros(rows, len(self.names), 2, device=device)

    def record(self, row: int, results: dict[str, torch.Tensor], *, into: torch.Tensor | None = None) -> None:
        """Row `row` of `into` (default: the rows kept for the judge) from `results`, on the device."""
        rows = self.rows if into is None else into
        with torch.no_grad():  # outputs carry autograd history: a row written from them would keep every graph
            for j, name in enumerate(self.names):
                stride, length = self.stride[name], self.length[name]
                start = (self.seed + (7919 * row if self.moving else 0)) % stride
                sample = results[name].detach().reshape(-1)[start: start + length * stride: stride].float()
                rows[row, j, 0] = torch.dot(sample, self.proj[name])
                rows[row, j, 1] = torch.linalg.vector_norm(sample)


def _fresh(case, inputs: dict[str, torch.Tensor], g: torch.Generator, seed: int, rep: int) -> None:
    """Redraw the activations (never the weights) in place, from (seed, rep): every call sees new data."""
    g.manual_seed(seed * 1_000_003 + rep)
    with torch.no_grad():
        for name in {"attention": ("q", "k", "v"), "rmsnorm": ("x", "residual"), "gemm_fc1": ("x",),
                     "gemm_output": ("h",)}[case.op]:
            if name in inputs:
                t = inputs[name]
                t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32))


def bench(args: argparse.Namespace, fn, device: torch.device, dtype: torch.dtype, out: Path) -> None:
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
    discard = torch.zeros(1, len(checks.names), 2, device=device)
    del first

    def segment(kind: str, index: int) -> None:
        _sync(device)
        _say(f"segment={kind} index={index} reps={args.reps} start")
        for rep in range(args.reps):
            _fresh(case, inputs, g, args.seed, index * args.reps + rep)
            if flush is not None:
                flush.zero_()
            if kind == "op":
                checks.record(index * args.reps + rep, _run(fn, case, inputs))
            else:
                checks.record(0, dummies, into=discard)
        _sync(device)
        _say(f"segment={kind} index={index} end")

    for rep in range(args.warmup):
        _fresh(case, inputs, g, args.seed, 10**6 + rep)
        _run(fn, case, inputs)
    for index in range(args.segments):
        segment("overhead", index)
        segment("op", index)
    write_tensors(out / "checks.tensors", {"rows": checks.rows})
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


def stress(args: argparse.Namespace, fn, device: torch.device, dtype: torch.dtype, out: Path) -> None:
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
                checks.record(iterations + 1, _run(fn, case, inputs))
                # One iteration in flight: the host never queues work far ahead of the GPU.
                _sync(device)
                iterations += 1
            _sync(device)
        finally:
            stop.set()
            loader.join(timeout=60)
        _say(f"iterations={iterations} load_rounds={loads[0]}")
    write_tensors(out / "checks.tensors", {"rows": checks.rows[: iterations + 1]})
    _say("done")


# What the measurement stands on: this module, the modules it draws cases and writes files with, and the torch
# callables that order, time and checksum the work. The op runs in this process, so a version could rebind any
# of them (a no-op synchronize would end a timed segment before the GPU does); main() refuses to hand in
# results when one of them is not the object it was before the version was imported.
_GUARDED_MODULES = ("harness.judge.opcases", "harness.judge.tensorfile")
_GUARDED_TORCH = (
    (torch, ("dot", "randn", "zeros", "zeros_like", "empty", "manual_seed", "Generator")),
    (torch.linalg, ("vector_norm",)), (torch.autograd, ("backward",)),
    (torch.cuda, ("synchronize", "Event", "Stream", "stream", "current_stream", "set_device")),
    (torch.Tensor, ("copy_", "zero_", "float", "reshape", "detach", "__setitem__")),
)


# torch rebinds some of its own callables when a lazily imported part of it first loads: torch._dynamo wraps
# torch.manual_seed (torch/_dynamo/__init__.py). A version that uses torch.compile, or a library that imports
# dynamo (flash-attn-4, quack), would look like a version that rebinds the bench's tools: these parts are
# loaded before the snapshot is taken.
_TORCH_SELF_PATCHING = ("torch._dynamo",)


def _load_self_patching_torch() -> None:
    for name in _TORCH_SELF_PATCHING:
        importlib.import_module(name)


def _snapshot() -> dict[tuple[str, ...], object]:
    import builtins

    snap: dict[tuple[str, ...], object] = {("builtins", "print"): builtins.print}
    for module in (sys.modules[__name__], *(sys.modules[m] for m in _GUARDED_MODULES)):
        for name, value in vars(module).items():
            snap[(module.__name__, name)] = value
            if isinstance(value, type) and value.__module__ == module.__name__:
                snap.update({(module.__name__, name, attr): v for attr, v in vars(value).items()})
    for owner, names in _GUARDED_TORCH:
        snap.update({(getattr(owner, "__name__", str(owner)), name): getattr(owner, name) for name in names})
    return snap


def _rebound(before: dict[tuple[str, ...], object]) -> list[str]:
    """Names of `before` that no longer hold the same object."""
    now = _snapshot()
    return sorted(".".join(key) for key, value in before.items() if now.get(key) is not value)


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
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-iterations", type=int, default=100_000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    _load_self_patching_torch()
    torch.manual_seed(args.seed)
    before = _snapshot()
    version, fn = _load(args.op, args.version, device)
    _say(f"task={args.task} op={args.op} version={version} device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}")
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in ("import", "run"):
        rebound = _rebound(before)
        if rebound:
            for path in args.out.glob("*.tensors"):
                path.unlink()
            sys.stderr.write(f"[BENCH] refused: the op version rebound what the bench measures with ({stage}): "
                             f"{', '.join(rebound[:10])}\n")
            return 3
        if stage == "import":
            (bench if args.task == "bench" else stress)(args, fn, device, DTYPES[args.dtype], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
