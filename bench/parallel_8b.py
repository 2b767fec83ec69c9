"""Tensor parallelism on two GPUs: MiniCPM4-8B at TP 2, and TP 2 against TP 1 on minicpm4-0.5b.

    python bench/parallel_8b.py --out bench/results/parallel_8b_h200x2.json          # 2 GPUs
    python bench/parallel_8b.py --smoke                                             # CPU self-test

Runs, one after another, each a real `python -m engine pretrain` (torchrun for TP 2):
1. `8b-tp2`: torchrun --nproc-per-node 2 -m engine pretrain --preset minicpm4-8b --tp 2
   --micro-batch-size 2 --seq-length 4096 --grad-accum-steps 8 --num-steps 10 (bf16, embedded
   corpus, byte tokenizer; the vocabulary is the preset's, padded to 73472);
   with --ab also `8b-tp2-no-overlap` (--no-tp-comm-overlap, to measure the backward overlap) and
   `8b-tp2-sp` (--sequence-parallel). If a run fails out of memory it is repeated once with
   --activation-checkpointing (named `...+ac`): by our estimate the fp32 masters, grads and moments
   take ~72 GiB per GPU at TP 2 and the saved activations of mbs 2 x 4096 another ~60 GiB;
2. `05b-tp1` and `05b-tp2`: minicpm4-0.5b for --small-steps steps, same seed and data, one GPU
   against two; the loss difference per step is bf16 rounding of a differently ordered sum
   (expected ~1e-3 relative, growing slowly), not a bug unless it grows to ~1e-1.

Per run: median step time (first --skip steps dropped), tokens/s, MFU (engine/flops.py count: 6 x
matmul params incl. LM head + 6 x L x h x s per token, against --peak-tflops per GPU), peak memory:
`alloc` = torch.cuda.max_memory_allocated of rank 0 (from metrics.jsonl) and `used` = the largest
nvidia-smi memory.used seen on each GPU while the run was going (includes the CUDA context and NCCL
buffers). Prints a table last and writes every step's numbers as JSON (--out).

CUDA_DEVICE_MAX_CONNECTIONS=1 is set for the runs (--max-connections 0 leaves it unset), as Megatron
requires for TP overlap: with one hardware queue the NCCL kernel launched before a GEMM is
scheduled before it, so the collective really runs beside the GEMM.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
_LOSS = re.compile(r"^\[LOSS\] step=(\d+) global_loss=(\S+) grad_norm=(\S+) lr=(\S+) tokens=(\d+) time_s=(\S+) mfu=(\S+)")
_FPT = re.compile(r"flops_per_token=(\S+)")
_DEVICE = re.compile(r"device=(.+?) host=")


class GpuMemoryPoller:
    """Largest nvidia-smi memory.used (MiB) per GPU while running; empty without nvidia-smi."""

    def __init__(self, interval_ms: int = 500):
        self.peak: dict[int, int] = {}
        self._proc = None
        self._thread = None
        exe = shutil.which("nvidia-smi")
        if exe:
            self._proc = subprocess.Popen([exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                           f"-lms={interval_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                index, used = int(parts[0]), int(parts[1])
                self.peak[index] = max(self.peak.get(index, 0), used)

    def stop(self) -> dict[int, float]:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._thread.join(timeout=10)
        return {i: mib / 1024 for i, mib in sorted(self.peak.items())}


def run(name: str, nproc: int, flags: list[str], args: argparse.Namespace) -> dict:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
                if nproc > 1 else [sys.executable])
    env = dict(os.environ)
    if args.max_connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(args.max_connections)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*launcher, "-m", "engine", "pretrain", "--device", args.device, "--eval-samples", "0", "--no-save-final",
               "--warmup-steps", "0", "--run-dir", tmp, *flags]
        print(f"[{name}] {' '.join(cmd)}", flush=True)
        poller = GpuMemoryPoller()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        used = poller.stop()
        metrics = Path(tmp) / "metrics.jsonl"
        records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [m.groups() for m in map(_LOSS.match, proc.stdout.splitlines()) if m]
    result = {"name": name, "cmd": cmd, "nproc": nproc, "returncode": proc.returncode, "wall_s": wall,
              "device": (_DEVICE.search(proc.stdout) or [None, "?"])[1],
              "steps": [{"step": int(s), "loss": float(l), "grad_norm": float(g), "tokens": int(t), "time_s": float(dt)}
                        for s, l, g, _, t, dt, _ in steps],
              "peak_alloc_gib_rank0": max((r.get("peak_mem_gib", 0.0) for r in records if r.get("kind") == "loss"),
                                          default=None),
              "nvidia_smi_used_gib": used}
    if proc.returncode != 0 or not steps:
        result["error"] = (proc.stdout[-2000:] + "\n" + proc.stderr[-6000:]).strip()
        return result
    steady = result["steps"][args.skip:] or result["steps"]
    med = statistics.median(s["time_s"] for s in steady)
    tokens = steady[0]["tokens"]
    fpt = float(_FPT.search(proc.stdout).group(1))
    result.update({"median_step_s": med, "tokens_per_step": tokens, "tokens_per_s": tokens / med,
                   "flops_per_token": fpt, "mfu": fpt * tokens / (med * nproc * args.peak_tflops * 1e12)})
    return result


def run_or_retry(name: str, nproc: int, flags: list[str], args: argparse.Namespace) -> dict:
    result = run(name, nproc, flags, args)
    oom = "out of memory" in result.get("error", "").lower()
    if oom and not args.no_ac_retry and "--activation-checkpointing" not in flags:
        print(f"[{name}] out of memory; repeating with --activation-checkpointing", flush=True)
        retry = run(name + "+ac", nproc, flags + ["--activation-checkpointing"], args)
        retry["oom_without_ac"] = result
        return retry
    return result


def loss_diff(a: dict, b: dict) -> dict:
    pairs = [(x["loss"], y["loss"]) for x, y in zip(a.get("steps", []), b.get("steps", []))]
    if not pairs:
        return {}
    return {"max_abs": max(abs(x - y) for x, y in pairs), "max_rel": max(abs(x - y) / abs(y) for x, y in pairs),
            "per_step": [x - y for x, y in pairs]}


def print_table(results: list[dict], diffs: dict[str, dict]) -> None:
    print(f"\n{'run':<20}{'GPUs':>5}{'step s':>9}{'tok/s':>10}{'MFU':>7}{'alloc GiB r0':>13}"
          f"{'used GiB/GPU':>22}{'final loss':>12}{'loss diff':>12}")
    for r in results:
        used = " ".join(f"{v:.1f}" for v in r["nvidia_smi_used_gib"].values()) or "-"
        alloc = f"{r['peak_alloc_gib_rank0']:.1f}" if r.get("peak_alloc_gib_rank0") is not None else "-"
        diff = diffs.get(r["name"], {})
        diff_text = f"{diff['max_rel']:.2e}" if diff else "-"
        if "error" in r:
            print(f"{r['name']:<20}{r['nproc']:>5}{'failed (exit ' + str(r['returncode']) + ')':>26}")
            continue
        print(f"{r['name']:<20}{r['nproc']:>5}{r['median_step_s']:>9.3f}{r['tokens_per_s']:>10.0f}{r['mfu']:>7.3f}"
              f"{alloc:>13}{used:>22}{r['steps'][-1]['loss']:>12.4f}{diff_text:>12}")
    print("MFU: 6 x matmul params (incl. LM head) + 6 x L x h x s per token, engine/flops.py; "
          "loss diff: max relative |TP2 - TP1| over steps")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="8B steps")
    p.add_argument("--small-steps", type=int, default=5, help="minicpm4-0.5b steps for the TP 2 vs TP 1 comparison")
    p.add_argument("--skip", type=int, default=2, help="steps dropped as warm-up from the timing")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--max-connections", type=int, default=1, help="CUDA_DEVICE_MAX_CONNECTIONS for the runs (0: unset)")
    p.add_argument("--ab", action="store_true", help="also run 8B TP 2 with --no-tp-comm-overlap and with --sequence-parallel")
    p.add_argument("--no-ac-retry", action="store_true", help="do not repeat an out-of-memory run with activation checkpointing")
    p.add_argument("--extra", default="", help="flags added to every run, e.g. '--activation-checkpointing'")
    p.add_argument("--smoke", action="store_true", help="CPU self-test of this script: tiny preset, gloo, 2 steps")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    extra = args.extra.split()
    if args.smoke:
        args.device, args.max_connections = "cpu", 0
        big = ["--preset", "tiny", "--seq-length", "64", "--micro-batch-size", "2", "--grad-accum-steps", "2"]
        small = ["--preset", "tiny", "--seq-length", "64", "--micro-batch-size", "2"]
        args.steps = args.small_steps = 3
        args.skip = 1
    else:
        args.device = "cuda"
        big = ["--preset", "minicpm4-8b", "--micro-batch-size", "2", "--seq-length", "4096", "--grad-accum-steps", "8"]
        small = ["--preset", "minicpm4-0.5b"]
    big += ["--num-steps", str(args.steps), *extra]
    small += ["--num-steps", str(args.small_steps), *extra]
    results = [run_or_retry("8b-tp2" if not args.smoke else "tiny-tp2", 2, big + ["--tp", "2"], args)]
    if args.ab:
        results.append(run_or_retry("8b-tp2-no-overlap", 2, big + ["--tp", "2", "--no-tp-comm-overlap"], args))
        results.append(run_or_retry("8b-tp2-sp", 2, big + ["--tp", "2", "--sequence-parallel"], args))
    tp1 = run("05b-tp1", 1, small, args)
    tp2 = run("05b-tp2", 2, small + ["--tp", "2"], args)
    results += [tp1, tp2]
    diffs = {"05b-tp2": loss_diff(tp2, tp1)}
    for r in results:
        if "error" in r:
            print(f"[{r['name']}] FAILED (exit {r['returncode']}):\n{r['error']}", flush=True)
    print_table(results, diffs)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps({"results": results, "loss_diff_05b_tp2_vs_tp1": diffs["05b-tp2"],
                                   "max_connections": args.max_connections, "skip": args.skip}, indent=2))
        os.replace(tmp, out)
        print(f"wrote {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
