"""MFU of whole training steps: the engine and its peers, one after another in one job on the same GPUs.

    python bench/mfu.py --common "--preset minicpm4-8b --num-layers 4 --micro-batch-size 2 --seq-length 4096 \
        --grad-accum-steps 8" --steps 8 --warmup 3 --peer torch-compile --peer torchtitan --peer megatron-core \
        --out bench/results/mfu_8b4l_h200.json
    python bench/mfu.py --common "--preset minicpm4-8b --tp 2 ..." --peer megatron-core        # TP 2 (torchrun)
    python bench/mfu.py --common "--preset minicpm4-0.5b" --variant tp1= --variant tp2="--tp 2"   # TP 2 vs TP 1
    python bench/mfu.py --nproc 4 --common "--preset minicpm4-8b --global-batch-size 16 ..." \
        --variant zero1-dp4= --variant fsdp4="--fsdp" --variant tp2-fsdp2="--tp 2 --fsdp"      # 4 GPUs: TP x DP
    python bench/mfu.py --nproc 4 --common "--preset minicpm4-8b --global-batch-size 16 ..." --variant dp4-zero1= \
        --peer torchtitan:dp=4,ac=selective --peer megatron-core:tp=2,dp=2,ac=selective,mbs=1  # peers at their layouts
    python bench/mfu.py --common "--preset minicpm4-8b --num-layers 4" --sweep --seqs 1024 2048 4096 8192 16384 \
        --mbs 1 2 --png docs/img/mfu_sweep.png                                                    # sweep
    python bench/mfu.py --plot sweep_mbs1.json sweep_mbs2.json --png docs/img/mfu_sweep_h200.png    # re-draw

Each engine variant is a real `python -m engine pretrain` (torchrun when the layout has more than one
process: --tp N runs on N GPUs, --nproc N on N GPUs, DP = N / TP) of warmup + steps optimizer steps; the first --warmup steps (compile,
autotuning, allocator) are dropped and the median of the rest reported. The op versions a run used come
from its header (`[RUN] ops ...`), the per-step time and peak allocated memory (rank 0) from its
metrics.jsonl; nvidia-smi is polled while it runs (bench/common.py GpuPoller): memory.used per GPU, and the
median SM clock (MHz column), which says whether rows ran at the same clock, and the energy per token (mJ/tok:
busy power over tokens/s), which orders rows that all ran at the power limit.

Peers (--peer NAME[:LAYOUT], each variant in its own process so one's memory and compile caches do not touch
the next): `torch-compile` (two variants: `bf16` weights without fp32 master, and `amp`, fp32 weights +
bf16 autocast; one GPU; bench/peers/compiled.py), `torchao-fp8` (the same loop on bf16 weights with torchao's
float8 training linears, variants `tensorwise` and `rowwise`: the bar for --fp8; one GPU), `torchtitan` (FSDP2 + TP; bench/peers/titan.py),
`megatron-core` (distributed optimizer + TP/SP; bench/peers/megatron.py). Each runs at a layout of its own, not
the engine variant's: LAYOUT is comma-separated key=value pairs, tp, dp, sp (on|off), ac (none|selective|full),
compile (on|off), mbs, async_tp (on|off, torchtitan), e.g. `--peer torchtitan:dp=4,ac=selective --peer megatron-core:tp=2,dp=2,ac=selective`
(bench/peers/layout.py has the keys and their defaults: the engine's --tp and --micro-batch-size, dp = GPUs / tp).
Every peer runs on the job's GPUs (tp x dp = --nproc, else the engine's --tp) and trains its global batch (GAS =
global / (mbs x dp)); a layout that cannot run stops the job before it starts (one line, exit 2). Each is
configured from the same engine flags (shapes, seq, global batch, vocabulary), its exact layout and versions
go into the JSON and the table, and its MFU uses the engine's FLOP count (engine/flops.py: 6 x matmul params incl. the LM
head + 6 x L x h x s per token, against --peak-tflops per GPU or the GPU's datasheet bf16 peak; a --fp8 row also
shows MFU8, against the dense FP8 peak, twice bf16's: `mfu_fp8_peak` in the JSON, null for other rows). A peer
that cannot import or run is reported with the reason; the others still run. So is a run that hangs: a peer
past --peer-timeout (an engine run past --engine-timeout) is stopped with all its processes, torchrun's
workers included (harness/jobs/process.py), and the job goes on to the next row.
A job does not start while other processes hold its GPUs (nvidia-smi's compute apps on the GPUs
CUDA_VISIBLE_DEVICES names): a row timed beside them measures the sharing. --shared-gpus times anyway, and every row
that shared them records who in `gpus_shared_with`.

Engine variants of one job share seed and data: `loss diff` is each one's largest relative per-step
loss difference from the first (TP 2 against TP 1: ~1e-3 in bf16, tolerance 1e-2). Prints a table last (ratio = the engine's first variant's tokens/s / the row's, which is the MFU ratio) and writes JSON (--out),
rewritten after every row, so a job cut short (the device's 10-minute limit) keeps the rows it finished.
CUDA_DEVICE_MAX_CONNECTIONS=1 is set for the engine's and megatron-core's multi-process runs (--max-connections 0:
unset), as Megatron requires for TP overlap; torchtitan runs without it, as its users do (recorded per row).
"""

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import GpuPoller, launcher, others_on_gpus, torchrun  # noqa: E402
from harness.jobs.process import Lines, Process  # noqa: E402  (the one process runner)
from bench.peers.common import engine_config  # noqa: E402
from bench.peers.layout import PEER_VARIANTS, LayoutError, PeerLayout, parse_peer, resolve_layout, row_name  # noqa: E402
from engine.atomic_files import write_text_atomic  # noqa: E402
from engine.flops import flops_per_token, mfu, peak_flops, peak_fp8_flops  # noqa: E402

