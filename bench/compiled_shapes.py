"""The ops' torch.compile kernels (engine/ops/inductor.py) with dynamic shapes vs a graph per shape, at the 8B
slice's shapes, on one GPU.

    python bench/compiled_shapes.py --out compiled_shapes.json

fp8 cast (engine/ops/fp8_cast/compiled.py, writing q and q^T row-major): `transpose-q` (q cast, then q^T copied
from q: the engine's), dynamic and static, and `from-t` (both cast from the operand: two outputs of one read, which
inductor still writes as two kernels), each checked bit for bit against the baseline cast (engine/distributed/fp8.py);
then the whole cast with its amax: the engine's (eager amax, compiled static cast) against amax and cast in one
compiled graph.
The amax alone: eager and compiled. Each compiled kernel also with inductor's tile tuning (TUNINGS), and the cast
`split` into two kernels (q, then q^T from q).
SwiGLU (engine/ops/gemm_fc1/compiled.py) forward and backward, dynamic and static (and tuned), against the eager
baseline's math; the backward beside the CuTeDSL kernel of the bf16 path when its wheels are there.
Median device time of --iters calls and the kernels each launches; table last, JSON to --out.
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
from engine.ops.gemm_fc1.compiled import _dswiglu, _swiglu  # noqa: E402
from engine.ops.inductor import CompiledKernel  # noqa: E402

# operands cast with their transpose (x, dy: 8192 tokens x 4096 ... 32768; the FC1 weight [32768, 4096])
CAST_SHAPES = ((8192, 4096), (8192, 4608), (8192, 16384), (8192, 32768), (32768, 4096))
# [tokens, 2f] FC1 outputs: TP 1 and TP 2
SWIGLU_SHAPES = ((8192, 32768), (8192, 16384))


def transpose_q(t, scale):
    q = scaled_cast(t, scale, E4M3).contiguous()
    return q, q.t().contiguous()


def from_t(t, scale):
    return scaled_cast(t, scale, E4M3).contiguous(), scaled_cast(t.t(), scale, E4M3).contiguous()


def with_amax(t):
    """The whole cast in one compiled graph: amax and scale too (engine/distributed/fp8.py amax_scale's math)."""
    scale = amax_scale(t, E4M3, None, False)
    return (*transpose_q(t, scale), scale)


def kernels(fn, *args) -> int:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def timed(row: dict, name: str, fn, args: tuple, iters: int) -> None:
    row[f"{name}_ms"] = median_call_ms(lambda _: fn(*args), [None], iters)
    row[f"{name}_kernels"] = kernels(fn, *args)


# inductor's tile tuning, as CompiledKernel(options=...) takes it: coordinate descent over the chosen config's
# block sizes, warps and stages, or an autotune over pointwise configs (both pay at the first call of a shape)
TUNINGS = {"cdt": {"coordinate_descent_tuning": True}, "autotune": {"max_autotune_pointwise": True}}


def compiled(fn, name: str, dynamic: bool, options: dict | None = None):
    """A static kernel as the engine compiles it (CompiledKernel: a graph per input layout), or (`dynamic`, the A of
    the dynamic-vs-static rows) torch.compile with dynamic shapes, one graph for every shape."""
    if dynamic:
        return torch.compile(fn, dynamic=True, fullgraph=True, options=options)
    return CompiledKernel(fn, "bench", name, f"bench/compiled_shapes.py:{name}", "-", options=options)


def q_only(t, scale):
    return scaled_cast(t, scale, E4M3).contiguous()


def split(cast_q, transpose):
    """q by one kernel, then q^T copied from q (1 byte read and written an element) by another."""
    def run(t, scale):
        q = cast_q(t, scale)
        return q, transpose(q)
    return run


def amax(t):
    return t.abs().amax().float()


def cute_dswiglu():
    """The bf16 path's CuTeDSL SwiGLU backward (engine/ops/gemm_fc1/cute_dswiglu.py) as the bar, or None without the
    CuTeDSL wheels (it reads [gate, up] interleaved: the same bytes)."""
    try:
        from engine.ops.gemm_fc1.cute_dswiglu import dswiglu_concat
    except ImportError:
        return None
    return dswiglu_concat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    casts = {"transpose-q dynamic": compiled(transpose_q, "tq-dyn", True),
             "transpose-q static": compiled(transpose_q, "tq-static", False),
             "from-t dynamic": compiled(from_t, "from-t", True)}
    casts.update({f"transpose-q {k}": compiled(transpose_q, f"tq-{k}", False, o) for k, o in TUNINGS.items()})
    casts["split cdt"] = split(compiled(q_only, "q-cdt", False, TUNINGS["cdt"]),
                               compiled(lambda q: q.t().contiguous(), "qt-cdt", False, TUNINGS["cdt"]))
    amaxes = {"eager": amax, "static": compiled(amax, "amax", False),
              **{k: compiled(amax, f"amax-{k}", False, o) for k, o in TUNINGS.items()}}
    static = casts["transpose-q static"]
    whole = {"eager amax + static": lambda t: static(t, amax_scale(t, E4M3, None, False)),
             "amax compiled too": compiled(with_amax, "with-amax", False)}
    for shape in CAST_SHAPES:
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 3
        scale = amax_scale(t, E4M3, None, False)
        q_ref, _, qt_ref = cast(t, E4M3, None, False, transposed=True)
        row = {"kernel": "fp8 cast q, q^T", "shape": list(shape), "bytes": t.numel() * 4, "bitwise": True}
        for name, fn in casts.items():
            q, qt = fn(t, scale)
            row["bitwise"] &= bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
                                   and torch.equal(qt.view(torch.uint8), qt_ref.view(torch.uint8)))
            timed(row, name, fn, (t, scale), args.iters)
        rows.append(row)
        row = {"kernel": "amax", "shape": list(shape), "bytes": t.numel() * 2, "bitwise": True}
        for name, fn in amaxes.items():
            row["bitwise"] &= bool(torch.equal(fn(t), amax(t)))
            timed(row, name, fn, (t,), args.iters)
        rows.append(row)
        # the whole cast (amax, scale, both layouts): the eager amax beside the compiled cast, or one compiled graph
        row = {"kernel": "fp8 cast + amax", "shape": list(shape), "bytes": t.numel() * 6, "bitwise": True}
        for name, fn in whole.items():
            q, qt = fn(t)[:2]
            row["bitwise"] &= bool(torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
                                   and torch.equal(qt.view(torch.uint8), qt_ref.view(torch.uint8)))
            timed(row, name, fn, (t,), args.iters)
        rows.append(row)
    for shape in SWIGLU_SHAPES:
        pre = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(shape[0], shape[1] // 2, device="cuda", dtype=torch.bfloat16)
        for kernel, fn, fargs, nbytes in (("swiglu fwd", _swiglu, (pre,), pre.numel() * 3),
                                          ("swiglu bwd", _dswiglu, (dy, pre), pre.numel() * 5)):
            ref = fn(*fargs)
            row = {"kernel": kernel, "shape": list(shape), "bytes": nbytes, "bitwise": True}
            for name, dynamic, options in (("dynamic", True, None), ("static", False, None),
                                           *((f"static {k}", False, o) for k, o in TUNINGS.items())):
                kern = compiled(fn, f"{kernel}-{name}", dynamic, options)
                out = kern(*fargs)
                row["bitwise"] &= bool(torch.equal(out, ref))  # against eager: information, not a check
                row[f"max_diff_{name}"] = (out.float() - ref.float()).abs().max().item()
                timed(row, name, kern, fargs, args.iters)
            if kernel == "swiglu bwd" and cute_dswiglu() is not None:
                timed(row, "cute", cute_dswiglu(), fargs, args.iters)
            rows.append(row)
    device = torch.cuda.get_device_name()
    args.out.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(f"device {device}; ms: median device time of one call (k: kernels launched); GB/s: the least bytes moved "
          f"(cast: 2 read + 2 written an element, 6 with the amax's read; amax 2; SwiGLU: 3 forward, 5 backward per "
          f"element of [gate | up]) / the best time; bitwise: equal to the baseline cast (SwiGLU: to the eager math, "
          f"for information)")
    for r in rows:
        ways = [k[:-3] for k in r if k.endswith("_ms")]
        best = min(r[f"{w}_ms"] for w in ways)
        cells = "  ".join(f"{w} {r[f'{w}_ms']:.3f} ms ({r[f'{w}_kernels']}k)" for w in ways)
        print(f"{r['kernel']:>15} {'x'.join(map(str, r['shape'])):>11}  {cells}  {r['bytes'] / best / 1e6:5.0f} GB/s  "
              f"bitwise {r['bitwise']}")


if __name__ == "__main__":
    main()
