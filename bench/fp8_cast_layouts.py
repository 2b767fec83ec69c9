"""The FP8 operand cast that writes both layouts (q and q^T row-major), two ways, at the 8B slice's shapes.

    python bench/fp8_cast_layouts.py --out fp8_cast_layouts.json

`transpose-q`: q cast from t, then q^T copied from q (the engine's compiled cast before: inductor writes two
kernels, the second reading q back at transposed indices; a consumer reading its producer at other indices does not
fuse). `from-t`: both cast from t (engine/ops/fp8_cast/compiled.py now: two outputs of one read, which inductor may
write in one tiled kernel). Each is checked bit for bit against the baseline cast (engine/distributed/fp8.py) and
timed (median device time of --iters calls, the scale computed outside), with the number of kernels it launches.
Table last, JSON to --out.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms  # noqa: E402
from engine.distributed.fp8 import E4M3, amax_scale, cast, scaled_cast  # noqa: E402
from engine.ops.inductor import CompiledKernel  # noqa: E402

# [rows, cols] of the slice's operands cast with their transpose: x and dy (8192 tokens x 4096, 16384, 32768 ...),
# and the FC1 weight [32768, 4096]
SHAPES = ((8192, 4096), (8192, 4608), (8192, 16384), (8192, 32768), (32768, 4096))


def transpose_q(t, scale, dtype=E4M3):
    q = scaled_cast(t, scale, dtype).contiguous()
    return q, q.t().contiguous()


def from_t(t, scale, dtype=E4M3):
    return scaled_cast(t, scale, dtype).contiguous(), scaled_cast(t.t(), scale, dtype).contiguous()


def kernels(fn, *args) -> int:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    ways = {name: CompiledKernel(fn, "fp8_cast", name, f"bench/fp8_cast_layouts.py:{name}", "-")
            for name, fn in (("transpose-q", transpose_q), ("from-t", from_t))}
    rows = []
    for shape in SHAPES:
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3
        scale = amax_scale(t, E4M3, None, False)
        q_ref, _, qt_ref = cast(t, E4M3, None, False, transposed=True)
        row = {"shape": list(shape), "moved_bytes_min": t.numel() * 4}
        for name, kernel in ways.items():
            q, qt = kernel(t, scale)
            row[f"{name}_bitwise"] = bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
                                          and torch.equal(qt.view(torch.uint8), qt_ref.view(torch.uint8)))
            row[f"{name}_ms"] = median_call_ms(lambda _: kernel(t, scale), [None], args.iters)
            row[f"{name}_kernels"] = kernels(kernel, t, scale)
        rows.append(row)
    device = torch.cuda.get_device_name()
    args.out.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(f"device {device}; ms: median device time of one cast writing q and q^T (scale given); GB/s: 4 bytes an "
          f"element (2 read, 2 written) / time")
    print(f"{'shape':>14} {'transpose-q ms':>15} {'kernels':>8} {'from-t ms':>10} {'kernels':>8} {'GB/s':>7} "
          f"{'ratio':>6} bitwise")
    for r in rows:
        print(f"{'x'.join(map(str, r['shape'])):>14} {r['transpose-q_ms']:15.3f} {r['transpose-q_kernels']:8d} "
              f"{r['from-t_ms']:10.3f} {r['from-t_kernels']:8d} {r['moved_bytes_min'] / r['from-t_ms'] / 1e6:7.0f} "
              f"{r['transpose-q_ms'] / r['from-t_ms']:6.2f} {r['transpose-q_bitwise'] and r['from-t_bitwise']}")


if __name__ == "__main__":
    main()