__all__ = ["main", "run_engine", "run_peer", "peer_layouts", "energy_mj_per_token"]


def _env(args: argparse.Namespace, nproc: int, max_connections: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    if nproc > 1 and args.max_connections and max_connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(args.max_connections)
    return env


# the peers that set CUDA_DEVICE_MAX_CONNECTIONS=1 themselves (Megatron asks for it with TP / SP overlap); torchtitan
# leaves it unset (FSDP2's collectives on their own streams overlap compute better with the default 8 queues)
MAX_CONNECTIONS_PEERS = ("megatron-core",)


@dataclass(frozen=True)
class _Ran:
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool

    def tail(self, out_chars: int = 2000, err_chars: int = 6000) -> str:
        return (self.stdout[-out_chars:] + "\n" + self.stderr[-err_chars:]).strip()


def _run(cmd: list[str], nproc: int, args: argparse.Namespace, timeout_s: float, max_connections: bool = True) -> _Ran:
    """One engine or peer job through the harness's process runner: on timeout every process of it, torchrun's
    workers included (they lead sessions of their own), is stopped, so a hung run frees the GPUs and the job
    goes on to the next row."""
    out, err = Lines(), Lines()
    env = _env(args, nproc, max_connections)
    result = Process(cmd, cwd=REPO, env=env, stdout=out, stderr=err, timeout_s=timeout_s).wait()
    return _Ran(result.returncode, "".join(out.lines), "".join(err.lines), result.elapsed_s, result.timed_out)


def _header_value(stdout: str, prefix: str) -> str:
    return next((line[len(prefix):].strip() for line in stdout.splitlines() if line.startswith(prefix)), "")


def parse_variant(text: str) -> tuple[str, str, str]:
    """--variant NAME[@MODULE]=FLAGS -> (NAME, MODULE or "", FLAGS)."""
    head, sep, flags = text.partition("=")
    if not sep:
        raise SystemExit(f"bench/mfu.py: --variant {text!r}: write NAME=FLAGS (NAME= for --common alone)")
    name, _, module = head.partition("@")
    return name, module, flags


def run_engine(name: str, flags: list[str], args: argparse.Namespace, module: str = "") -> dict:
    """One engine variant: a real training run (`python -m MODULE pretrain`, default --engine-module), its
    steady-state numbers."""
    cfg = engine_config(flags, args.nproc or None)
    nproc = args.nproc or cfg.tp
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*launcher(nproc), "-m", module or args.engine_module, "pretrain", "--device", args.device, "--num-steps", str(args.warmup + args.steps),
               "--eval-samples", "0", "--no-save-final", "--warmup-steps", "0", "--run-dir", tmp, *flags]
        print(f"[{name}] {shlex.join(cmd)}", flush=True)
        poller = GpuPoller()
        proc = _run(cmd, nproc, args, args.engine_timeout)
        smi = poller.stop()
        metrics = Path(tmp) / "metrics.jsonl"
        records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    steps = [r for r in records if r.get("kind") == "loss"]
    run = _header_value(proc.stdout, "[RUN] temper engine ")
    result = {"name": name, "kind": "engine", "cmd": cmd, "nproc": nproc, "returncode": proc.returncode, "wall_s": proc.wall_s,
              "device": run.split("device=", 1)[1].split(" host=")[0] if "device=" in run else "?",
              "run_header": run, "ops": _header_value(proc.stdout, "[RUN] ops "),
              "steps": [{"step": r["step"], "loss": r["global_loss"], "grad_norm": r["grad_norm"], "tokens": r["tokens"],
                         "time_s": r["time_s"]} for r in steps],
              "peak_alloc_gib_rank0": max((r.get("peak_mem_gib", 0.0) for r in steps), default=None),
              "nvidia_smi_used_gib": smi["used_gib"], "sm_mhz": smi["sm_mhz"], "power_w": smi["power_w"],
              # evaluations, when the flags ask for them (an --eval-samples N after the default 0)
              "evals": [{"step": r["step"], "val_loss": r["val_loss"], "val_bpb": r["val_bpb"]}
                        for r in records if r.get("kind") == "eval"]}
    if proc.timed_out:
        # the reason last: the table prints an error's last line
        result["error"] = f"{proc.tail()}\nstopped after --engine-timeout {args.engine_timeout:g} s"
        return result
    if proc.returncode != 0 or len(steps) <= args.warmup:
        result["error"] = proc.tail() or "no steps were timed"
        return result
    times = [s["time_s"] for s in result["steps"][args.warmup:]]
    med = statistics.median(times)
    tokens = cfg.tokens_per_step
    peak = peak_flops(_with_peak(cfg, args), result["device"])
    result.update({"tokens_per_step": tokens, "flops_per_token": flops_per_token(cfg), "median_step_s": med,
                   "step_s_spread": [min(times), max(times)], "tokens_per_s": tokens / med,
                   "mfu": mfu(cfg, tokens, med, nproc, peak), "final_loss": result["steps"][-1]["loss"],
                   # --fp8: also against the FP8 dense peak (engine/flops.py); `mfu` stays bf16's, comparable
                   "mfu_fp8_peak": (mfu(cfg, tokens, med, nproc, peak_fp8_flops(_with_peak(cfg, args), result["device"]))
                                    if cfg.fp8 != "off" else None),
                   "peak_mem_gib_per_gpu": smi["used_gib"] or [result["peak_alloc_gib_rank0"]]})
    return result


