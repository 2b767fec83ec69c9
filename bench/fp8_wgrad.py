"""The FP8 weight gradient's add at the 8B slice's shapes, on one GPU: out += (qa / sa) @ (qb / sb)^T with the fp32
product written whole, then added (engine/distributed/fp8.py scaled_wgrad_add, the fp8_wgrad baseline), against
cuBLASLt adding in its epilogue (the fp8_wgrad cublaslt version) and the baseline in row chunks whose product fits in
the L2 (a reused scratch: the add may read it before it reaches HBM).

    python bench/fp8_wgrad.py --out fp8_wgrad.json

Rows: the baseline, cuBLAS's product alone (what the add costs beside it), cuBLASLt's epilogue add, and chunks of at
most C MB of product. same bits: whether the result equals the baseline's bit for bit (cuBLAS may pick another
kernel for fewer rows; the epilogue rounds once where the baseline rounds twice); max err: its largest difference
from the baseline over the product's largest magnitude. Table last (ms summed over one micro-batch's four linears of one layer), JSON to --out.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms  # noqa: E402
from engine.distributed.fp8 import E4M3, E5M2, cast, scaled_wgrad_add  # noqa: E402
from engine.ops.fp8_wgrad.cublaslt import wgrad_add as cublaslt_add  # noqa: E402

# (m, n, k): the slice's linears' weight gradients over one micro-batch's 8192 tokens: QKV, O, FC1 [gate; up], FC2
SHAPES = ((4608, 4096, 8192), (4096, 4096, 8192), (32768, 4096, 8192), (4096, 16384, 8192))
CHUNK_MB = (4, 8, 16, 32)


def chunked_add(out, qa, sa, qb, sb, scratch: torch.Tensor, rows: int) -> None:
    """out += product, `rows` rows of it at a time through scratch."""
    ia, ib = sa.reciprocal(), sb.reciprocal()
    for i in range(0, out.shape[0], rows):
        j = min(i + rows, out.shape[0])
        part = scratch[: (j - i) * out.shape[1]].view(j - i, out.shape[1])
        torch._scaled_mm(qa[i:j], qb.t(), scale_a=ia, scale_b=ib, out_dtype=torch.float32, out=part)
        out[i:j].add_(part)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    scratch = torch.empty(max(CHUNK_MB) * 2 ** 20 // 4, device="cuda")
    rows = []
    for m, n, k in SHAPES:
        sets = []
        for seed in range(2):  # two of everything a call alternates between: each out is larger than the L2
            g = torch.Generator(device="cuda").manual_seed(seed)
            dy = torch.randn(k, m, device="cuda", generator=g, dtype=torch.bfloat16) * 1e-3
            x = torch.randn(k, n, device="cuda", generator=g, dtype=torch.bfloat16)
            qa, sa = cast(dy.t().contiguous(), E5M2, None, False)
            qb, sb = cast(x.t().contiguous(), E4M3, None, False)
            sets.append((torch.randn(m, n, device="cuda", generator=g) * 0.05, qa, sa, qb, sb))
        versions = {"baseline": lambda s: scaled_wgrad_add(*s),
                    "cublas product": lambda s: torch._scaled_mm(s[1], s[3].t(), scale_a=s[2].reciprocal(),
                                                                 scale_b=s[4].reciprocal(), out_dtype=torch.float32),
                    "cublaslt": lambda s: cublaslt_add(*s)}
        for mb in CHUNK_MB:
            r = max(128, (mb * 2 ** 20 // 4 // n) // 128 * 128)
            versions[f"chunks {mb} MB"] = lambda s, r=r: chunked_add(*s, scratch, r)
        start = sets[0][0].clone()  # the timed calls add into sets' accumulators: compare from a copy taken before
        ref = start.clone()
        scaled_wgrad_add(ref, *sets[0][1:])
        row = {"shape": [m, n, k], "ms": {}, "same_bits": {}, "max_err": {}}
        product = (ref - start).abs().max().item()
        for name, fn in versions.items():
            if name.startswith("chunks") or name == "cublaslt":
                out = start.clone()
                fn((out, *sets[0][1:]))
                row["same_bits"][name] = torch.equal(out, ref)
                row["max_err"][name] = (out - ref).abs().max().item() / product
            row["ms"][name] = median_call_ms(fn, sets, args.iters)
        rows.append(row)
        print(f"{m} x {n} x {k}: " + ", ".join(f"{v} {t:.3f} ms" for v, t in row["ms"].items()), flush=True)
        del sets

    names = list(rows[0]["ms"])
    total = {v: sum(r["ms"][v] for r in rows) for v in names}
    print(f"\nFP8 weight gradient added into fp32, one micro-batch's four linears of a layer of the 8B slice ({gpu}), "
          f"median device ms a call over {args.iters} calls")
    print("| version | " + " | ".join(f"{m}x{n}" for m, n, _ in SHAPES) + " | all ms | x baseline | same bits | max err |")
    print("| --- | " + " | ".join("---:" for _ in SHAPES) + " | ---: | ---: | --- | ---: |")
    for v in names:
        same = "-" if v not in rows[0]["same_bits"] else ("yes" if all(r["same_bits"][v] for r in rows) else "no")
        err = f"{max(r['max_err'][v] for r in rows):.1e}" if v in rows[0]["max_err"] else "-"
        print(f"| {v} | " + " | ".join(f"{r['ms'][v]:.3f}" for r in rows) + f" | {total[v]:.3f} | "
              f"{total['baseline'] / total[v]:.3f} | {same} | {err} |")
    if args.out:
        args.out.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "iters": args.iters, "rows": rows},
                                       indent=1))


if __name__ == "__main__":
    main()
