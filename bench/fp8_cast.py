"""The fp8_cast op's versions at the 8B's operand shapes, on one GPU: device time of a whole tensorwise cast with the
transpose's copy (amax, scale, q and q^T: what each FP8 linear asks for x and dy), each checked bit for bit against
the baseline. The triton version at its default launch shapes, then each of its two kernels' launch shapes swept
with the other held (engine/ops/fp8_cast/triton_cast.py: none changes a bit).

    python bench/fp8_cast.py --out fp8_cast.json

GB/s counts the bytes a cast must move at least: t read twice (amax, then the write: 2 x 2 bytes an element in bf16)
and q, q^T written (2 x 1 byte). Table last, JSON to --out.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms  # noqa: E402
from engine.distributed.fp8 import E4M3, cast  # noqa: E402

# x and dy of the slice's linears (8192 tokens; hidden 4096, QKV 4608, FC2's input 16384, FC1's output 32768) and
# the FC1 weight [32768, 4096]; each row-major and as a transposed view (a dgrad / wgrad operand)
SHAPES = ((8192, 4096), (8192, 4608), (8192, 16384), (8192, 32768), (32768, 4096))
AMAX_CONFIGS = ((4096, 8, 4), (8192, 8, 2), (2048, 4, 8), (8192, 16, 4), (4096, 4, 2), (16384, 16, 1))
CAST_CONFIGS = ((64, 128, 8), (64, 64, 4), (128, 128, 8), (128, 64, 4), (32, 128, 4), (64, 256, 8), (128, 256, 16))


def same(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x.view(torch.uint8) if x.dtype == E4M3 else x, y.view(torch.uint8) if y.dtype == E4M3 else y)
               for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-sweep", action="store_true", help="the versions at their defaults only")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from engine.ops.fp8_cast import compiled, triton_cast

    gpu = torch.cuda.get_device_name()
    rows, mismatches = [], []
    for shape in SHAPES:
        # two operands a call alternates between: each is larger than the L2, so no call reads the last one's bytes
        base = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(2)]
        for layout in ("row-major", "transposed"):
            sets = base if layout == "row-major" else [t.t() for t in base]
            ref = cast(sets[0], E4M3, None, False, transposed=True)
            row = {"shape": list(sets[0].shape), "layout": layout}
            versions = {"baseline": lambda t: cast(t, E4M3, None, False, transposed=True),
                        "compiled": lambda t: compiled.cast(t, E4M3, None, False, transposed=True),
                        "triton": lambda t: triton_cast.cast(t, E4M3, None, False, transposed=True)}
            if not args.no_sweep:
                for c in AMAX_CONFIGS:
                    versions[f"triton amax {c}"] = lambda t, c=c: triton_cast.tensorwise(t, E4M3, True, amax_config=c)
                for c in CAST_CONFIGS:
                    versions[f"triton tile {c}"] = lambda t, c=c: triton_cast.tensorwise(t, E4M3, True, cast_config=c)
            for name, fn in versions.items():
                if not same(fn(sets[0]), ref):
                    mismatches.append(f"{name} {shape} {layout}")
                row[name] = median_call_ms(fn, sets, args.iters)
            row["bytes"] = sets[0].numel() * 6
            rows.append(row)
            print(f"{tuple(row['shape'])} {layout}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()
                                                               if isinstance(v, float)), flush=True)

    best = {}
    for kind in ("amax", "tile"):
        names = [k for k in rows[0] if k.startswith(f"triton {kind} ")]
        if names:
            best[kind] = min(names, key=lambda k: sum(r[k] for r in rows))
    total = {k: sum(r[k] for r in rows) for k in ("baseline", "compiled", "triton")}
    print(f"\nfp8_cast, tensorwise E4M3 with q^T, median device ms a call over {args.iters} calls ({gpu}); GB/s: the "
          f"6 bytes an element a cast moves at least")
    print("| operand | layout | baseline | compiled | triton | compiled GB/s | triton GB/s | triton x compiled |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['shape'][0]} x {r['shape'][1]} | {r['layout']} | {r['baseline']:.3f} | {r['compiled']:.3f} | "
              f"{r['triton']:.3f} | {r['bytes'] / r['compiled'] / 1e6:.0f} | {r['bytes'] / r['triton'] / 1e6:.0f} | "
              f"{r['compiled'] / r['triton']:.2f} |")
    print(f"| all | | {total['baseline']:.3f} | {total['compiled']:.3f} | {total['triton']:.3f} | | | "
          f"{total['compiled'] / total['triton']:.2f} |")
    for kind, name in best.items():
        print(f"fastest {kind} launch shape over all rows: {name} ({sum(r[name] for r in rows):.3f} ms summed)")
    print("bit for bit the baseline: " + ("every version and launch shape" if not mismatches else
                                          f"NOT {len(mismatches)}: " + "; ".join(mismatches[:8])))
    if args.out:
        args.out.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "iters": args.iters, "rows": rows,
                                        "fastest": best, "mismatches": mismatches}, indent=1))
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
