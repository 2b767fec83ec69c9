"""Sweep flash-attn-4's SM90 tile configurations on our attention shapes, against torch SDPA.

    python bench/attention_variants.py --out attention_variants.json

FA4 picks one SM90 forward tile (128 x 128, P@V from registers, intra-warpgroup overlap) and one
backward tile (64 x 128) for head dim 128, tuned on MHA. Our shapes are GQA with 16 query heads
per KV head (MiniCPM4-8B: 32/2 at TP 1, 16/1 at TP 2), causal, seq 4096, batch 2. For each shape
this times, side by side:

  sdpa       torch SDPA forward and forward + backward (the baseline of the attention op)
  fwd/<cfg>  FA4 forward for every feasible SM90 tile FA4's own config search lists (a subset:
             tile N 112-192, RS on/off, overlap on/off, 3-warpgroup 192 x 128), PackGQA on/off
  bwd/<cfg>  FA4 backward for the best few feasible backward tiles per shape (tile M x N), with the
             GQA path (fp32 dK/dV accumulated by atomics over the 16 query heads of a KV head, then
             converted) and with `expand` (K/V repeated to one per query head, MHA backward writes
             bf16 dK/dV per query head, summed over the group in fp32 by torch)

Every variant's outputs are checked against SDPA on the same inputs (max rel. error of out, dq, dk,
dv; bf16 tolerance 1e-2). Median of --iters calls over 3 rotated input sets, device events. JSON
to --out; the table prints last, best variants first.
"""

import argparse
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median_call_ms, rel_err  # noqa: E402

__all__ = ["main"]

TOL = 1e-2


def _sdpa(q, k, v, scale):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         scale=scale, enable_gqa=True)
    return out.transpose(1, 2)






