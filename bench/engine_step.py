"""Benchmark whole engine training steps: run `python -m engine pretrain` variants, parse [LOSS] lines.

Each variant is a real training run (subprocess) of --steps steps (evaluation off unless its flags add
`--eval-samples N`; the [EVAL] lines are then kept too); the first --skip steps (compile,
allocator warm-up) are dropped and the median / spread of the rest reported. Throughput and MFU are
recomputed here from tokens and time_s (same FLOP count as engine/flops.py, printed by the run).
Variants run one after another in the same job on the same GPU, so their ratios are meaningful.

    python bench/engine_step.py --preset minicpm4-0.5b --steps 50 --out bench/results/engine_step.json \
        --variant default= --variant ckpt=--activation-checkpointing \
        --variant baseline="--op-attention baseline --op-rmsnorm baseline --op-gemm-fc1 baseline --op-gemm-output baseline"

(`default=`: the ops' CUDA defaults, the CuTeDSL versions; the last variant asks for plain torch.)

Prints a table last; writes JSON with every step's numbers.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main", "run_variant"]

REPO = Path(__file__).resolve().parents[1]
_LOSS = re.compile(r"^\[LOSS\] step=(\d+) global_loss=(\S+) grad_norm=(\S+) lr=(\S+) tokens=(\d+) time_s=(\S+) mfu=(\S+)")
_EVAL = re.compile(r"^\[EVAL\] step=(\d+) val_loss=(\S+) val_bpb=(\S+)")
_MODEL = re.compile(r"flops_per_token=(\S+)")
_DEVICE = re.compile(r"device=(.+?) host=")


def run_variant(name: str, extra: list[str], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "engine", "pretrain", "--preset", args.preset, "--device", args.device,
               "--num-steps", str(args.steps), "--eval-samples", "0", "--no-save-final", "--run-dir", tmp,
               "--warmup-steps", "0", *args.common.split(), *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        metrics = Path(tmp) / "metrics.jsonl"
        lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        mem = [line["peak_mem_gib"] for line in lines if line.get("peak_mem_gib") is not None]  # step lines, not evals
    steps = [m.groups() for m in map(_LOSS.match, proc.stdout.splitlines()) if m]
    flops = _MODEL.search(proc.stdout)
    device = _DEVICE.search(proc.stdout)
    result = {"name": name, "cmd": cmd, "returncode": proc.returncode, "wall_s": wall,
              "device": device.group(1) if device else "?", "steps": [
                  {"step": int(s), "loss": float(l), "grad_norm": float(g), "tokens": int(t), "time_s": float(dt),
                   "mfu_reported": float(m)} for s, l, g, _, t, dt, m in steps],
              # evaluations, when a variant's flags ask for them (--eval-samples N after the default 0)
              "evals": [{"step": int(s), "val_loss": float(l), "val_bpb": float(b)}
                        for s, l, b in (m.groups() for m in map(_EVAL.match, proc.stdout.splitlines()) if m)]}
    if proc.returncode != 0 or not steps:
        result["error"] = proc.stderr[-4000:]
        return result
    steady = result["steps"][args.skip:] or result["steps"]
    times = [s["time_s"] for s in steady]
    tokens = steady[0]["tokens"]
    fpt = float(flops.group(1))
    med = statistics.median(times)
    result.update({
        "tokens_per_step": tokens, "flops_per_token": fpt, "median_step_s": med,
        "step_s_spread": (min(times), max(times)), "tokens_per_s": tokens / med,
        "mfu": fpt * tokens / (med * args.num_devices * args.peak_tflops * 1e12),
        "final_loss": result["steps"][-1]["loss"],
        "peak_mem_gib": float(mem[-1]) if mem else None,
    })
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="minicpm4-0.5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--skip", type=int, default=5, help="steps dropped as warm-up")
    p.add_argument("--num-devices", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--common", default="", help="flags added to every variant")
    p.add_argument("--variant", action="append", default=[], help="NAME=FLAGS (FLAGS may be empty)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    variants = [v.split("=", 1) for v in (args.variant or ["baseline="])]
    results = []
    for name, flags in variants:
        print(f"running {name}: {flags}", flush=True)
        results.append(run_variant(name, flags.split(), args))
        if "error" in results[-1]:
            print(f"  FAILED (exit {results[-1]['returncode']}):\n{results[-1]['error']}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"preset": args.preset, "steps": args.steps, "skip": args.skip,
                                              "results": results}, indent=2))
    base = next((r for r in results if "error" not in r), None)
    print(f"\n{args.preset}, {args.steps} steps (first {args.skip} dropped), device {base['device'] if base else '?'}")
    print(f"{'variant':<16}{'step s':>10}{'spread':>18}{'tok/s':>12}{'MFU':>8}{'vs first':>10}{'mem GiB':>9}{'loss':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['name']:<16}{'failed':>10}")
            continue
        lo, hi = r["step_s_spread"]
        ratio = base["median_step_s"] / r["median_step_s"]
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "-"
        print(f"{r['name']:<16}{r['median_step_s']:>10.4f}{f'{lo:.4f}-{hi:.4f}':>18}{r['tokens_per_s']:>12.0f}"
              f"{r['mfu']:>8.3f}{ratio:>10.3f}{mem:>9}{r['final_loss']:>10.4f}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
