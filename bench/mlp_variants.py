"""The whole SwiGLU MLP (FC1 + SwiGLU + FC2), three ways, to decide where the SwiGLU backward belongs.

    python bench/mlp_variants.py --out mlp_variants.json

gemm_fc1's backward runs the SwiGLU backward as its own bandwidth-bound pass (our kernel at the
bandwidth floor), which caps the op at ~1.10x torch at TP 2 on an H200 (docs/benchmarks.md). The
only GEMM that can host that pass is FC2's dgrad (dh = dY @ W2), outside gemm_fc1's boundary. This
measures, at MiniCPM4-8B shapes (8192 tokens, TP 1 and 2, one rank, no collectives), forward +
backward of the whole MLP y = (silu(x Wg^T) * (x Wu^T)) W2^T:

  torch      F.linear for FC1 (stacked [Wg; Wu]), eager silu * up, F.linear for FC2, autograd
  op-quack   the engine today: ops gemm_fc1 `quack` (gated GEMM + our dswiglu + cuBLAS) + F.linear FC2
  fused      forward: quack gemm_gated (preact + h) and cuBLAS FC2; backward: quack gemm_dgated
             computes dY @ W2 and turns it into d preact in the epilogue (no separate pass),
             dW2 = dY^T h (cuBLAS), dx = dpre @ W1 and dW1 = dpre^T x (quack, concat layout)

Each checked against the fp32 torch MLP (rel. error of y, dx, dW1, dW2; bf16 tolerance 1e-2), timed
back to back like bench/ops.py (median of --reps batches of --iters calls over 3 input sets).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import rel_err  # noqa: E402

__all__ = ["main"]

TOL = 1e-2


def torch_mlp(x, w1, w2):
    f = w1.shape[0] // 2
    gu = F.linear(x, w1)
    return F.linear(F.silu(gu[:, :f]) * gu[:, f:], w2)


def op_quack_mlp(x, w1, w2):
    from engine.ops.gemm_fc1.quack_gated import gemm_fc1
    return F.linear(gemm_fc1(x, w1), w2)


class _FusedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2):
        from quack.gemm_interface import gemm_gated
        preact, h = gemm_gated(x, w1.t(), activation="swiglu", concat_layout=("B",), tuned=False, store_preact=True)
        ctx.save_for_backward(x, w1, w2, preact, h)
        return torch.mm(h, w2.t())

    @staticmethod
    def backward(ctx, dy):
        from quack.gemm_interface import gemm, gemm_dgated
        x, w1, w2, preact, h = ctx.saved_tensors
        dy = dy.contiguous()
        dpre, _ = gemm_dgated(dy, w2, preact, activation="swiglu", tuned=False, postact_out=torch.empty_like(h))
        dw2 = torch.mm(dy.t(), h)
        dx = gemm(dpre, w1, concat_layout=("B",), tuned=False)
        dw1 = gemm(dpre.t(), x, concat_layout=("out",), tuned=False)
        return dx, dw1, dw2


def fused_mlp(x, w1, w2):
    return _FusedMLP.apply(x, w1, w2)


def _inputs(m, h, f, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * std).to(dtype).requires_grad_()

    return {"x": rand(m, h), "w1": rand(2 * f, h, std=h ** -0.5), "w2": rand(h, f, std=f ** -0.5),
            "dy": torch.randn(m, h, generator=g, device="cuda").to(dtype)}


def _fwd_bwd(fn, s):
    for k in ("x", "w1", "w2"):
        s[k].grad = None
    y = fn(s["x"], s["w1"], s["w2"])
    y.backward(s["dy"].to(y.dtype))
    return y


def _pipelined_ms(fn, sets, iters, reps) -> float:
    _fwd_bwd(fn, sets[0])
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        for i in range(iters):
            _fwd_bwd(fn, sets[i % len(sets)])
        stop.record()
        stop.synchronize()
        per_call.append(start.elapsed_time(stop) / iters)
    return statistics.median(per_call)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("mlp_variants.json"))
    args = ap.parse_args(argv)

    from engine.ops.kernel_cache import configure_quack_cache
    configure_quack_cache()

    h, m = 4096, args.tokens
    variants = {"torch": torch_mlp, "op-quack": op_quack_mlp, "fused": fused_mlp}
    rows = []
    for tp in args.tp:
        f = 16384 // tp
        check = _inputs(m, h, f, 99)
        ref_in = {k: (v.detach().float().requires_grad_() if k != "dy" else v.float()) for k, v in check.items()}
        ref_y = _fwd_bwd(torch_mlp, ref_in)
        sets = [_inputs(m, h, f, seed) for seed in (1, 2, 3)]
        for name, fn in variants.items():
            y = _fwd_bwd(fn, check)
            err = max(rel_err(y, ref_y), *(rel_err(check[k].grad, ref_in[k].grad) for k in ("x", "w1", "w2")))
            ms = _pipelined_ms(fn, sets, args.iters, args.reps)
            rows.append({"tp": tp, "variant": name, "fwd_bwd_ms": ms, "err": err})
            print(f"tp{tp} {name}: {ms:.3f} ms err {err:.1e}", flush=True)
        base = next(r["fwd_bwd_ms"] for r in rows if r["tp"] == tp and r["variant"] == "torch")
        for r in rows:
            if r["tp"] == tp:
                r["x_vs_torch"] = base / r["fwd_bwd_ms"]
        del sets, check, ref_in
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                                   indent=1))
    print("\n| TP | variant | MLP fwd+bwd ms | x vs torch | err |\n| ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['tp']} | {r['variant']} | {r['fwd_bwd_ms']:.3f} | {r['x_vs_torch']:.2f} | {r['err']:.1e} |")
    bad = [r for r in rows if r["err"] > TOL]
    for r in bad:
        print(f"MISMATCH tp{r['tp']} {r['variant']}: err {r['err']:.2e} > {TOL}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
