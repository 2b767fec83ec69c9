"""The 4-layer 8B slice's GEMMs outside the step: alone (a burst) and back to back in step order (sustained).

    python bench/step_gemms.py --out step_gemms.json [--profile profile_8b4l.json] [--quack]

bench/profile_step.py measures each GEMM family inside a real step (--profile reads its JSON for the
"in step" column). The same GEMMs timed alone run faster (bench/gemm_variants.py), and the question is why:
the GPU's clock under a sustained load (power), or something about the step (layouts, operand placement).
So each GEMM is timed twice here, on the same shapes and layouts as the engine's (MiniCPM4-8B, TP 1,
mbs 2 x seq 4096 = 8192 tokens, LM head in 4096-token chunks, weight gradients accumulated into fp32):

  burst      median of --iters calls, each synchronised (the GPU idles between calls), as gemm_variants does;
  sustained  one micro-batch's GEMMs (4 layers' forward, the LM head, 4 layers' backward) launched back to
             back for --sustain-s seconds without a host sync; each call's device events, the later half.

nvidia-smi's SM clock and power are sampled in each phase (bench/common.py GpuPoller). With --quack, the same
two phases for quack's SM90 GEMM (its default config; the weight gradients through gemm_add_inplace into fp32),
so a GEMM that cuBLAS runs slower under load than quack does shows up.

    python bench/step_gemms.py --tiles --out step_gemm_tiles.json

--tiles asks a narrower question once the step is known to be power-bound: at the power limit, throughput is
work per joule, so does another tile shape or cluster do more of these GEMMs per joule than cuBLAS's choice? Each
of the larger GEMMs (--tile-gemms) runs alone, back to back for --tile-s seconds, with cuBLAS, quack's default
and the explicit quack configs of --tile-configs (bench/gemm_variants.py's notation; dW through gemm_act's C
into fp32); TFLOP/s of the later half, SM clock and power for each. Every result is checked against the fp32
product once (relative error <= 1e-2 for bf16 operands). JSON to --out, table last.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import GpuPoller, median_call_ms, rel_err  # noqa: E402

__all__ = ["main", "problems", "step_order", "match_profile"]

TOL = 1e-2


def problems(tokens: int = 8192, chunk: int = 4096, h: int = 4096, f: int = 16384, qkv: int = 4608,
             vocab: int = 73472) -> dict[str, tuple[str, tuple[int, int, int], str]]:
    """name -> (kind, (m, n, k), layout) of the step's GEMMs. kind: "mm" (bf16 out) or "acc" (fp32 main += a @ b).
    layout says which operand is a transposed view: "nt" = a @ w.t() (forward), "nn" = g @ w (input gradient),
    "tn" = g.t() @ x (weight gradient)."""
    out = {}
    for name, rows, cols in (("qkv", qkv, h), ("o", h, h), ("fc1", 2 * f, h), ("fc2", h, f)):
        out[f"{name}.fwd"] = ("mm", (tokens, rows, cols), "nt")
        out[f"{name}.dx"] = ("mm", (tokens, cols, rows), "nn")
        out[f"{name}.dw"] = ("acc", (rows, cols, tokens), "tn")
    out["lm.fwd"] = ("mm", (chunk, vocab, h), "nt")
    out["lm.dh"] = ("mm", (chunk, h, vocab), "nn")
    out["lm.dw"] = ("acc", (vocab, h, tokens), "tn")
    return out


def step_order(layers: int = 4, chunks: int = 2) -> list[str]:
    """One micro-batch's GEMM calls in the order the engine launches them."""
    fwd = [g for _ in range(layers) for g in ("qkv.fwd", "o.fwd", "fc1.fwd", "fc2.fwd")]
    head = ["lm.fwd"] * chunks + ["lm.dh"] * chunks + ["lm.dw"]
    bwd = [g for _ in range(layers) for g in ("fc2.dx", "fc2.dw", "fc1.dx", "fc1.dw", "o.dx", "o.dw", "qkv.dx", "qkv.dw")]
    return fwd + head + bwd


