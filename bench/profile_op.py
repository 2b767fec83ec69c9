"""Where one op version spends its time: CUDA kernels of one forward + backward, from torch.profiler.

    python bench/profile_op.py --op gemm_output --version quack --preset minicpm4-8b --tp 1

Runs the op as bench/ops.py does (one rank's shapes, engine/ops/workloads.py), warms up, then
profiles --iters calls of forward + backward and prints each CUDA kernel's total and per-call
time, sorted, with the share of the GPU time it takes. Use it to find what a fused version still
spends outside its GEMMs before tuning it.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import build_config  # noqa: E402
from engine.ops.dispatch import load_op  # noqa: E402
from engine.ops.workloads import call_op, grad_leaves, make_inputs, op_shapes, rank_callable  # noqa: E402

__all__ = ["main"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--preset", default="minicpm4-8b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)

    cfg = build_config({"preset": args.preset})
    shapes = op_shapes(cfg, tp=args.tp)
    fn = rank_callable(args.op, load_op(args.op, args.version), shapes)
    inputs = make_inputs(args.op, shapes, device="cuda", dtype=torch.bfloat16, seed=0)

    def step():
        for t in grad_leaves(inputs).values():
            t.grad = None
        outs = call_op(args.op, fn, inputs, shapes)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in events)
    print(f"{args.op} / {args.version}, {args.preset} TP {args.tp}: {total / 1e3 / args.iters:.3f} ms of kernels "
          f"per forward + backward ({torch.cuda.get_device_name()})")
    print("| kernel | calls / step | ms / step | share |\n| --- | ---: | ---: | ---: |")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[: args.top]:
        print(f"| {e.key[:90]} | {e.count / args.iters:g} | {e.self_device_time_total / 1e3 / args.iters:.3f} "
              f"| {e.self_device_time_total / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
