"""Check and time our CuTeDSL RMSNorm (engine/ops/rmsnorm/cute_rmsnorm.py) against baseline and quack.

    source .gpu/b/env.sh && python3 bench/rmsnorm_gpu_check.py --out $OUT/rmsnorm.json

For n in (1024, 4096) (MiniCPM4-0.5B, -8B), M = --rows (8192) rows of bf16, residual_scale in
(None = plain norm, 1.0, 0.22):

correctness (the `cute` version; exit 1 on any failure)
  * every output and every input gradient (random output gradients) against the fp32 reference,
    the baseline run on fp32 copies of the same bf16 inputs, by ||x - ref|| / ||ref|| <= 1e-2.
    Why 1e-2: each bf16 rounding is <= 2^-9 relative, so a bf16 result carries ~1e-3 of relative
    error and sums over rows (dweight) average many of them; 1e-2 is the repository-wide bf16
    bound (tests/ops/test_ops_versions_gpu.py) and leaves room for fp32 reduction-order noise.
    Each error must also be <= 2 x the bf16 baseline's own error + 1e-3.
  * s bit-equal to the bf16 baseline's s (same fp32 operations in the same order, one rounding),
    and y within one bf16 ulp of the baseline's y everywhere (only rstd's fp32 reduction order and
    rsqrt differ, which can flip the final rounding, never more).
  * residual form with only y used (ds_out = None) and only s used (dy = None): gradients against
    the fp32 reference; the weight gets no (or a zero) gradient when y is unused.
  * determinism: the backward run twice on the same inputs gives bit-identical gradients.

time (every registered CUDA version present: baseline, quack, cute)
  median of --iters (20) calls after warmup, device events, with the queue held behind a GPU sleep
  so the Python launch cost of a call is not measured and an L2 flush (256 MiB) before each call:
  forward (grad mode on), backward alone (autograd.grad on a retained graph), forward + backward.
  Effective bandwidth: the fewest bytes each pass must move (inputs read once, outputs written once).
  Also the bare kernels of `cute` (no autograd): forward, and backward at 16 (default) and 8
  elements per thread (a compile-time variant: 2x the resident threads, 64 registers); the 8-element
  variant's gradients must agree with the default's (rel. <= 2e-3: only reduction order differs).

A table prints last; every number goes to --out as JSON (written atomically).
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.ops.dispatch import load_op, load_register  # noqa: E402

__all__ = ["main"]

REL_TOL = 1e-2
EPS = 1e-6
BF16_ULP = 2.0 ** -7  # one bf16 ulp is at most this fraction of the value's magnitude


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _inputs(m: int, n: int, scale, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = {"x": torch.randn(m, n, generator=g, device="cuda").bfloat16(),
         "weight": (1 + 0.1 * torch.randn(n, generator=g, device="cuda")).bfloat16()}
    if scale is not None:
        x["residual"] = (3 * torch.randn(m, n, generator=g, device="cuda")).bfloat16()
    return x


def _leaves(inputs: dict, fp32: bool = False) -> dict:
    return {k: (v.detach().float() if fp32 else v.detach().clone()).requires_grad_() for k, v in inputs.items()}


def _call(fn, x: dict, scale, keep: str = "both") -> list[torch.Tensor]:
    if scale is None:
        return [fn(x["x"], x["weight"], eps=EPS)]
    y, s = fn(x["x"], x["weight"], eps=EPS, residual=x["residual"], residual_scale=scale)
    return {"both": [y, s], "y": [y], "s": [s]}[keep]


def _fwd_bwd(fn, inputs: dict, scale, gouts: list[torch.Tensor], *, fp32=False, keep="both"):
    leaves = _leaves(inputs, fp32)
    outs = _call(fn, leaves, scale, keep)
    grads = torch.autograd.grad(outs, list(leaves.values()), [g.to(o.dtype) for g, o in zip(gouts, outs)],
                                allow_unused=True)
    grads = {k: (gr if gr is not None else torch.zeros_like(v)) for (k, v), gr in zip(leaves.items(), grads)}
    return [o.detach() for o in outs], grads


def check(fn, baseline, m: int, n: int, scale) -> list[str]:
    """Failures of `fn` (the cute version) on one configuration; [] when it passes."""
    failures = []
    inputs = _inputs(m, n, scale, seed=n + (0 if scale is None else int(scale * 100) + 1))
    g = torch.Generator(device="cuda").manual_seed(7)
    n_out = 1 if scale is None else 2
    gouts = [torch.randn(m, n, generator=g, device="cuda") for _ in range(n_out)]
    keeps = ["both"] if scale is None else ["both", "y", "s"]
    for keep in keeps:
        sel = gouts if keep == "both" else [gouts[0 if keep == "y" else 1]]
        ref_out, ref_grads = _fwd_bwd(baseline, inputs, scale, sel, fp32=True, keep=keep)
        base_out, base_grads = _fwd_bwd(baseline, inputs, scale, sel, keep=keep)
        out, grads = _fwd_bwd(fn, inputs, scale, sel, keep=keep)
        names = {"both": ["y", "s"], "y": ["y"], "s": ["s"]}[keep] if scale is not None else ["y"]
        pairs = [(f"out {nm}", out[i], base_out[i], ref_out[i]) for i, nm in enumerate(names)]
        pairs += [(f"grad {k}", grads[k], base_grads[k], ref_grads[k]) for k in ref_grads]
        for what, got, base, ref in pairs:
            if got.dtype != base.dtype or got.shape != base.shape:
                failures.append(f"[{keep}] {what}: {got.dtype} {tuple(got.shape)} vs baseline {base.dtype} {tuple(base.shape)}")
                continue
            err, base_err = _rel(got, ref), _rel(base, ref)
            if not (err <= REL_TOL and err <= 2 * base_err + 1e-3):
                failures.append(f"[{keep}] {what}: rel. error {err:.2e} vs fp32 (baseline bf16 {base_err:.2e})")
        if keep == "both":
            if scale is not None and not torch.equal(out[1], base_out[1]):
                diff = (out[1] != base_out[1]).sum().item()
                failures.append(f"s differs from the baseline's in {diff} of {out[1].numel()} elements (must be bit-equal)")
            y, yb = out[0].float(), base_out[0].float()
            bad = ((y - yb).abs() > BF16_ULP * torch.maximum(y.abs(), yb.abs())).sum().item()
            if bad:
                failures.append(f"y differs from the baseline's by more than one bf16 ulp in {bad} elements")
            _, again = _fwd_bwd(fn, inputs, scale, sel)
            for k in grads:
                if not torch.equal(grads[k], again[k]):
                    failures.append(f"grad {k} differs between two identical backward calls (not deterministic)")
    return failures


def _bytes(m: int, n: int, residual: bool) -> dict:
    e = 2 * m * n  # one bf16 [m, n] tensor
    fwd = (4 if residual else 2) * e + 4 * m  # x, (residual), y, (s); rstd
    bwd = (5 if residual else 3) * e + 4 * m  # s|x, dy, (ds_out); (dres), dx; rstd (dweight: n floats)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}


class _Timer:
    def __init__(self):
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, iters: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            self.flush.zero_()
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time: the call below is queued before it starts
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times)


def time_version(fn, timer: _Timer, m: int, n: int, scale, iters: int) -> dict:
    inputs = _inputs(m, n, scale, seed=1234)
    leaves = _leaves(inputs)
    params = list(leaves.values())
    gouts = [torch.randn(m, n, device="cuda").bfloat16() for _ in range(1 if scale is None else 2)]

    def fwd():
        return _call(fn, leaves, scale)

    outs = fwd()

    def bwd():
        torch.autograd.grad(outs, params, gouts, retain_graph=True)

    def fwd_bwd():
        torch.autograd.grad(fwd(), params, gouts)

    return {"fwd_ms": timer(fwd, iters), "bwd_ms": timer(bwd, iters), "fwd_bwd_ms": timer(fwd_bwd, iters)}


def time_kernels(timer: _Timer, m: int, n: int, scale, iters: int) -> tuple[dict, list[str]]:
    """Bare cute kernels: forward, backward (elems 16 and 8); and the variant's agreement."""
    from engine.ops.rmsnorm import cute_rmsnorm as k

    inputs = _inputs(m, n, scale, seed=99)
    x, w, r = inputs["x"], inputs["weight"], inputs.get("residual")
    s_scale = 1.0 if scale is None else scale
    dy = torch.randn(m, n, device="cuda").bfloat16()
    dso = torch.randn(m, n, device="cuda").bfloat16() if r is not None else None
    y, s, rstd = k.rmsnorm_fwd(x, w, EPS, r, s_scale)
    saved = s if s is not None else x
    out = {"fwd_ms": timer(lambda: k.rmsnorm_fwd(x, w, EPS, r, s_scale), iters)}
    grads, failures = {}, []
    for elems in (16, 8):
        def bwd(elems=elems):
            return k.rmsnorm_bwd(saved, w, rstd, dy, dso, x_dtype=x.dtype, has_residual=r is not None,
                                 residual_scale=s_scale, elems=elems)
        grads[elems] = bwd()
        out[f"bwd_e{elems}_ms"] = timer(bwd, iters)
    for name, a, b in zip(("dx", "dresidual", "dweight"), grads[16], grads[8]):
        if a is not None and _rel(b, a) > 2e-3:
            failures.append(f"bwd elems=8 {name} differs from elems=16 by rel. {_rel(b, a):.2e}")
    return out, failures


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("rmsnorm_gpu_check: needs CUDA", file=sys.stderr)
        return 2
    baseline = load_op("rmsnorm", "baseline")
    cute = load_op("rmsnorm", "cute")
    versions = {"baseline": baseline, "cute": cute}
    errors = {}
    for name, spec in load_register("rmsnorm").versions.items():
        if name not in versions and "cuda" in spec.devices:
            try:
                versions[name] = load_op("rmsnorm", name)
            except Exception as err:  # reported in the table and JSON; the check of cute goes on
                errors[name] = f"{type(err).__name__}: {err}"
    timer = _Timer()
    m = args.rows
    results, rows, ok = [], [], True
    for n in (1024, 4096):
        for scale in (None, 1.0, 0.22):
            tag = f"{m}x{n} " + ("plain" if scale is None else f"res*{scale}")
            try:
                failures = check(cute, baseline, m, n, scale)
            except Exception:  # a crash is a failure of the check, reported with its traceback
                failures = [f"crashed:\n{traceback.format_exc()}"]
            ok &= not failures
            for f in failures:
                print(f"FAIL {tag}: {f}", flush=True)
            nbytes = _bytes(m, n, scale is not None)
            entry = {"m": m, "n": n, "residual_scale": scale, "failures": failures, "bytes": nbytes, "versions": {}}
            for vname, fn in versions.items():
                try:
                    t = time_version(fn, timer, m, n, scale, args.iters)
                except Exception as err:  # e.g. a library version without this shape: recorded, not fatal
                    entry["versions"][vname] = {"error": f"{type(err).__name__}: {err}"}
                    continue
                t.update({f"{k}_tbps": nbytes[k] / (t[f"{k}_ms"] * 1e-3) / 1e12 for k in ("fwd", "bwd", "fwd_bwd")})
                entry["versions"][vname] = t
            try:
                kt, kfail = time_kernels(timer, m, n, scale, args.iters)
                kt.update({"fwd_tbps": nbytes["fwd"] / (kt["fwd_ms"] * 1e-3) / 1e12,
                           "bwd_e16_tbps": nbytes["bwd"] / (kt["bwd_e16_ms"] * 1e-3) / 1e12,
                           "bwd_e8_tbps": nbytes["bwd"] / (kt["bwd_e8_ms"] * 1e-3) / 1e12})
            except Exception:  # a crash is a failure of the check, reported with its traceback
                kt, kfail = {}, [f"bare kernels crashed:\n{traceback.format_exc()}"]
            for f in kfail:
                print(f"FAIL {tag}: {f}", flush=True)
            ok &= not kfail
            entry["failures"] += kfail
            entry["kernels"] = kt
            base_t = entry["versions"].get("baseline", {})
            for vname, t in entry["versions"].items():
                if "error" in t:
                    rows.append(f"{tag:<22} {vname:<9} error: {t['error'][:80]}")
                    continue
                speed = base_t.get("fwd_bwd_ms", math.nan) / t["fwd_bwd_ms"]
                rows.append(f"{tag:<22} {vname:<9} {t['fwd_ms']:8.3f} {t['fwd_tbps']:6.2f} {t['bwd_ms']:8.3f} "
                            f"{t['bwd_tbps']:6.2f} {t['fwd_bwd_ms']:8.3f} {speed:6.2f}x")
            if kt:
                rows.append(f"{tag:<22} {'kernels':<9} {kt['fwd_ms']:8.3f} {kt['fwd_tbps']:6.2f} {kt['bwd_e16_ms']:8.3f} "
                            f"{kt['bwd_e16_tbps']:6.2f}   (bwd 8 elems/thread: {kt['bwd_e8_ms']:.3f} ms, "
                            f"{kt['bwd_e8_tbps']:.2f} TB/s)")
            results.append(entry)
    device = torch.cuda.get_device_name()
    _write_json(args.out, {"device": device, "torch": torch.__version__, "rel_tol": REL_TOL, "ok": ok,
                           "load_errors": errors, "results": results})
    print(f"\n{device}, bf16, median of {args.iters}; TB/s = fewest bytes / time")
    print(f"{'config':<22} {'version':<9} {'fwd ms':>8} {'TB/s':>6} {'bwd ms':>8} {'TB/s':>6} {'f+b ms':>8} {'vs base':>7}")
    print("\n".join(rows))
    for name, err in errors.items():
        print(f"{name}: not loaded ({err})")
    print("\nPASS: cute matches baseline / fp32 on every output and gradient" if ok else "\nFAIL (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