def _operands(kind: str, mnk: tuple[int, int, int], layout: str, seed: int):
    """(a, b, c) in the engine's layouts: a [m, k], b [k, n] (views), c the fp32 buffer for "acc" else None."""
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * std).bfloat16()

    if layout == "nt":  # activations [m, k] @ weight [n, k]^T
        a, b = rand(m, k), rand(n, k, std=k ** -0.5).t()
    elif layout == "nn":  # gradient [m, k] @ weight [k, n]
        a, b = rand(m, k, std=k ** -0.5), rand(k, n)
    else:  # gradient [k, m]^T @ activations [k, n]
        a, b = rand(k, m, std=k ** -0.5).t(), rand(k, n)
    c = torch.zeros(m, n, device="cuda", dtype=torch.float32) if kind == "acc" else None
    return a, b, c


def _cublas(kind, a, b, c):
    if kind == "acc":
        return torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
    return torch.mm(a, b)


def _quack(kind, a, b, c):
    from quack.gemm_interface import gemm, gemm_add_inplace
    if kind == "acc":
        gemm_add_inplace(a, b, out=c, tuned=False)
        return c
    return gemm(a, b, tuned=False)


def _tflops(mnk: tuple[int, int, int], ms: float) -> float:
    return 2 * mnk[0] * mnk[1] * mnk[2] / ms / 1e9


def _print_mismatches(rows: list[dict], who: str) -> None:
    for r in rows:
        if r.get("err", 0) > TOL:
            print(f"MISMATCH {r[who]} {r['gemm']}: err {r['err']:.2e}")


def _check(fn, kind, a, b, c) -> float:
    ref = a.float() @ b.float()
    if c is not None:
        c.zero_()
    return rel_err(fn(kind, a, b, c), ref)


