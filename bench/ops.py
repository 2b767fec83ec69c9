"""Microbenchmark every version of every hot op on one GPU: correctness, time, TFLOP/s, memory.

    python bench/ops.py --preset minicpm4-8b --tp 1 2 --out bench/results/ops.json

For each TP size the shapes are one rank's (engine/ops/workloads.py: TP = 2 halves the heads, the
FFN and the vocabulary shard; mbs x seq from the preset, 2 x 4096 tokens for minicpm4-8b). For
every (op, version), side by side in one process:

  correctness  fresh random inputs (a seed no timing run uses); forward and backward with random
               output gradients; every output and input gradient compared with the fp32 reference
               (the baseline run on fp32 copies of the same inputs) by ||x - ref|| / ||ref||.
               Tolerance TOL = 1e-2: bf16 operands land between 1e-3 and 1e-2 (METHOD.md).
  time         forward (grad mode on, as in training) and forward + backward, every version on the
               same --sets rotated input sets, two ways. Pipelined (the numbers the speedups use):
               --iters calls issued back to back between two device events, as a training step
               issues them (the host queues the next launches while the device works), time /
               calls, median of --reps such batches. Synchronous (`*_sync`, in the JSON and the
               table's last column): device events around one call alone, median of --iters; this
               adds each call's host-side launch latency (Python, planning, kernel launch), which a
               training step hides. Versions are timed in interleaved rounds (baseline batch,
               version batch, ..., again), so the clock and power drift of a long run (GEMM-heavy
               ops throttle an H200 by ~15%) reaches every version alike.
  rate         model TFLOP/s (engine/ops/workloads.op_flops: 3 LM-head GEMMs, attention bwd 2.5x
               fwd) or, for rmsnorm, GB/s of the fewest bytes the op must move.
  memory       peak bytes allocated during one forward + backward above what was allocated before.
  speedup      baseline time / version time, per op, TP and mode.

attention is benched twice: as the plain causal op, and as `attention+docs`, within synthetic packed
documents (engine/ops/workloads.synthetic_documents: exponential lengths of mean seq / 4), the
--document-mask path (baseline: SDPA with a block-diagonal mask; FA4 versions: the varlen kernels).
Its rate counts the whole window's causal FLOPs, an equivalent dense rate (--no-documents skips it).

gemm_output also gets `torch_naive`: the unfused torch path (bf16 GEMM -> fp32 logits -> torch
cross-entropy, autograd), the reference of the issue's targets (>= 1.3x, <= 1/4 of its memory).
At TP > 1 the versions run one rank's work without collectives (workloads.rank_callable).

rope is benched on q and k sliced out of one QKV projection, as the model calls it, and again as
`rope+docs` with positions restarting in each synthetic document (--reset-position-ids: quack's varlen
path); its rate is GB/s of the fewest bytes it must move (q and k read and written, forward and backward).

liger-kernel peers (bench/peers/liger.py), when liger imports (else the header line says why): `liger`
rows for rmsnorm (its fused add + RMSNorm), gemm_fc1 (torch GEMM + its SwiGLU kernel), gemm_output
(its fused linear cross-entropy; TP 1 only) and rope (liger_rotary_pos_emb; no documents), checked and
timed like every version.

JSON (every number) goes to --out; the table prints last.
"""

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import median_call_ms, rel_err  # noqa: E402
from bench.peers.liger import liger_candidates, liger_version  # noqa: E402
from engine.config import build_config  # noqa: E402
from engine.ops.dispatch import OP_NAMES, load_op, load_register  # noqa: E402
from engine.ops.workloads import call_op, grad_leaves, make_inputs, op_bytes, op_flops, op_shapes, rank_callable  # noqa: E402

__all__ = ["main", "torch_naive_output"]

TOL = 1e-2


