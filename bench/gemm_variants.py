"""Sweep quack SM90 GEMM tile configurations on the GEMMs of gemm_fc1 and gemm_output, against cuBLAS.

    python bench/gemm_variants.py --out gemm_variants.json

Both fused ops are GEMM-bound: gemm_fc1 is three GEMMs of one size plus SwiGLU elementwise work,
gemm_output three LM-head GEMMs plus the CE row passes, so their speedups over the torch baselines
are capped by how fast these GEMMs run (docs/benchmarks.md, `gemm_floor`). cuBLAS and quack's
untuned default (128 x 192 pingpong, 2 x 1 cluster) are the reference points; this times explicit
configs for each GEMM, MiniCPM4-8B shapes, 8192 tokens (LM head: one 4096-token chunk), TP 1 and 2:

  fc1.fwd  x [M, h] @ [W_gate; W_up]^T -> preact [M, 2f] + silu(gate) * up [M, f]  (quack gemm_gated,
           concat weight layout; cuBLAS: the bare GEMM without the SwiGLU, its floor)
  fc1.dx   dpre [M, 2f] @ w [2f, h]          fc1.dw   dpre^T [2f, M] @ x [M, h]
  lm.fwd   h [c, h] @ w^T [h, V]             lm.dh    dlogits [c, V] @ w [V, h]
  lm.dw    dlogits^T [V, c] @ h [c, h]

Every result is checked against the fp32 product (rel. error, bf16 tolerance 1e-2). Median of
--iters calls over 3 rotated input sets (device events). JSON to --out, table last.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms, rel_err  # noqa: E402

__all__ = ["main"]

TOL = 1e-2
# (tile_m, tile_n, pingpong, cluster_m, cluster_n); None is quack's untuned default
CONFIGS = [None, (128, 256, False, 2, 1), (128, 256, False, 1, 2), (256, 128, False, 2, 1), (256, 128, False, 1, 2),
           (256, 192, False, 2, 1), (256, 160, False, 1, 2), (128, 224, False, 1, 2), (192, 128, True, 2, 1),
           (128, 192, True, 1, 2)]






def _problems(tp: int, tokens: int, chunk: int):
    """name -> (make(seed) -> (A, B) views, gated); A [m, k], B [k, n] in the layouts the ops use."""
    h, f, vocab = 4096, 16384 // tp, 73472 // tp

    def rand(g, *shape, std=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * std).bfloat16()

    def fc1(kind):
        def make(seed):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x, w, dpre = rand(g, tokens, h), rand(g, 2 * f, h, std=h ** -0.5), rand(g, tokens, 2 * f)
            return {"fwd": (x, w.t()), "dx": (dpre, w), "dw": (dpre.t(), x)}[kind]
        return make

    def lm(kind):
        def make(seed):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x, w, dl = rand(g, chunk, h), rand(g, vocab, h, std=h ** -0.5), rand(g, chunk, vocab, std=vocab ** -0.5)
            return {"fwd": (x, w.t()), "dh": (dl, w), "dw": (dl.t(), x)}[kind]
        return make

    return {"fc1.fwd": (fc1("fwd"), True), "fc1.dx": (fc1("dx"), False), "fc1.dw": (fc1("dw"), False),
            "lm.fwd": (lm("fwd"), False), "lm.dh": (lm("dh"), False), "lm.dw": (lm("dw"), False)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--chunk", type=int, default=4096, help="LM-head chunk (engine/ops/gemm_output/quack_ce.py)")
    ap.add_argument("--only", default="", help="comma-separated problem names (default: all)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("gemm_variants.json"))
    args = ap.parse_args(argv)

    from quack.gemm_config import GemmConfig
    from quack.gemm_interface import gemm_act, gemm_gated

    from engine.ops.kernel_cache import configure_quack_cache
    configure_quack_cache()

    only = {s for s in args.only.split(",") if s}
    rows = []
    for tp in args.tp:
        for name, (make, gated) in _problems(tp, args.tokens, args.chunk).items():
            if only and name not in only:
                continue
            sets = [make(seed) for seed in (1, 2, 3)]
            a, b = make(99)
            ref = a.float() @ b.float()
            m, n = ref.shape
            flops = 2 * m * n * a.shape[1]
            if gated:
                f = n // 2
                ref_pre = torch.stack([ref[:, :f], ref[:, f:]], dim=-1).reshape(m, n)
                ref_post = F.silu(ref[:, :f]) * ref[:, f:]

            t = median_call_ms(lambda ab: torch.mm(*ab), sets, args.iters)
            rows.append({"tp": tp, "gemm": name, "variant": "cublas", "ms": t, "tflops": flops / t / 1e9,
                         "err": rel_err(torch.mm(a, b), ref)})
            print(f"tp{tp} {name} [{m}x{n}x{a.shape[1]}] cublas {t:.3f} ms {flops / t / 1e9:.0f} TFLOP/s", flush=True)
            for cfg_t in CONFIGS:
                tm, tn, pp, cm, cn = cfg_t or (0, 0, 0, 0, 0)
                variant = "quack-default" if cfg_t is None else f"{tm}x{tn}{'-pp' if pp else '-coop'}-c{cm}{cn}"
                cfg = None if cfg_t is None else GemmConfig(tile_m=tm, tile_n=tn, pingpong=pp, cluster_m=cm,
                                                            cluster_n=cn, is_dynamic_persistent=False,
                                                            device_capacity=9)

                def run(ab, cfg=cfg):
                    if gated:
                        return gemm_gated(ab[0], ab[1], activation="swiglu", concat_layout=("B",), store_preact=True,
                                          tuned=False, config=cfg)
                    return gemm_act(ab[0], ab[1], activation=None, store_preact=False, tuned=False, config=cfg)[1]

                row = {"tp": tp, "gemm": name, "variant": variant}
                try:
                    out = run((a, b))
                    row["err"] = max(rel_err(out[0], ref_pre), rel_err(out[1], ref_post)) if gated else rel_err(out, ref)
                    row["ms"] = median_call_ms(run, sets, args.iters)
                    row["tflops"] = flops / row["ms"] / 1e9
                except Exception as exc:  # a sweep row records its failure and the sweep goes on
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                print(f"tp{tp} {name} {variant} {row.get('ms', float('nan')):.3f} ms err "
                      f"{row.get('err', float('nan')):.1e} {row.get('error', '')}", flush=True)
            del sets
            torch.cuda.empty_cache()

    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows}, indent=1))
    print("\n| TP | GEMM | variant | ms | TFLOP/s | x vs cuBLAS | err |\n| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for tp in args.tp:
        for name in dict.fromkeys(r["gemm"] for r in rows if r["tp"] == tp):
            sel = [r for r in rows if r["tp"] == tp and r["gemm"] == name and "ms" in r]
            base = next(r["ms"] for r in sel if r["variant"] == "cublas")
            for r in sorted(sel, key=lambda r: r["ms"])[:4]:
                print(f"| {tp} | {name} | {r['variant']} | {r['ms']:.3f} | {r['tflops']:.0f} | {base / r['ms']:.2f} "
                      f"| {r['err']:.1e} |")
    for r in rows:
        if r.get("err", 0) > TOL:
            print(f"MISMATCH tp{r['tp']} {r['gemm']} {r['variant']}: err {r['err']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