def _with_peak(cfg, args):
    from dataclasses import replace
    return replace(cfg, peak_tflops=args.peak_tflops) if args.peak_tflops else cfg


def peer_layouts(specs: list[str], flags: list[str], nproc: int) -> list[tuple[str, str, PeerLayout]]:
    """(peer, the LAYOUT as given, its complete layout) of every --peer value on the job's GPUs (--nproc, else the
    engine's --tp); LayoutError on the first that cannot run."""
    cfg = engine_config(flags, nproc or None)
    out = []
    for spec in specs:
        peer, layout = resolve_layout(spec, cfg, nproc or cfg.tp)
        out.append((peer, spec.partition(":")[2], layout))
    return out


def run_peer(peer: str, variant: str, flags: list[str], args: argparse.Namespace, layout: tuple[str, PeerLayout]) -> dict:
    """One peer variant at its layout (the LAYOUT string as given, and as resolved here) in its own torchrun job of
    tp x dp processes; its JSON record (with `error` when it could not run). The peer process resolves the same
    string against the same flags, so the layout it runs is the one recorded here."""
    given, resolved = layout
    nproc = resolved.nproc
    name = row_name(peer, variant, resolved)
    with tempfile.TemporaryDirectory() as tmp:
        out, prof = Path(tmp) / "peer.json", Path(tmp) / "profile.json"
        cmd = [*torchrun(nproc), "-m", "bench.peers.run", "--peer", peer, "--variant", variant, "--layout", given,
               "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--device", args.device, "--out", str(out),
               *(["--profile-json", str(prof)] if args.profile_peers else []), "--",
               *flags, *(["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else [])]
        print(f"[{name}] {shlex.join(cmd)}", flush=True)
        poller = GpuPoller()
        max_connections = peer in MAX_CONNECTIONS_PEERS
        proc = _run(cmd, nproc, args, args.peer_timeout, max_connections)
        smi = poller.stop()
        result = json.loads(out.read_text()) if out.exists() else {"name": name, "kind": "peer", "nproc": nproc}
        result.setdefault("layout", resolved.record(peer))
        if prof.exists():
            result["profile"] = json.loads(prof.read_text())
    result.update({"cmd": cmd, "returncode": proc.returncode, "wall_s": proc.wall_s,
                   "cuda_device_max_connections": _env(args, nproc, max_connections).get("CUDA_DEVICE_MAX_CONNECTIONS"),
                   "nvidia_smi_used_gib": smi["used_gib"], "sm_mhz": smi["sm_mhz"], "power_w": smi["power_w"]})
    if proc.timed_out:
        result["error"] = f"{proc.tail(2000, 4000)}\nstopped after --peer-timeout {args.peer_timeout:g} s"
    elif proc.returncode != 0 and "error" not in result:
        result["error"] = proc.tail(2000, 4000)
    return result


def loss_diff(a: dict, b: dict) -> float | None:
    """Largest relative per-step loss difference of two engine runs (e.g. TP 2 vs TP 1 on one seed and data:
    bf16 rounding of differently ordered sums, ~1e-3; a bug shows as ~1e-1)."""
    pairs = [(x["loss"], y["loss"]) for x, y in zip(a.get("steps", []), b.get("steps", []))]
    return max(abs(x - y) / abs(y) for x, y in pairs) if pairs else None


def _fmt_mem(r: dict) -> str:
    mem = r.get("nvidia_smi_used_gib") or r.get("peak_mem_gib_per_gpu") or []
    return " ".join(f"{m:.1f}" for m in mem if m is not None) or "-"


def _fmt_alloc(r: dict) -> str:
    """torch's peak allocated memory on rank 0 (GiB), the number a memory model predicts (nvidia-smi adds the
    allocator's cache and NCCL's buffers)."""
    alloc = r.get("peak_alloc_gib_rank0")
    return f"{alloc:.1f}" if alloc else "-"


def _fmt_mfu_fp8(r: dict) -> str:
    """MFU against the FP8 dense peak, for a --fp8 row only ('-' otherwise)."""
    return f"{r['mfu_fp8_peak']:.3f}" if r.get("mfu_fp8_peak") is not None else "-"


def _fmt_mhz(r: dict) -> str:
    return "/".join(f"{m:.0f}" for m in r.get("sm_mhz") or []) or "-"


def energy_mj_per_token(r: dict) -> float | None:
    """All GPUs' median busy power over the row's tokens/s: the work per joule that decides speed once a GPU sits at
    its power limit (an H200 training step does; docs/benchmarks.md). None without power samples."""
    watts = r.get("power_w") or []
    return 1e3 * sum(watts) / r["tokens_per_s"] if watts and r.get("tokens_per_s") else None


def _fmt_energy(r: dict) -> str:
    energy = energy_mj_per_token(r)
    return f"{energy:.2f}" if energy is not None else "-"


def print_table(results: list[dict]) -> None:
    base = next((r for r in results if r.get("kind") == "engine" and "error" not in r), None)
    device = base["device"] if base else next((r.get("device") for r in results if r.get("device")), "?")
    print(f"\ndevice {device}; MFU: engine/flops.py count against the bf16 peak (MFU8: the FP8 peak, --fp8 rows); ratio = {base['name'] if base else 'engine'} tokens/s / row's "
          f"(= the MFU ratio: one FLOP count; > 1: the engine is faster); mem: nvidia-smi used per GPU (GiB; peers without nvidia-smi: allocated)")
    w = max([24] + [len(r["name"]) + 2 for r in results])  # peers' names carry their layout
    print(f"{'run':<{w}}{'GPUs':>5}{'step s':>9}{'spread':>17}{'tok/s':>10}{'MFU':>7}{'MFU8':>7}{'ratio':>7}{'mem GiB':>14}{'alloc':>6}{'MHz':>6}{'mJ/tok':>7}"
          f"{'loss':>9}{'loss diff':>10}  ops / versions")
    for r in results:
        if "error" in r:
            print(f"{r['name']:<{w}}{r.get('nproc', 1):>5}  failed: {r['error'].strip().splitlines()[-1][:110]}")
            continue
        lo, hi = r["step_s_spread"]
        ratio = f"{base['tokens_per_s'] / r['tokens_per_s']:.3f}" if base else "-"
        d = r.get("loss_diff_vs_first")
        diff = f"{d:.1e}" if d is not None else "-"
        what = r.get("ops") or " ".join(f"{k}={v}" for k, v in r.get("versions", {}).items())
        print(f"{r['name']:<{w}}{r['nproc']:>5}{r['median_step_s']:>9.4f}{f'{lo:.4f}-{hi:.4f}':>17}"
              f"{r['tokens_per_s']:>10.0f}{r['mfu']:>7.3f}{_fmt_mfu_fp8(r):>7}{ratio:>7}{_fmt_mem(r):>14}{_fmt_alloc(r):>6}{_fmt_mhz(r):>6}"
              f"{_fmt_energy(r):>7}{r['final_loss']:>9.4f}{diff:>10}  {what}")
    profiled = [r for r in results if r.get("profile")]
    if profiled:
        from bench.profile_step import FAMILIES
        print(f"\nprofiled steps, kernel ms per step by family:\n{'run':<{w}}" + "".join(f"{f:>14}" for f in FAMILIES)
              + f"{'total':>9}")
        for r in profiled:
            fams = r["profile"]["families"]
            print(f"{r['name']:<{w}}" + "".join(f"{fams[f]:>14.1f}" for f in FAMILIES) + f"{r['profile']['total_ms']:>9.1f}")


def _set_flag(flags: list[str], flag: str, value: int) -> list[str]:
    """flags with `flag value` (an earlier occurrence is overridden by argparse's last-wins rule)."""
    return [*flags, flag, str(value)]


def sweep_points(common: list[str], args: argparse.Namespace) -> list[tuple[int, int, list[str], list]]:
    """(mbs, seq, engine flags, peer layouts) of every sweep point, every layout checked before anything runs; the
    sweep sets the micro-batch size, so a --peer layout may not."""
    for spec in args.peer:
        if "mbs" in parse_peer(spec)[1]:
            raise LayoutError(spec, "--sweep sets the micro-batch size (--mbs)", "leave mbs out of the layout")
    points = []
    for mbs in args.mbs:
        for seq in args.seqs:
            flags = _set_flag(_set_flag(common, "--seq-length", seq), "--micro-batch-size", mbs)
            points.append((mbs, seq, flags, peer_layouts(args.peer, flags, args.nproc)))
    return points


def sweep(points: list[tuple[int, int, list[str], list]], args: argparse.Namespace, save) -> list[dict]:
    done: list[dict] = []
    for mbs, seq, flags, layouts in points:
        rows = [run_engine(f"engine mbs{mbs} s{seq}", flags, args)]
        for peer, given, layout in layouts:
            rows += [run_peer(peer, v, flags, args, (given, layout)) for v in PEER_VARIANTS[peer]]
        for r in rows:
            r.update(seq=seq, mbs=mbs, series=re.sub(r"[ -]mbs\d+.*$", "", r["name"]) + f" mbs {mbs}")
            status = "failed" if "error" in r else f"{r['tokens_per_s']:.0f} tok/s, MFU {r['mfu']:.3f}"
            print(f"  {r['name']} seq {seq} mbs {mbs}: {status}", flush=True)
        done += rows
        save(done)
    return done


def plot_sweep(points: list[dict], png: Path) -> str:
    """PNG of tokens/s and MFU against sequence length, one line per (run, mbs); the reason when none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        return f"no PNG: matplotlib is not importable ({err}); the numbers are in the JSON"
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for series in dict.fromkeys(p["series"] for p in points):
        ok = [p for p in points if p["series"] == series and "error" not in p]
        if ok:
            ax_t.plot([p["seq"] for p in ok], [p["tokens_per_s"] for p in ok], marker="o", label=series)
            ax_m.plot([p["seq"] for p in ok], [p["mfu"] for p in ok], marker="o", label=series)
    for ax, label in ((ax_t, "tokens / s"), (ax_m, "MFU")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_m.legend(fontsize=7)
    device = next((p["device"] for p in points if p.get("device") not in (None, "?")), "?")
    fig.suptitle(f"{device}: throughput and MFU against sequence length")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return f"wrote {png}"


def replot(json_paths: list[Path], png: Path) -> int:
    """Draw the PNG of one or more sweeps (e.g. one per --mbs, run as separate jobs) from their JSON files."""
    points: list[dict] = []
    for path in json_paths:
        try:
            results = json.loads(path.read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"--plot {path}: not a bench/mfu.py --out JSON ({err}); pass files a --sweep wrote")
        if not results or any("seq" not in r or "series" not in r for r in results):
            raise SystemExit(f"--plot {path}: its results are not sweep points (no seq/series): run with --sweep")
        points += results
    message = plot_sweep(points, png)
    print(message)
    return 0 if message.startswith("wrote") else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--common", default="--preset minicpm4-0.5b", help="engine flags of every run (shapes, cadence, layout)")
    p.add_argument("--variant", action="append", default=[],
                   help="engine variant NAME=FLAGS added to --common (default: engine=); NAME@MODULE=FLAGS runs that row "
                        "as `python -m MODULE pretrain` (an A/B against a reference module in one job)")
    p.add_argument("--peer", action="append", default=[], metavar="NAME[:LAYOUT]",
                   help=f"peer to run beside the engine, at its own layout: NAME one of {', '.join(PEER_VARIANTS)}; "
                        "LAYOUT comma-separated tp=, dp=, sp=on|off, ac=none|selective|full, compile=on|off, mbs=, "
                        "async_tp=on|off (torchtitan) "
                        "(defaults: the engine's --tp and --micro-batch-size, dp = GPUs / tp; bench/peers/layout.py), "
                        "e.g. torchtitan:dp=4,ac=selective or megatron-core:tp=2,dp=2,ac=selective")
    p.add_argument("--no-engine", action="store_true", help="peers only")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--nproc", type=int, default=0, help="processes (GPUs) of every engine run: TP x DP (0: --tp, DP 1)")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="optimizer steps run first and dropped (compile, autotune)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 dense peak per GPU (0: by GPU name, engine/flops.py)")
    p.add_argument("--max-connections", type=int, default=1, help="CUDA_DEVICE_MAX_CONNECTIONS for multi-process runs (0: unset)")
    p.add_argument("--peer-timeout", type=float, default=1800.0, help="seconds before a peer's job is stopped")
    p.add_argument("--engine-timeout", type=float, default=3600.0, help="seconds before an engine run is stopped")
    p.add_argument("--engine-module", default="engine",
                   help="run engine variants as `python -m MODULE pretrain` (tests.engine.fp8_recast: tensorwise FP8 "
                        "casting every backward operand again, the reference the kept FP8 copies are timed against)")
    p.add_argument("--profile-peers", action="store_true",
                   help="profile one more step of each peer (bench/profile_step.py's summary, kept in the JSON, "
                        "families printed after the table)")
    p.add_argument("--sweep", action="store_true", help="the first variant (and peers) over --seqs x --mbs")
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--mbs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--png", default="", help="sweep plot (default: next to --out, or mfu_sweep.png)")
    p.add_argument("--plot", nargs="+", default=[], metavar="JSON",
                   help="only draw --png from sweeps' --out JSON files, their points together (a GPU image lacks matplotlib)")
    p.add_argument("--shared-gpus", action="store_true",
                   help="time even when other processes hold the GPUs (each row records them); default: refuse to start")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.plot:
        return replot([Path(f) for f in args.plot], Path(args.png or Path(args.plot[0]).with_suffix(".png")))
    common = shlex.split(args.common) + ["--device", args.device]
    variants = [parse_variant(v) for v in (args.variant or ["engine="])]
    meta = {"argv": sys.argv if argv is None else argv, "steps": args.steps, "warmup": args.warmup, "common": args.common,
            "nproc": args.nproc, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:  # every peer layout is checked before the first run starts
        if args.sweep:
            points = sweep_points(common + shlex.split(variants[0][2]), args)
        else:
            layouts = peer_layouts(args.peer, common, args.nproc)
    except LayoutError as err:
        print(f"bench/mfu.py: {err}", file=sys.stderr)
        return 2
    if (others := others_on_gpus()) and not args.shared_gpus:
        print(f"bench/mfu.py: other processes hold the GPUs ({'; '.join(others)}): a row timed beside them measures the "
              f"sharing; wait for them to end, or pass --shared-gpus (each row then records them)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None

    def save(rows: list[dict]) -> None:
        """--out after every row: a job stopped from outside keeps what it finished."""
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out, json.dumps({"meta": meta, "results": rows}, indent=1))

    results: list[dict] = []
    if args.sweep:
        results = sweep(points, args, save)
        png = Path(args.png or (out.with_suffix(".png") if out else "mfu_sweep.png"))
        meta["png"] = plot_sweep(results, png)
        print(meta["png"])
    else:
        runs = [] if args.no_engine else [lambda n=name, m=module, f=flags: run_engine(n, common + shlex.split(f), args, m)
                                          for name, module, flags in variants]
        runs += [lambda p=peer, v=v, g=given, lay=layout: run_peer(p, v, common, args, (g, lay))
                 for peer, given, layout in layouts for v in PEER_VARIANTS[peer]]
        for run in runs:
            others = others_on_gpus()
            results.append(run())
            if others := sorted(set(others) | set(others_on_gpus())):  # before or after the row: it shared the GPUs
                results[-1]["gpus_shared_with"] = others
                print(f"[{results[-1]['name']}] shared the GPUs with: {'; '.join(others)}", flush=True)
            save(results)
    engines = [r for r in results if r.get("kind") == "engine" and "error" not in r]
    if not args.sweep:
        for r in engines[1:]:
            r["loss_diff_vs_first"] = loss_diff(r, engines[0])
    for r in results:
        if "error" in r:
            print(f"[{r['name']}] could not run:\n{r['error'][-3000:]}", flush=True)
    print_table(results)
    save(results)
    if out:
        print(f"wrote {out}")
    engine_failed = any("error" in r for r in results if r.get("kind") == "engine")
    return 1 if engine_failed else 0


if __name__ == "__main__":
    sys.exit(main())