def torch_naive_output(h, w, labels, *, vocab_start: int, vocab_size: int):
    """Unfused torch LM head + CE: bf16 GEMM, fp32 logits [n, V_local], torch CE (autograd)."""
    logits = F.linear(h, w).float()
    n_real = max(0, min(w.shape[0], vocab_size - vocab_start))
    if n_real < w.shape[0]:
        logits[:, n_real:] = float("-inf")
    if vocab_start == 0 and vocab_size <= w.shape[0]:  # one shard holds the whole vocabulary (TP = 1)
        return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    local = labels - vocab_start
    owned = (labels != -100) & (local >= 0) & (local < w.shape[0])
    lse = torch.logsumexp(logits, dim=-1)
    target = logits.gather(1, torch.where(owned, local, 0).unsqueeze(1)).squeeze(1)
    return torch.where(labels != -100, lse - torch.where(owned, target, 0.0), 0.0).sum()




def _fp32_copy(inputs: dict) -> dict:
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out[k] = v.detach().float().requires_grad_(v.requires_grad)
        else:
            out[k] = v
    return out


def _grad_outputs(outs: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device=outs[0].device).manual_seed(seed)
    return [torch.randn(o.shape, generator=g, device=o.device, dtype=torch.float32).to(o.dtype) if o.dim() else
            torch.ones((), device=o.device, dtype=o.dtype) for o in outs]


def _fwd_bwd(op, fn, inputs, shapes, gouts=None, seed=0):
    for t in grad_leaves(inputs).values():
        t.grad = None
    outs = call_op(op, fn, inputs, shapes)
    if gouts is None:
        gouts = _grad_outputs(outs, seed)
    torch.autograd.backward(outs, [g.to(o.dtype) for g, o in zip(gouts, outs)])
    return outs, {k: t.grad for k, t in grad_leaves(inputs).items()}, gouts


def check(op, fn, ref_fn, shapes, device, seed) -> dict:
    """Relative errors of outputs and grads of `fn` (bf16) vs `ref_fn` on fp32 copies."""
    inputs = make_inputs(op, shapes, device=device, dtype=torch.bfloat16, seed=seed)
    ref_inputs = _fp32_copy(inputs)
    ref_outs, ref_grads, gouts = _fwd_bwd(op, ref_fn, ref_inputs, shapes, seed=seed + 1)
    outs, grads, _ = _fwd_bwd(op, fn, inputs, shapes, gouts=gouts)
    errs = {f"out{i}": rel_err(o, r) for i, (o, r) in enumerate(zip(outs, ref_outs))}
    errs.update({f"d{k}": rel_err(grads[k], ref_grads[k]) for k in ref_grads})
    return errs