def _inputs(b, s, hq, hkv, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

    return {"q": r(b, s, hq, d), "k": r(b, s, hkv, d), "v": r(b, s, hkv, d), "do": r(b, s, hq, d)}


def _fwd_configs(fa_search):
    """(name, kwargs of _flash_attn_fwd) for the forward tiles worth timing at head dim 128."""
    wanted = {(2, 128, n) for n in (112, 128, 144, 160, 176, 192)} | {(3, 192, 128)}
    out = []
    for c in fa_search.find_feasible_fwd_configs(128, 128):
        key = (c["num_wg"], c["tile_m"], c["tile_n"])
        if key not in wanted or (c["num_wg"] == 2 and not (c["overlap_wg"] and (c["pv_is_rs"] or c["tile_n"] == 128))):
            continue
        for pack in (None, False):
            name = (f"{c['tile_m']}x{c['tile_n']}{'-rs' if c['pv_is_rs'] else ''}{'-ol' if c['overlap_wg'] else ''}"
                    f"{'' if pack is None else '-nopack'}")
            out.append((name, {"tile_mn": (c["tile_m"], c["tile_n"]), "mma_pv_is_rs": c["pv_is_rs"],
                               "intra_wg_overlap": c["overlap_wg"], "num_threads": 128 * (c["num_wg"] + 1),
                               "pack_gqa": pack}))
    return out


def _bwd_configs(fa_iface, fa_search, per_shape: int, tiles: str = ""):
    """(name, BwdConfig) for FA4's default and the best `per_shape` feasible configs per tile shape
    (tile shapes "MxN,..." or a default set)."""
    wanted = ({(2, *(int(v) for v in t.split("x"))) for t in tiles.split(",")} if tiles else
              {(2, 64, 128), (2, 80, 128), (2, 128, 64), (2, 64, 112), (2, 96, 64)})
    default = fa_iface._tile_size_bwd_sm90(128, 128, True, False)
    out = [("default", default)]
    seen: dict[tuple, int] = {}
    for c in fa_search.find_feasible_bwd_configs(128, 128):
        key = (c["num_wg"], c["tile_m"], c["tile_n"])
        if key not in wanted:
            continue
        if seen.get(key, 0) >= per_shape:
            continue
        cfg = fa_iface.BwdConfig(
            m_block_size=c["tile_m"], n_block_size=c["tile_n"], num_stages_Q=c["Q_stage"],
            num_stages_dO=c["dO_stage"], num_stages_PdS=c["PdS_stage"], SdP_swapAB=c["SdP_swapAB"],
            dKV_swapAB=c["dKV_swapAB"], dQ_swapAB=c["dQ_swapAB"], AtomLayoutMSdP=c["AtomLayoutMSdP"],
            AtomLayoutNdKV=c["AtomLayoutNdKV"], AtomLayoutMdQ=c["AtomLayoutMdQ"], num_wg=c["num_wg"])
        if cfg == default:
            continue
        seen[key] = seen.get(key, 0) + 1
        name = (f"{cfg.m_block_size}x{cfg.n_block_size}-s{int(cfg.SdP_swapAB)}{int(cfg.dKV_swapAB)}"
                f"{int(cfg.dQ_swapAB)}-a{cfg.AtomLayoutMSdP}{cfg.AtomLayoutNdKV}{cfg.AtomLayoutMdQ}"
                f"-p{cfg.num_stages_PdS}q{cfg.num_stages_Q}{cfg.num_stages_dO}")
        out.append((name, cfg))
    return out


def _time_bwd(fa_iface, cfg, name, shape, sets, check, refs, fwd_lse, scale, iters, expands=(False, True)):
    """Rows for one backward config, GQA path and `expand` path."""
    b, s, hq, d = check["q"].shape
    hkv = check["k"].shape[2]
    group = hq // hkv
    saved = [fwd_lse(x) for x in sets]
    saved_check = fwd_lse(check)
    original = fa_iface._tile_size_bwd_sm90
    rows = []
    for expand in expands:
        row = {"shape": shape, "kind": "bwd", "variant": name + ("-expand" if expand else ""),
               "cfg": dataclasses.asdict(cfg)}
        fa_iface._tile_size_bwd_sm90 = lambda *a, **k: cfg

        def bwd(x, o, expand=expand):
            k, v = x["k"], x["v"]
            if expand:
                k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
            dq, dk, dv = fa_iface._flash_attn_bwd(x["q"], k, v, o[0], x["do"], o[1], scale, True)
            if expand:
                dk = dk.view(b, s, hkv, group, d).sum(3, dtype=torch.float32).to(dk.dtype)
                dv = dv.view(b, s, hkv, group, d).sum(3, dtype=torch.float32).to(dv.dtype)
            return dq, dk, dv

        try:
            dq, dk, dv = bwd(check, saved_check)
            row["err"] = max(rel_err(dq, refs["dq"]), rel_err(dk, refs["dk"]), rel_err(dv, refs["dv"]))
            idx = {id(x): i for i, x in enumerate(sets)}
            row["ms"] = median_call_ms(lambda x: bwd(x, saved[idx[id(x)]]), sets, iters)
        except Exception as exc:  # a sweep row records its failure and the sweep goes on
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            fa_iface._tile_size_bwd_sm90 = original
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="16/1,32/2", help="GQA shapes hq/hkv, comma-separated")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bwd-per-shape", type=int, default=1)
    ap.add_argument("--bwd-tiles", default="", help="backward tile shapes to sweep, e.g. 64x128,80x128")
    ap.add_argument("--bwd-config", default="", help="(internal) time only this backward config, in this process")
    ap.add_argument("--child-timeout", type=int, default=120)
    ap.add_argument("--skip-fwd", action="store_true")
    ap.add_argument("--no-expand", action="store_true", help="backward: time only the GQA path")
    ap.add_argument("--out", type=Path, default=Path("attention_variants.json"))
    args = ap.parse_args(argv)

    from flash_attn.cute import interface as fa_iface
    from flash_attn.cute import sm90_config_search as fa_search

    from engine.ops.kernel_cache import configure_fa4_cache
    configure_fa4_cache()

    d, b, s = 128, args.batch, args.seq
    scale = 1.0 / math.sqrt(d)
    rows = []
    for shape in args.shapes.split(","):
        hq, hkv = (int(x) for x in shape.split("/"))
        flops_fwd = 4 * b * s * s * hq * d / 2  # causal: half the square
        sets = [_inputs(b, s, hq, hkv, d, seed) for seed in (1, 2, 3)]
        check = _inputs(b, s, hq, hkv, d, 99)
        qc, kc, vc = (check[n].clone().requires_grad_() for n in "qkv")
        ref = _sdpa(qc, kc, vc, scale)
        ref.backward(check["do"])
        refs = {"out": ref.detach(), "dq": qc.grad, "dk": kc.grad, "dv": vc.grad}

        def sdpa_fb(x):
            q, k, v = (x[n].detach().requires_grad_() for n in "qkv")
            _sdpa(q, k, v, scale).backward(x["do"])

        t_f = median_call_ms(lambda x: _sdpa(x["q"], x["k"], x["v"], scale), sets, args.iters)
        t_fb = median_call_ms(sdpa_fb, sets, args.iters)
        base = {"fwd": t_f, "bwd": t_fb - t_f}
        rows.append({"shape": shape, "kind": "sdpa", "variant": "sdpa", "ms": t_f, "fb_ms": t_fb, "err": 0.0})
        rows.append({"shape": shape, "kind": "bwd", "variant": "sdpa", "ms": t_fb - t_f, "err": 0.0})
        print(f"[{shape}] sdpa fwd {t_f:.3f} ms  fwd+bwd {t_fb:.3f} ms", flush=True)

        for name, kw in ([] if args.skip_fwd or args.bwd_config else _fwd_configs(fa_search)):
            row = {"shape": shape, "kind": "fwd", "variant": name, "cfg": {k: v for k, v in kw.items()}}
            try:
                out = fa_iface._flash_attn_fwd(check["q"], check["k"], check["v"], softmax_scale=scale, causal=True,
                                               return_lse=True, **kw)[0]
                row["err"] = rel_err(out, refs["out"])
                row["ms"] = median_call_ms(lambda x: fa_iface._flash_attn_fwd(x["q"], x["k"], x["v"], softmax_scale=scale,
                                                                      causal=True, return_lse=True, **kw), sets,
                                  args.iters)
                row["x"] = base["fwd"] / row["ms"]
                row["tflops"] = flops_fwd / row["ms"] / 1e9
            except Exception as exc:  # a sweep row records its failure and the sweep goes on
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(f"[{shape}] fwd {name}: {row.get('ms', float('nan')):.3f} ms err {row.get('err', float('nan')):.1e} "
                  f"{row.get('error', '')}", flush=True)

        def fwd_lse(x):
            out, lse = fa_iface._flash_attn_fwd(x["q"], x["k"], x["v"], softmax_scale=scale, causal=True,
                                                return_lse=True)[:2]
            return out, lse

        if args.bwd_config:  # child process: time one backward config (both paths) and report it
            cfg = dict(_bwd_configs(fa_iface, fa_search, args.bwd_per_shape, args.bwd_tiles))[args.bwd_config]
            rows = [r for r in rows if r["kind"] == "bwd" and r["variant"] != "sdpa"]
            rows += _time_bwd(fa_iface, cfg, args.bwd_config, shape, sets, check, refs, fwd_lse, scale, args.iters,
                              expands=(False,) if args.no_expand else (False, True))
            continue
        for name, _ in _bwd_configs(fa_iface, fa_search, args.bwd_per_shape, args.bwd_tiles):
            # A config the kernel rejects can abort the process (a device-side assert): one child each.
            child = args.out.with_suffix(f".{shape.replace('/', '-')}.{name}.json")
            cmd = [sys.executable, __file__, "--shapes", shape, "--batch", str(b), "--seq", str(s), "--iters",
                   str(args.iters), "--bwd-per-shape", str(args.bwd_per_shape), "--bwd-tiles", args.bwd_tiles,
                   "--bwd-config", name, "--out", str(child), *(["--no-expand"] if args.no_expand else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
            got = json.loads(child.read_text())["rows"] if proc.returncode == 0 and child.exists() else []
            if not got:
                got = [{"shape": shape, "kind": "bwd", "variant": name, "error": f"child exited {proc.returncode}: "
                        f"{proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else ''}"[:300]}]
            for row in got:
                if "x" not in row and "ms" in row:
                    row["x"] = base["bwd"] / row["ms"]
                print(f"[{shape}] bwd {row['variant']}: {row.get('ms', float('nan')):.3f} ms err "
                      f"{row.get('err', float('nan')):.1e} {row.get('error', '')}", flush=True)
            rows += got

    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "rows": rows}, indent=1))
    print("\n| shape | kind | variant | ms | x vs sdpa | err |\n| --- | --- | --- | ---: | ---: | ---: |")
    for shape in args.shapes.split(","):
        for kind in ("fwd", "bwd"):
            sel = sorted((r for r in rows if r["shape"] == shape and r["kind"] == kind and "ms" in r),
                         key=lambda r: r["ms"])
            for r in sel[:6]:
                print(f"| {shape} | {kind} | {r['variant']} | {r['ms']:.3f} | {r.get('x', 1.0):.2f} | {r['err']:.1e} |")
    bad = [r for r in rows if r.get("err", 0) > TOL]
    for r in bad:
        print(f"MISMATCH {r['shape']} {r['kind']} {r['variant']}: err {r['err']:.2e} > {TOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