def _sustained(fn, probs, ops, order, seconds: float) -> tuple[dict[str, float], float]:
    """Per GEMM median ms over the later half of `seconds` of back-to-back micro-batches, and the wall seconds."""
    start = time.perf_counter()
    reps: list[list[tuple[str, torch.cuda.Event, torch.cuda.Event]]] = []
    while time.perf_counter() - start < seconds:
        rep = []
        for name in order:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn(probs[name][0], *ops[name])
            e1.record()
            rep.append((name, e0, e1))
        reps.append(rep)
        if len(reps) > 2:  # keep at most two micro-batches queued ahead of the host
            reps[-3][-1][2].synchronize()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for rep in reps[len(reps) // 2:]:
        for name, e0, e1 in rep:
            times.setdefault(name, []).append(e0.elapsed_time(e1))
    return {name: statistics.median(t) for name, t in times.items()}, time.perf_counter() - start


def match_profile(gemm_rows: list[dict]) -> dict[str, dict]:
    """profile_step.py's GEMM rows (its JSON's "gemms") by this script's names, matched on the operands' shapes:
    aten::mm records [a, b(, out)], aten::addmm [c, a, b, out]. o.fwd and o.dx share one row (the same shapes);
    fc1.fwd is the gated quack GEMM, launched by `_GemmFc1` rather than an aten op."""
    found = {}
    for row in gemm_rows:
        dims = [[int(d) for d in s.strip(" []").split(",")] for s in row["shapes"].split(" x ")]
        kind, ab = ("acc", dims[1:3]) if row["op"] == "aten::addmm" else ("mm", dims[:2])
        for name, (k_, (m, n, k), _) in problems().items():
            if k_ == kind and ab == [[m, k], [k, n]]:
                found[name] = row
    return found


def run_backend(label: str, fn, probs, order, args, rows: list[dict]) -> None:
    ops = {name: _operands(kind, mnk, layout, seed=7) for name, (kind, mnk, layout) in probs.items()}
    for name, (kind, mnk, layout) in probs.items():
        a, b, c = ops[name]
        try:
            err = _check(fn, kind, a, b, c)
        except Exception as exc:  # a backend that cannot run a layout records why and the others go on
            rows.append({"backend": label, "gemm": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"{label} {name}: {rows[-1]['error']}", flush=True)
            continue
        rows.append({"backend": label, "gemm": name, "m_n_k": mnk, "layout": layout, "kind": kind, "err": err})
    usable = [n for n in order if any(r.get("gemm") == n and r["backend"] == label and "err" in r for r in rows)]
    poller = GpuPoller(interval_ms=100)
    for name in dict.fromkeys(usable):
        kind = probs[name][0]
        ms = median_call_ms(lambda o, kind=kind: fn(kind, *o), [ops[name]], args.iters)
        row = next(r for r in rows if r["backend"] == label and r.get("gemm") == name)
        row.update({"burst_ms": ms, "burst_tflops": _tflops(probs[name][1], ms)})
    burst = poller.stop()
    poller = GpuPoller(interval_ms=100)
    medians, wall = _sustained(fn, probs, ops, usable, args.sustain_s)
    sustained = poller.stop()
    for name, ms in medians.items():
        row = next(r for r in rows if r["backend"] == label and r.get("gemm") == name)
        row.update({"sustained_ms": ms, "sustained_tflops": _tflops(probs[name][1], ms)})
    print(f"{label}: burst {burst}; sustained {sustained} ({wall:.1f} s)", flush=True)
    rows.append({"backend": label, "phase_clocks": {"burst": burst, "sustained": sustained}})
    del ops
    torch.cuda.empty_cache()


def _quack_config(fn_kind: str, a, b, c, cfg):
    """quack's gemm_act with an explicit config (None: its default); "acc" adds into c through the C operand."""
    from quack.gemm_interface import gemm_act
    if fn_kind == "acc":
        gemm_act(a, b, C=c, activation=None, postact_out=c, postact_dtype=torch.float32, store_preact=False,
                 tuned=False, config=cfg)
        return c
    return gemm_act(a, b, activation=None, store_preact=False, tuned=False, config=cfg)[1]


def _parse_tile(text: str):
    """'256x128-coop-c21' -> quack GemmConfig (tile 256 x 128, cooperative, cluster 2 x 1); 'default' -> None."""
    if text == "default":
        return None
    from quack.gemm_config import GemmConfig
    tiles, mode, cluster = text.split("-")
    tm, tn = (int(x) for x in tiles.split("x"))
    return GemmConfig(tile_m=tm, tile_n=tn, pingpong=mode == "pp", cluster_m=int(cluster[1]), cluster_n=int(cluster[2]),
                      is_dynamic_persistent=False, device_capacity=9)


def sweep_tiles(args) -> int:
    probs = problems()
    variants = [("cublas", None)] + [(f"quack {t}", t) for t in args.tile_configs]
    rows = []
    for name in args.tile_gemms:
        kind, mnk, layout = probs[name]
        a, b, c = _operands(kind, mnk, layout, seed=7)
        for label, tile in variants:
            if tile is None:
                def fn(kind=kind):
                    return _cublas(kind, a, b, c)
            else:
                cfg = _parse_tile(tile)

                def fn(kind=kind, cfg=cfg):
                    return _quack_config(kind, a, b, c, cfg)
            row = {"gemm": name, "variant": label, "m_n_k": mnk}
            try:
                row["err"] = _check(lambda kind, a, b, c: fn(), kind, a, b, c)
                poller = GpuPoller(interval_ms=100)
                medians, _ = _sustained(lambda kind, *o: fn(), {name: probs[name]}, {name: (a, b, c)}, [name],
                                        args.tile_s)
                smi = poller.stop()
                row.update({"ms": medians[name], "tflops": _tflops(mnk, medians[name]),
                            "sm_mhz": smi["sm_mhz"][:1], "power_w": smi["power_w"][:1]})
            except Exception as exc:  # a config quack refuses for this shape: recorded, the sweep goes on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(f"{name} {label}: " + (f"{row['tflops']:.0f} TFLOP/s err {row['err']:.1e} {row['sm_mhz']} MHz "
                                         f"{row['power_w']} W" if "tflops" in row else row["error"]), flush=True)
        del a, b, c
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "tile_s": args.tile_s, "rows": rows}, indent=1))
    print(f"\ndevice {torch.cuda.get_device_name()}; each GEMM alone, back to back for {args.tile_s} s: TFLOP/s "
          f"(MHz, W)\n| GEMM | " + " | ".join(label for label, _ in variants) + " |\n| --- |" + " ---: |" * len(variants))
    for name in args.tile_gemms:
        cells = []
        for label, _ in variants:
            r = next(r for r in rows if r["gemm"] == name and r["variant"] == label)
            cells.append(f"{r['tflops']:.0f} ({r['sm_mhz'][0]:.0f}, {r['power_w'][0]:.0f})"
                         if "tflops" in r and r["sm_mhz"] else f"{r['tflops']:.0f}" if "tflops" in r else "failed")
        print(f"| {name} | " + " | ".join(cells) + " |")
    _print_mismatches(rows, "variant")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sustain-s", type=float, default=8.0)
    ap.add_argument("--profile", type=Path, default=None, help="profile_step.py JSON: the in-step TFLOP/s column")
    ap.add_argument("--quack", action="store_true", help="also time quack's SM90 GEMM (its default config)")
    ap.add_argument("--tiles", action="store_true", help="sweep quack tile configs on the larger GEMMs (see above)")
    ap.add_argument("--tile-gemms", nargs="+", default=["fc1.dx", "fc1.dw", "fc2.fwd", "fc2.dx", "fc2.dw", "lm.fwd",
                                                        "lm.dh", "lm.dw"])
    ap.add_argument("--tile-configs", nargs="+", default=["default", "256x192-coop-c21", "128x256-coop-c21",
                                                          "256x128-coop-c12", "256x128-coop-c21"])
    ap.add_argument("--tile-s", type=float, default=1.5)
    ap.add_argument("--out", type=Path, default=Path("step_gemms.json"))
    args = ap.parse_args(argv)
    if args.tiles:
        from engine.ops.kernel_cache import configure_quack_cache
        configure_quack_cache()
        return sweep_tiles(args)

    probs, order = problems(), step_order()
    rows: list[dict] = []
    backends = [("cublas", _cublas)]
    if args.quack:
        from engine.ops.kernel_cache import configure_quack_cache
        configure_quack_cache()
        backends.append(("quack", _quack))
    for label, fn in backends:
        run_backend(label, fn, probs, order, args, rows)
    gemm_rows = json.loads(args.profile.read_text()).get("gemms", []) if args.profile else []
    in_step = {name: row["tflops"] for name, row in match_profile(gemm_rows).items() if row.get("tflops")}
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "in_step_tflops": in_step, "rows": rows}, indent=1))

    print(f"\ndevice {torch.cuda.get_device_name()}; TFLOP/s (bf16 operands; .dw into fp32)")
    labels = [label for label, _ in backends]
    head = "| GEMM | m x n x k | in step | " + " | ".join(f"{x} burst | {x} sustained" for x in labels) + " |"
    print(head + "\n|" + " --- |" * 2 + " ---: |" * (1 + 2 * len(labels)))
    for name, (_, mnk, _) in probs.items():
        cells = []
        for label in labels:
            r = next((r for r in rows if r["backend"] == label and r.get("gemm") == name), {})
            cells += [f"{r['burst_tflops']:.0f}" if "burst_tflops" in r else "-",
                      f"{r['sustained_tflops']:.0f}" if "sustained_tflops" in r else r.get("error", "-")[:30]]
        step = f"{in_step[name]:.0f}" if name in in_step else "-"
        print(f"| {name} | {'x'.join(map(str, mnk))} | {step} | " + " | ".join(cells) + " |")
    for r in rows:
        if "phase_clocks" in r:
            print(f"{r['backend']}: " + "; ".join(f"{phase} {c['sm_mhz'][0]:.0f} MHz {c['power_w'][0]:.0f} W"
                                                  for phase, c in r["phase_clocks"].items() if c["sm_mhz"]))
    _print_mismatches(rows, "backend")
    return 0


if __name__ == "__main__":
    sys.exit(main())