def _batch_ms(fn_once, sets, iters) -> float:
    """Per-call device time of `iters` back-to-back calls (no host sync between them)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(iters):
        fn_once(sets[i % len(sets)])
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def _interleaved(fns: dict, rounds: int, measure) -> dict:
    """Median over `rounds` of measure(fn, round); each round measures every candidate once, in turn, so
    clock and temperature drift during the run reach all of them alike."""
    samples: dict = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            samples[name].append(measure(fn, r))
    return {name: statistics.median(v) for name, v in samples.items()}


def gemm_floor_fc1(x, w):
    """Not gemm_fc1: the bare x @ w^T [.., 2f] (its backward: the two grad GEMMs). Times the three
    GEMMs every gemm_fc1 version must run, with no elementwise work: the ceiling of any speedup."""
    return F.linear(x, w)


def bench_op(op, candidates, ref_fn, shapes, device, args, label: str = "") -> list[dict]:
    """Rows for every (version, fn) of one op at one TP size: correctness, memory, then timings.

    All versions run on the same input sets and are timed in interleaved rounds (`_interleaved`).
    A version that fails to load or to run gets a row with `error`; the others still run. `label`
    names the rows' op (default: the op), e.g. attention+docs.
    """
    sets = [make_inputs(op, shapes, device=device, dtype=torch.bfloat16, seed=s) for s in range(args.sets)]
    rows, fwd, fwd_bwd = [], {}, {}
    for version, fn in candidates:
        row = {"op": label or op, "tp": shapes.tp, "version": version}
        rows.append(row)
        try:
            fn = fn or rank_callable(op, load_op(op, version), shapes)
            check_correctness = version != "gemm_floor"
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            row["errors"] = check(op, fn, ref_fn, shapes, device, seed=1000 + shapes.tp) if check_correctness else {}
            torch.cuda.synchronize()
            row["first_check_s"] = time.perf_counter() - t0  # includes compile / cache load on a cold process
            row["max_rel_err"] = max(row["errors"].values()) if row["errors"] else None
            row["ok"] = row["max_rel_err"] <= TOL if check_correctness else None
            gmap = {id(x): _grad_outputs(call_op(op, fn, x, shapes), 7 + i) for i, x in enumerate(sets)}
            fwd[version] = lambda x, fn=fn: call_op(op, fn, x, shapes)
            fwd_bwd[version] = lambda x, fn=fn, gmap=gmap: _fwd_bwd(op, fn, x, shapes, gouts=gmap[id(x)])
            for x in sets:  # warm: allocator, caches
                fwd_bwd[version](x)
            for x in sets:
                for t in grad_leaves(x).values():
                    t.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fwd_bwd[version](sets[0])
            torch.cuda.synchronize()
            row["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        except Exception as err:  # reported in the table and JSON; the other versions still run
            row.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-3000:])
            print(row["traceback"], file=sys.stderr)
            fwd.pop(version, None)
            fwd_bwd.pop(version, None)
            torch.cuda.empty_cache()
    by_version = {r["version"]: r for r in rows}
    for key, fns in (("fwd_ms", fwd), ("fwd_bwd_ms", fwd_bwd)):
        for name, ms in _interleaved(fns, args.reps, lambda f, r: _batch_ms(f, sets, args.iters)).items():
            by_version[name][key] = ms
        sync = _interleaved(fns, args.iters, lambda f, r: median_call_ms(f, [sets[r % len(sets)]], 1, warm=False))
        for name, ms in sync.items():
            by_version[name][f"{key[:-3]}_ms_sync"] = ms
    for row in rows:
        if "error" in row:
            continue
        for mode, key in (("fwd", "fwd_ms"), ("fwd_bwd", "fwd_bwd_ms")):
            flops = op_flops(op, shapes, backward=mode == "fwd_bwd")
            nbytes = op_bytes(op, shapes, backward=mode == "fwd_bwd")
            row[f"{mode}_tflops"] = flops / (row[key] * 1e-3) / 1e12 if flops else None
            row[f"{mode}_gbs"] = nbytes / (row[key] * 1e-3) / 1e9 if nbytes else None
    sets.clear()
    fwd.clear()
    fwd_bwd.clear()
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="minicpm4-8b")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ops", nargs="+", default=list(OP_NAMES), choices=list(OP_NAMES))
    parser.add_argument("--versions", nargs="*", default=None, help="only these versions (default: all registered)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7, help="pipelined batches of --iters calls (median)")
    parser.add_argument("--sets", type=int, default=3, help="input sets rotated through the timed calls")
    parser.add_argument("--documents", action=argparse.BooleanOptionalAction, default=True,
                        help="also bench attention within packed documents and rope restarting in them (+docs rows)")
    parser.add_argument("--liger", action=argparse.BooleanOptionalAction, default=True,
                        help="add liger-kernel's versions (rmsnorm, gemm_fc1, gemm_output, rope)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ops.json"))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    cfg = build_config({"preset": args.preset})
    rows = []
    meta = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "preset": args.preset,
            "argv": sys.argv, "tol": TOL}
    for lib in ("cutlass", "quack", "flash_attn"):
        try:
            mod = __import__(lib)
            meta[lib] = getattr(mod, "__version__", "?")
        except ImportError as err:
            meta[lib] = f"not importable: {err}"
    use_liger = False
    if args.liger:
        try:
            liger_candidates("rmsnorm")
            meta["liger-kernel"], use_liger = liger_version(), True
        except ImportError as err:
            meta["liger-kernel"] = f"not importable, no liger rows: {err}"
            print(f"liger-kernel: {meta['liger-kernel']}", flush=True)
    print(json.dumps(meta))
    for tp in args.tp:
        shapes = op_shapes(cfg, tp=tp)
        for op in args.ops:
            reg = load_register(op)
            baseline = load_op(op, "baseline")
            ref_fn = rank_callable(op, baseline, shapes)
            versions = [v for v in reg.versions if "cuda" in reg.versions[v].devices]
            if args.versions:
                versions = [v for v in versions if v in args.versions or v == "baseline"]
            candidates = [(v, None) for v in versions]
            if op == "gemm_output":
                candidates.append(("torch_naive", torch_naive_output))
            if op == "gemm_fc1":
                candidates.append(("gemm_floor", gemm_floor_fc1))
            if use_liger and not (op == "gemm_output" and tp > 1):
                candidates += liger_candidates(op)
            variants = [(shapes, "")]
            if op == "attention" and args.documents:
                variants.append((dataclasses.replace(shapes, documents=True), "attention+docs"))
            if op == "rope" and args.documents:
                variants.append((dataclasses.replace(shapes, reset_positions=True), "rope+docs"))
            for variant, label in variants:
                # liger's rope has no per-document positions
                here = [c for c in candidates if not (label == "rope+docs" and c[0] == "liger")]
                for row in bench_op(op, here, ref_fn, variant, device, args, label=label):
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
    for row in rows:
        if "error" in row:
            continue
        for ref_name in ("baseline", "torch_naive"):
            ref = next((r for r in rows if r["op"] == row["op"] and r["tp"] == row["tp"] and r["version"] == ref_name
                        and "error" not in r), None)
            if ref is not None:
                row[f"speedup_fwd_vs_{ref_name}"] = ref["fwd_ms"] / row["fwd_ms"]
                row[f"speedup_fwd_bwd_vs_{ref_name}"] = ref["fwd_bwd_ms"] / row["fwd_bwd_ms"]
                row[f"mem_ratio_vs_{ref_name}"] = row["peak_extra_gib"] / ref["peak_extra_gib"] if ref["peak_extra_gib"] else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    tmp.replace(out)
    print(f"\n{meta['device']}  preset {args.preset}  bf16, {args.iters} back-to-back calls over {args.sets} input sets "
          f"(median of {args.reps}); f+b sync: each call alone, median of {args.iters}; "
          f"err = max rel. error vs fp32 reference (tol {TOL}); x = baseline ms / version ms; rate TFLOP/s (rmsnorm, rope GB/s)")
    head = (f"{'op':<15}{'tp':>3} {'version':<12}{'fwd ms':>8}{'f+b ms':>8}{'rate f+b':>9}{'x fwd':>7}{'x f+b':>7}"
            f"{'x naive':>8}{'peak GiB':>9}{'err':>9}{'f+b sync':>9} ok")
    print(head)
    for r in rows:
        if "error" in r:
            print(f"{r['op']:<15}{r['tp']:>3} {r['version']:<12} ERROR {r['error'][:90]}")
            continue
        rate = r["fwd_bwd_tflops"] or r["fwd_bwd_gbs"] or 0.0
        err = f"{r['max_rel_err']:>9.1e}" if r["max_rel_err"] is not None else f"{'-':>9}"
        verdict = {True: "ok", False: "FAIL", None: "(timing floor, not the op)"}[r["ok"]]
        naive = r.get("speedup_fwd_bwd_vs_torch_naive")
        print(f"{r['op']:<15}{r['tp']:>3} {r['version']:<12}{r['fwd_ms']:>8.3f}{r['fwd_bwd_ms']:>8.3f}{rate:>9.1f}"
              f"{r.get('speedup_fwd_vs_baseline', 0):>7.2f}{r.get('speedup_fwd_bwd_vs_baseline', 0):>7.2f}"
              f"{(naive if naive else 0):>8.2f}{r['peak_extra_gib']:>9.2f}{err}{r['fwd_bwd_ms_sync']:>9.3f} {verdict}")
    return 0 if all("error" not in r and r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
