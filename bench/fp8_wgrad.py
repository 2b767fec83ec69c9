"""The fp8_wgrad op's versions at the 8B slice's weight-gradient shapes, on one GPU: device time of one FP8 weight
gradient added into its fp32 accumulator (out += (qa / sa) @ (qb / sb)^T), and its error against fp64.

    python bench/fp8_wgrad.py --out fp8_wgrad.json

Rows: the baseline (cuBLAS FP8 product written in fp32, then added), cuBLAS's product alone (what the add costs
beside it), and the triton version at its default launch shape and the sweep's (engine/ops/fp8_wgrad/triton_add.py
CONFIG: BM, BN, BK, GROUP_M, stages, warps, imprecise; imprecise = BK promotes the MMA's partial sums once a k-tile,
0 is fast accumulation). err: ||out - exact|| / ||product|| with exact = out + product in fp64 of the FP8 values.
Table last (ms summed over one micro-batch's four linears), JSON to --out.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms  # noqa: E402
from engine.distributed.fp8 import E4M3, E5M2, cast, scaled_wgrad_add  # noqa: E402

# (m, n, k): the slice's linears' weight gradients over one micro-batch's 8192 tokens: QKV, O, FC1 [gate; up], FC2
SHAPES = ((4608, 4096, 8192), (4096, 4096, 8192), (32768, 4096, 8192), (4096, 16384, 8192))
FAST = 0  # triton_add: the MMA's own accumulation over all of k (fast accumulation)
SWEEP = ((128, 256, 128, 8, 4, 8, 128), (128, 256, 128, 8, 3, 8, FAST), (128, 256, 128, 8, 4, 8, FAST),
         (256, 128, 128, 8, 3, 8, 128), (128, 128, 128, 8, 4, 8, 128), (128, 128, 128, 8, 5, 4, 128),
         (128, 256, 64, 8, 5, 8, 64), (128, 256, 128, 16, 3, 8, 128), (128, 256, 128, 4, 3, 8, 128),
         (128, 128, 128, 8, 4, 8, FAST), (256, 128, 128, 8, 3, 8, FAST))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-sweep", action="store_true", help="the versions at their defaults only")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from engine.ops.fp8_wgrad import triton_add

    gpu = torch.cuda.get_device_name()
    configs = [triton_add.CONFIG] + ([] if args.no_sweep else [c for c in SWEEP if c != triton_add.CONFIG])
    rows, failed = [], {}
    for m, n, k in SHAPES:
        sets = []
        for seed in range(2):  # two of everything a call alternates between: each out is larger than the L2
            g = torch.Generator(device="cuda").manual_seed(seed)
            dy = torch.randn(k, m, device="cuda", generator=g, dtype=torch.bfloat16) * 1e-3
            x = torch.randn(k, n, device="cuda", generator=g, dtype=torch.bfloat16)
            qa, sa = cast(dy.t().contiguous(), E5M2, None, False)
            qb, sb = cast(x.t().contiguous(), E4M3, None, False)
            sets.append((torch.randn(m, n, device="cuda", generator=g) * 0.05, qa, sa, qb, sb))
        out0, qa, sa, qb, sb = sets[0]
        product = (qa.double() / sa.double()) @ (qb.double() / sb.double()).t()
        versions = {"baseline": lambda s: scaled_wgrad_add(*s),
                    "cublas product": lambda s: torch._scaled_mm(s[1], s[3].t(), scale_a=s[2].reciprocal(),
                                                                 scale_b=s[4].reciprocal(), out_dtype=torch.float32)}
        for c in configs:
            versions[f"triton {c}"] = lambda s, c=c: triton_add.launch(s[0], s[1], s[3], (s[2].reciprocal() *
                                                                                        s[4].reciprocal()).reshape(1), c)
        row = {"shape": [m, n, k], "ms": {}, "err": {}}
        for name, fn in versions.items():
            try:
                if name != "cublas product":
                    out = out0.clone()
                    fn((out, qa, sa, qb, sb))
                    row["err"][name] = ((out.double() - out0.double() - product).norm() / product.norm()).item()
                row["ms"][name] = median_call_ms(fn, sets, args.iters)
            except Exception as e:  # a launch shape this GPU cannot run (shared memory, registers): reported, skipped
                failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
        print(f"{m} x {n} x {k}: " + ", ".join(f"{v} {t:.3f} ms" for v, t in row["ms"].items()), flush=True)
        del sets, product

    names = [v for v in rows[0]["ms"] if all(v in r["ms"] for r in rows)]
    total = {v: sum(r["ms"][v] for r in rows) for v in names}
    flops = sum(2 * m * n * k for m, n, k in SHAPES)
    print(f"\nfp8_wgrad, one micro-batch's four weight gradients of the 8B slice ({gpu}), median device ms a call over "
          f"{args.iters} calls; err: ||out - exact|| / ||product|| (largest over the shapes)")
    print("| version | " + " | ".join(f"{m}x{n}" for m, n, _ in SHAPES) + " | all ms | TFLOP/s | x baseline | err |")
    print("| --- | " + " | ".join("---:" for _ in SHAPES) + " | ---: | ---: | ---: | ---: |")
    for v in names:
        err = max((r["err"].get(v, 0.0) for r in rows), default=0.0)
        print(f"| {v} | " + " | ".join(f"{r['ms'][v]:.3f}" for r in rows) + f" | {total[v]:.3f} | "
              f"{flops / total[v] / 1e9:.0f} | {total['baseline'] / total[v]:.3f} | {err:.1e} |")
    for name, why in failed.items():
        print(f"not run: {name}: {why}")
    if args.out:
        args.out.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "triton": triton_version(),
                                        "iters": args.iters, "rows": rows, "failed": failed}, indent=1))


def triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    main()
