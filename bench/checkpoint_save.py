"""Checkpoint cost per save: blocking against --async-save, on CPU or GPU(s).

    python bench/checkpoint_save.py --smoke                                          # CPU self-test, tiny
    python bench/checkpoint_save.py --preset minicpm4-0.5b --out bench/results/checkpoint_save_05b.json
    python bench/checkpoint_save.py --preset minicpm4-8b --nproc 2 --tp 2 --saves 1 \\
        --extra "--micro-batch-size 2 --seq-length 4096 --grad-accum-steps 8" --out bench/results/checkpoint_save_8b_tp2.json

Runs `python -m engine pretrain` (torchrun --nproc-per-node N when --nproc > 1) once per mode, same
seed, data and steps: `none` (no checkpoint), `blocking` (--save-every K), `async` (--save-every K
--async-save). Each run takes N = 1 + saves x K steps, so its checkpoints at K, 2K, ... fall inside
the timed window: from the arrival of `[LOSS] step=1` to the arrival of `[LOSS] step=N`, on this
script's clock (start-up, the first step and the wait for the last save at exit are outside it).

Per mode (one line each in the table, everything in the JSON):
- `stall/ckpt`: (window - none's window) / saves: what a checkpoint costs training, including the
  slowdown of steps that overlap an asynchronous write (host memory bandwidth, disk, hashing cores);
- `outside/ckpt`: (window - the steps' own time_s) / saves: time the main thread spent between steps;
- the engine's `[CKPT]` numbers: `stall_s` per save (blocking: the whole save; async: the host copy
  into buffers pinned at start-up, plus any wait for the previous write) and `write_s` of each
  background write;
- `ckpt GB`: bytes of one checkpoint folder (all ranks), and the SHA-256 rate of this machine
  (one thread in memory; engine/checkpoint/checksums.py's threaded file hashing), which bounds the hashing cost.

Disk: each run keeps one checkpoint (--keep-last 1), but a save writes the next one beside the
previous: the 8B at TP 2 needs ~2 x 96 GB unless --saves 1 (then ~96 GB). --save-dir puts them on a
filesystem of your choice (default: a temporary folder under --tmp).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import launcher  # noqa: E402
from engine.checkpoint.checksums import hash_files, hash_threads  # noqa: E402 - the checkout's engine, after the path

__all__ = ["main"]

_LOSS = re.compile(r"^\[LOSS\] step=(\d+) global_loss=(\S+) grad_norm=(\S+) lr=(\S+) tokens=(\d+) time_s=(\S+) mfu=(\S+)")
_STALL = re.compile(r"^\[CKPT\] step=(\d+) .*stall_s=(\S+)")
_WRITE = re.compile(r"^\[CKPT\] step=(\d+) path=(\S+) write_s=(\S+)")
_BLOCKING_PATH = re.compile(r"^\[CKPT\] step=(\d+) path=(\S+) stall_s=")


def run(mode: str, args: argparse.Namespace, workdir: Path) -> dict:
    steps = 1 + args.saves * args.every
    save_dir = Path(args.save_dir) / mode if args.save_dir else workdir / mode / "ck"
    flags = ["--preset", args.preset, "--device", args.device, "--seed", "7", "--num-steps", str(steps),
             "--eval-samples", "0", "--no-save-final", "--warmup-steps", "0", "--keep-last", "1", "--tp", str(args.tp),
             "--run-dir", str(workdir / mode), "--save-dir", str(save_dir), *args.extra.split()]
    if mode != "none":
        flags += ["--save-every", str(args.every)]
    if mode == "async":
        flags.append("--async-save")
    cmd = [*launcher(args.nproc), "-m", "engine", "pretrain", *flags]
    env = dict(os.environ)
    if args.device == "cuda" and args.nproc > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # as bench/mfu.py: TP overlap needs one hardware queue
    print(f"[{mode}] {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    arrivals: dict[int, float] = {}
    lines = []
    for line in proc.stdout:
        now = time.perf_counter()
        lines.append(line.rstrip("\n"))
        m = _LOSS.match(line)
        if m:
            arrivals[int(m.group(1))] = now
    err = proc.stderr.read()
    proc.wait()
    result: dict = {"mode": mode, "cmd": cmd, "returncode": proc.returncode, "steps": steps}
    step_time = {int(m.group(1)): float(m.group(6)) for m in map(_LOSS.match, lines) if m}
    if proc.returncode != 0 or 1 not in arrivals or steps not in arrivals:
        result["error"] = ("\n".join(lines[-30:]) + "\n" + err[-4000:]).strip()
        return result
    window = arrivals[steps] - arrivals[1]
    inside = sum(step_time[s] for s in range(2, steps + 1))
    result.update({
        "window_s": window, "step_time_s": step_time,
        "median_step_s": statistics.median(step_time[s] for s in range(2, steps + 1)),
        "outside_steps_s": window - inside,
        "engine_stall_s": [float(m.group(2)) for m in map(_STALL.match, lines) if m],
        "async_write_s": [float(m.group(3)) for m in map(_WRITE.match, lines) if m],
    })
    published = [m.group(2) for m in map(_BLOCKING_PATH.match, lines) if m] + [m.group(2) for m in map(_WRITE.match, lines) if m]
    if published and Path(published[-1]).is_dir():
        folder = Path(published[-1])
        result["checkpoint_bytes"] = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        result["checkpoint_files"] = len(list(folder.iterdir()))
    shutil.rmtree(save_dir, ignore_errors=True)  # the next mode needs the disk
    return result


def hash_rates(workdir: Path, size_mb: int) -> dict:
    """SHA-256 GB/s: one thread over bytes in memory, and engine/checkpoint/checksums.py's hash_files (threads over
    64 MiB blocks) over a file in the page cache."""
    data = os.urandom(size_mb << 20)
    t0 = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    one = len(data) / (time.perf_counter() - t0) / 1e9
    path = workdir / "hash_probe.bin"
    path.write_bytes(data)
    t0 = time.perf_counter()
    hash_files(workdir, [path.name])
    threaded = len(data) / (time.perf_counter() - t0) / 1e9
    path.unlink()
    return {"sha256_gbps_one_thread": one, "hash_files_gbps": threaded, "hash_threads": hash_threads(),
            "probe_mb": size_mb}


def print_table(results: list[dict], saves: int, rates: dict) -> None:
    base = next((r for r in results if r["mode"] == "none" and "error" not in r), None)
    print(f"\n{'mode':<10}{'window s':>10}{'step s':>9}{'stall/ckpt':>12}{'outside/ckpt':>14}{'engine stall_s':>22}"
          f"{'async write_s':>20}{'ckpt GB':>9}")
    for r in results:
        if "error" in r:
            print(f"{r['mode']:<10}{'failed (exit ' + str(r['returncode']) + ')':>30}")
            continue
        stall = f"{(r['window_s'] - base['window_s']) / saves:.3f}" if base is not None and r["mode"] != "none" else "-"
        outside = f"{r['outside_steps_s'] / saves:.3f}" if r["mode"] != "none" else "-"
        engine = " ".join(f"{x:.2f}" for x in r["engine_stall_s"]) or "-"
        write = " ".join(f"{x:.2f}" for x in r["async_write_s"]) or "-"
        size = f"{r['checkpoint_bytes'] / 1e9:.2f}" if "checkpoint_bytes" in r else "-"
        print(f"{r['mode']:<10}{r['window_s']:>10.2f}{r['median_step_s']:>9.3f}{stall:>12}{outside:>14}{engine:>22}"
              f"{write:>20}{size:>9}")
    print(f"sha256: {rates['sha256_gbps_one_thread']:.2f} GB/s on one thread in memory, {rates['hash_files_gbps']:.2f} GB/s "
          f"with engine/checkpoint/checksums.py's {rates['hash_threads']} threads from the page cache (per rank; ranks hash in parallel)")
    print("stall/ckpt: (window - none's window) / saves; outside/ckpt: window minus the steps' own time_s, per save")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="minicpm4-0.5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--nproc", type=int, default=1, help="processes (torchrun when > 1)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--every", type=int, default=4, help="steps between checkpoints (K)")
    p.add_argument("--saves", type=int, default=2, help="checkpoints inside the timed window")
    p.add_argument("--modes", default="none,blocking,async", help="comma-separated subset of none,blocking,async")
    p.add_argument("--extra", default="", help="flags added to every run, e.g. '--micro-batch-size 2 --seq-length 4096'")
    p.add_argument("--save-dir", default="", help="where the checkpoints go (default: under --tmp)")
    p.add_argument("--tmp", default="", help="folder for run dirs (default: the system temp folder)")
    p.add_argument("--hash-probe-mb", type=int, default=1024, help="bytes hashed to measure the SHA-256 rate")
    p.add_argument("--smoke", action="store_true", help="CPU self-test: tiny preset, seq 64, K 2, 2 saves")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.device, args.every, args.saves, args.hash_probe_mb = "tiny", "cpu", 2, 2, 64
        args.extra = (args.extra + " --seq-length 64 --micro-batch-size 2").strip()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in ("none", "blocking", "async")]
    if bad:
        p.error(f"--modes: unknown mode(s) {bad}; use none, blocking, async")
    with tempfile.TemporaryDirectory(dir=args.tmp or None) as tmp:
        workdir = Path(tmp)
        rates = hash_rates(workdir, args.hash_probe_mb)
        results = [run(mode, args, workdir) for mode in modes]
    for r in results:
        if "error" in r:
            print(f"[{r['mode']}] FAILED (exit {r['returncode']}):\n{r['error']}", flush=True)
    print_table(results, args.saves, rates)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(out.name + ".tmp")
        tmp_out.write_text(json.dumps({"preset": args.preset, "device": args.device, "nproc": args.nproc, "tp": args.tp,
                                       "every": args.every, "saves": args.saves, "extra": args.extra,
                                       "hash": rates, "results": results}, indent=2))
        os.replace(tmp_out, out)
        print(f"wrote {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
