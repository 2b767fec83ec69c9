"""What the judge's op bench measures, with and without its pace: the judge's clock against the op's host and
GPU time, one GPU, in one job.

    python -m bench.opbench_pace --op rmsnorm --shape tokens=8192,hidden=4096 --versions baseline cute \
        --pace-ms 0 4 --json $OUT/opbench_pace.json

For each version and pace it runs harness/opbench.py as the judge does (a process of its own, its `[BENCH]` lines
timed on arrival by the judge's own line log and read by harness/judge/opjudge.segment_times, so the numbers are
the judge's), then, in this process, the op alone at the same shape on fresh inputs:
- host ms: the Python time of one forward + backward while the GPU is kept busy (nothing waits for it);
- GPU ms: CUDA events around one call that starts after a spin, so the host is ahead and the events time the
  kernels only.
The judge's per-call time should equal the GPU time once the pace exceeds the host's launch time per call; with
no pace it is whichever of the host (the bench's ~1 ms of launches plus the version's) and the GPU is slower.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness.jobs import JobSpec, launch
from harness.judge.opcases import call_op, grad_names, make_inputs, redraw, timing_case
from harness.judge.opjudge import OpRun, segment_times

__all__ = ["main"]


def _shape(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (p.split("=", 1) for p in text.split(","))}


def judged_ms(op: str, version: str, shape: str, pace_ms: float, reps: int, segments: int, work: Path,
              device: str = "cuda") -> dict:
    """The judge's overhead and op time per call (ms) of one opbench process."""
    out = work / f"{version}-{pace_ms:g}"
    log = work / f"{version}-{pace_ms:g}.log"
    argv = [sys.executable, "-m", "harness.opbench", "bench", "--op", op, "--version", version, "--device", device, "--seed", "1",
            "--shape", shape, "--cases", "1", "--reps", str(reps), "--segments", str(segments),
            "--pace-us", f"{pace_ms * 1e3:g}", "--out", str(out)]
    result = launch(JobSpec(name=out.name, argv=argv, log_path=log, timeout_s=900)).wait(poll_s=0.2)
    if result.exit_code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {result.exit_code}:\n{log.read_text()[-3000:]}")
    run = OpRun(role="candidate", round=1, out_dir=out, log_path=log, line_times_path=result.line_times_path)
    timing, problems = segment_times(run, segments=segments, reps=reps)
    if timing is None:
        raise SystemExit("; ".join(problems))
    return {"overhead_ms": timing.overhead_s / timing.calls * 1e3, "op_ms": timing.op_s() * 1e3}


def direct_ms(op: str, version: str, shape: dict[str, int], calls: int) -> dict:
    """(host ms, GPU ms) per forward + backward of the version alone, on fresh inputs."""
    from engine.ops.dispatch import load_op, resolve_version

    fn = load_op(op, resolve_version(op, "", "cuda") if version == "default" else version)
    case = timing_case(op, shape, 1)
    inputs = make_inputs(case, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator(device="cuda")

    def run(i: int) -> None:
        g.manual_seed(i)
        redraw(case, inputs, g)
        for name in grad_names(case):
            inputs[name].grad = None
        outs = call_op(fn, case, inputs)
        torch.autograd.backward(outs, [inputs[f"dout.{j}"] for j in range(len(outs))])

    for i in range(3):
        run(i)
    torch.cuda.synchronize()
    # host: the GPU spins long enough that no call below waits for it
    torch.cuda._sleep(100_000_000)
    busy = torch.cuda.Event()
    busy.record()
    host = []
    for i in range(calls):
        t0 = time.perf_counter()
        run(100 + i)
        host.append(time.perf_counter() - t0)
    ahead = not busy.query()  # the spin still running after the last launch: the host never waited
    torch.cuda.synchronize()
    # GPU: events around each call, launched behind a spin
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for i in range(calls):
        g.manual_seed(1000 + i)
        redraw(case, inputs, g)
        torch.cuda._sleep(10_000_000)
        start.record()
        for name in grad_names(case):
            inputs[name].grad = None
        outs = call_op(fn, case, inputs)
        torch.autograd.backward(outs, [inputs[f"dout.{j}"] for j in range(len(outs))])
        stop.record()
        stop.synchronize()
        gpu.append(start.elapsed_time(stop))
    return {"host_ms": statistics.median(host) * 1e3, "host_ahead": ahead, "gpu_ms": statistics.median(gpu)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="rmsnorm")
    p.add_argument("--shape", default="tokens=8192,hidden=4096")
    p.add_argument("--versions", nargs="+", default=["baseline", "default"])
    p.add_argument("--pace-ms", nargs="+", type=float, default=[0.0, 4.0])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--segments", type=int, default=3)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for version in args.versions:
            direct = direct_ms(args.op, version, _shape(args.shape), args.calls)
            for pace in args.pace_ms:
                judged = judged_ms(args.op, version, args.shape, pace, args.reps, args.segments, Path(tmp))
                rows.append({"version": version, "pace_ms": pace, **judged, **direct})
                print(rows[-1], flush=True)
    gpu = torch.cuda.get_device_name()
    print(f"\n{args.op} at {args.shape}, fwd + bwd, {gpu}, torch {torch.__version__}")
    print("| version | pace ms | judge: overhead ms / call | judge: op ms / call | op host ms | op GPU ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['version']} | {r['pace_ms']:g} | {r['overhead_ms']:.3f} | {r['op_ms']:.3f} | {r['host_ms']:.3f}"
              f"{'' if r['host_ahead'] else ' (GPU caught up)'} | {r['gpu_ms']:.3f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "op": args.op, "shape": args.shape,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
