"""Host time of the FP8 path's small calls: what the CPU spends issuing them, with tensors so small that the work
itself costs nothing (a 64 x 64 operand). Where a GPU step is short (TP 2 halves every GEMM) the host can fall behind.

    python bench/host_overhead.py --device cuda --out host_overhead.json

Rows (median microseconds a call over --iters calls, after warm-up, the rows interleaved in ten rounds):
- compiled call: one engine CompiledKernel call (engine/ops/inductor.py; the fp8 cast's tensorwise graph: amax, scale,
  write): the layout key, then inductor's compiled code called directly;
- compiled code alone: that compiled code with no wrapper (the floor);
- torch.compile call (before): the same function through torch.compile (dynamo: its frame hook, guards, wrappers),
  as CompiledKernel called it until the twelfth session (the A of the A/B);
- amax and scale: the eager amax_scale (engine/distributed/fp8.py);
- fp8 cast: the compiled cast version whole (amax, scale, the write of q and q^T);
- linear fwd+bwd, bf16 / fp8 tensorwise: one linear's forward and backward through engine/distributed/wgrad.py;
- mm bf16 / _scaled_mm tensorwise: one GEMM call each (cuBLAS; the FP8 one through cuBLASLt).
On CUDA also how many host-device syncs each linear makes (torch.cuda's sync debug mode). `--cprofile N`: then N FP8
linears (weight cached) under cProfile, the functions that take the host's time (own time, and cumulative).
Table last, JSON to --out. Timings on a shared or loaded machine move by tens of percent: compare rows of one run.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.distributed.fp8 import E4M3, Fp8Recipe, amax_scale, weight_copies_kept  # noqa: E402
from engine.distributed.wgrad import fused_linear  # noqa: E402
from engine.ops.fp8_cast.compiled import _COMPILED, cast  # noqa: E402
from engine.ops.inductor import layout  # noqa: E402


def cpu_name() -> str:
    """The host CPU's model (Linux), which these timings are of as much as of the GPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def median_us(rows: dict, iters: int, device: torch.device, rounds: int = 10) -> dict[str, float]:
    """Median host time a call in us of each row's fn, the rows interleaved in `rounds` rounds (so a drift of the
    machine's clock or load falls on every row alike); no device synchronisation inside a timed call: the host's
    own cost."""
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for fn in rows.values():
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for name, fn in rows.items():
            for _ in range(max(1, iters // rounds)):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the launch queue drained between blocks: no call waits on it
    return {name: 1e6 * statistics.median(times) for name, times in samples.items()}


def syncs(fn, device: torch.device) -> int | None:
    """How many times one call makes the host wait for the device (torch.cuda's sync debug mode warns at each): a
    call that syncs cannot be queued ahead of the GPU, however little host time it takes."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--out", default="", help="write the rows as JSON here")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="then N FP8 linears under cProfile")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    t = torch.randn(64, 64, device=device).bfloat16()
    w = (torch.randn(64, 64, device=device) * 0.05).bfloat16().requires_grad_()
    x = torch.randn(2, 32, 64, device=device).bfloat16().requires_grad_()
    dy = torch.randn(2, 32, 64, device=device).bfloat16()
    kernel = _COMPILED[E4M3, True]
    kernel(t)  # compiled before any timing
    code = kernel._compiled[layout((t,))]
    dynamo = torch.compile(kernel.fn, dynamic=False, fullgraph=True)
    dynamo(t)

    def linear(recipe: str, cached: bool = False):
        def run():
            with weight_copies_kept(cached):  # the weight cast once here, as a step's first micro-batch
                y = fused_linear(x, w, recipe)
                y.backward(dy)
                if cached:  # a later micro-batch: the weight's copies from the cache
                    y = fused_linear(x, w, recipe)
                    y.backward(dy)
        return run

    q8, one = t.to(E4M3), torch.ones((), device=device)
    rows = {
        "compiled call": lambda: kernel(t),
        "compiled code alone": lambda: code(t),
        "torch.compile call (before)": lambda: dynamo(t),
        "amax and scale": lambda: amax_scale(t, E4M3, None, False),
        "fp8 cast (compiled version)": lambda: cast(t, E4M3, None, False, transposed=True),
        "linear fwd+bwd, bf16": linear("off"),
        "linear fwd+bwd, fp8 tensorwise": linear(Fp8Recipe("tensorwise", cast)),
        "2 x linear fwd+bwd, fp8, weight cache": linear(Fp8Recipe("tensorwise", cast), cached=True),
        "mm bf16": lambda: torch.mm(t, t),
        "_scaled_mm tensorwise": lambda: torch._scaled_mm(q8, q8.t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16),
    }
    results = median_us(rows, args.iters, device)
    synced = {name: syncs(rows[name], device) for name in ("linear fwd+bwd, bf16", "linear fwd+bwd, fp8 tensorwise")}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"device": name, "cpu": cpu_name(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "iters": args.iters, "host_us": results, "host_syncs": synced}
    if args.out:
        Path(args.out).write_text(json.dumps(meta, indent=1))
    print(f"host time a call, {name} driven by {meta['cpu']} ({meta['cpus']} CPUs), torch {torch.__version__}, "
          f"median of {args.iters}")
    print(f"{'call':36} {'us':>9}")
    for key, us in results.items():
        print(f"{key:36} {us:9.1f}")
    print("host-device syncs a call (torch.cuda sync debug mode; None on CPU): " +
          ", ".join(f"{k} {v}" for k, v in synced.items()))
    if args.cprofile:
        cprofile(linear(Fp8Recipe("tensorwise", cast), cached=True), args.cprofile)
    return 0


def cprofile(fn, n: int) -> None:
    """Where the host's time goes in n calls of fn (cProfile: inflates small calls, so read shares, not totals)."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(28)
        print(f"--- cProfile of {n} x 2 FP8 linears (weight cache), by {key}")
        print("\n".join(line[:180] for line in out.getvalue().splitlines() if line.strip())[:9000])


if __name__ == "__main__":
    sys.exit(main())
