"""Where an engine step's time goes: torch.profiler over a few real training steps, summarised as markdown.

    python bench/profile_step.py --steps 2 --warmup 3 --md prof.md -- --preset minicpm4-8b --num-layers 4 \
        --micro-batch-size 2 --seq-length 4096 --grad-accum-steps 8
    torchrun --standalone --nproc-per-node 2 bench/profile_step.py --insert docs/benchmarks.md --section 8b-tp2 \
        -- --preset minicpm4-8b --tp 2 --micro-batch-size 2 --seq-length 4096 --grad-accum-steps 8

Everything after `--` are engine flags. The engine's own Trainer (engine/train.py, built as `pretrain`
builds it) runs --warmup steps, then --steps steps under torch.profiler. Rank 0's device kernels are summed
per step by family (GEMM, attention, copies/casts, optimizer, elementwise, communication) and the top
kernels listed; exposed communication = communication kernel time not overlapped by any compute kernel on
another stream (what TP overlap has left to hide). GEMM kernels are also grouped by the op that launched
them and its operand shapes (the profiler records shapes), with the achieved TFLOP/s where the op's FLOPs
follow from its shapes (mm, addmm, bmm, baddbmm): which GEMM runs below the others. On CUDA, the time the GPU
sat idle inside each step is charged to what the host was doing (a sync such as `aten::item`, the step's set-up
before its first kernel): host synchronisation inside a step, measured. On CPU (no kernels) the
families are taken from each aten op's self CPU time and there is no overlap. The raw chrome trace goes to
--trace-dir (default: a temp folder; never into git). The table goes to --md, or replaces the section
between `<!-- profile:NAME -->` and `<!-- /profile:NAME -->` in --insert (appended when absent).
"""

import argparse
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.peers.common import engine_config  # noqa: E402
from engine.atomic_files import write_text_atomic  # noqa: E402
from engine.ops.dispatch import OP_NAMES  # noqa: E402

__all__ = ["main", "family", "exposed_ms", "exposed_pieces", "summarize_kernels", "gemm_flops", "gemms_by_shape", "idle_gaps",
           "markdown", "insert_section", "profile_steps", "FAMILIES"]

STEP_MARK = "temper_profiled_step"  # the record_function around each profiled train_step
BUBBLE_US, BUBBLE = 10.0, "between queued kernels (gaps < 10 us)"

FAMILIES = ("GEMM", "attention", "communication", "optimizer", "copies/casts", "elementwise")
_RULES = [  # first match wins; kernel names (cuBLAS, CUTLASS/CuTeDSL, NCCL, torch) and aten op names on CPU
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|c10d|gloo|broadcast|sendrecv"),
    ("attention", r"flash|fmha|attention|sdpa|attn"),
    ("GEMM", r"gemm|nvjet|xmma|wgmma|cublas|cutlass.*(matmul|mm)|^aten::(mm|addmm|bmm|matmul|linear|baddbmm)$"),
    ("optimizer", r"adam|multi_tensor|foreach|optim|clip_grad"),
    ("copies/casts", r"copy|memcpy|memset|cast|convert|to_copy|catarray|^aten::(cat|contiguous|clone|t|transpose|"
                     r"_to_copy|to|index_select|view|reshape)$|transpose"),
]


# A CuTeDSL kernel's name is its module and class, then `_object_at_` and its arguments' layouts (TiledCopy, ...):
# only the first part says what it is. The engine's own kernels' module is engine.ops.<op>.<module>: the op folder is
# dropped, so the elementwise kernels living in gemm_fc1/ and gemm_output/ (the SwiGLU backward, the gradient scale)
# do not count as GEMMs for their folder's name.
_OWN_KERNEL_OP = re.compile("engineops(" + "|".join(OP_NAMES) + ")")


def family(name: str) -> str:
    low = _OWN_KERNEL_OP.sub("engineops", name.lower().split("_object_at_")[0])
    for fam, pattern in _RULES:
        if re.search(pattern, low):
            return fam
    return "elementwise"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def exposed_ms(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Time (same unit as the intervals) when a communication kernel runs and no compute kernel does."""
    busy = _union(compute)
    exposed = 0.0
    for start, end in _union(comm):
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy if a < end and b > start)
        exposed += (end - start) - covered
    return exposed


def exposed_pieces(comm: list[tuple[float, float, str]], compute: list[tuple[float, float]]) -> list[dict]:
    """Each communication kernel's time with no compute kernel beside it: {name, at (its start), ms (exposed)}, for
    the kernels that have some; where in the step the exposed time sits, and which collective it is."""
    busy = _union(compute)
    out = []
    for start, end, name in comm:
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy if a < end and b > start)
        if end - start - covered > 0:
            out.append({"name": name, "at": start, "ms": end - start - covered})
    return out


def split_tail(comm: list[tuple[float, float, str]], compute: list[tuple[float, float]],
               windows: list[tuple[float, float]] | None) -> tuple[list[tuple[float, float, str]], float]:
    """(communication up to the last compute kernel of its step, the time after it). The profile syncs the whole device
    at each step's end; the engine's loop syncs only the compute stream, so what a step leaves on the wire after its
    last compute kernel (ZeRO-1's parameter all-gathers, launched after the optimizer) runs beside the next forward
    there: not exposed. `windows`: the steps' spans (each step starts with the device idle), else one step."""
    inside, tail = [], 0.0
    for lo, hi in windows or [(float("-inf"), float("inf"))]:
        last = max((b for a, b in compute if lo <= a < hi), default=None)
        for a, b, name in comm:
            if not lo <= a < hi:
                continue
            if last is None or b <= last:
                inside.append((a, b, name))
            else:
                if a < last:
                    inside.append((a, last, name))
                tail += b - max(a, last)
    return inside, tail


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """Each profiled step's span (`STEP_MARK` on the host's clock, which the device timeline shares), to the next
    step's start (the device may still run the step's last kernels after its host span ends)."""
    starts = sorted(float(e["ts"]) for e in events
                    if e.get("ph") == "X" and e.get("name") == STEP_MARK and e.get("cat") == "user_annotation")
    return [(a, b) for a, b in zip(starts, starts[1:] + [float("inf")])]


def summarize_kernels(kernels: list[dict], steps: int, windows: list[tuple[float, float]] | None = None) -> dict:
    """kernels: {name, dur, and ts (device timeline) or count (CPU op totals)} in microseconds. Per-step totals by
    family and by kernel name, exposed communication (split_tail: not what runs after the step's last compute kernel)."""
    by_family: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    comm, compute = [], []
    for k in kernels:
        fam = family(k["name"])
        by_family[fam] += k["dur"]
        by_name[k["name"]][0] += k["dur"]
        by_name[k["name"]][1] += k.get("count", 1)
        if "ts" in k:
            (comm if fam == "communication" else compute).append((k["ts"], k["ts"] + k["dur"], k["name"]))
    total = sum(by_family.values())
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    compute = [(a, b) for a, b, _ in compute]
    comm, tail = split_tail(comm, compute, windows)
    pieces = exposed_pieces(comm, compute)
    first = min((a for a, _ in compute), default=0.0)
    by_collective: dict[str, float] = defaultdict(float)
    for p in pieces:
        by_collective[p["name"]] += p["ms"]
    return {"total_ms": total / 1e3 / steps,
            "families": {f: by_family.get(f, 0.0) / 1e3 / steps for f in FAMILIES},
            "top": [{"name": n, "family": family(n), "ms": t / 1e3 / steps, "calls": c / steps} for n, (t, c) in top],
            "exposed_comm_ms": exposed_ms([(a, b) for a, b, _ in comm], compute) / 1e3 / steps if comm else 0.0,
            "tail_comm_ms": tail / 1e3 / steps,  # after the step's last compute kernel: beside the next forward
            # where the exposed time is: by collective kernel, and the largest pieces (ms after the first compute
            # kernel profiled; one profiled step: ms into it)
            "exposed_by_collective": {n: t / 1e3 / steps for n, t in sorted(by_collective.items(), key=lambda kv: -kv[1])},
            "exposed_largest": [{"name": p["name"], "at_ms": (p["at"] - first) / 1e3, "ms": p["ms"] / 1e3}
                                for p in sorted(pieces, key=lambda p: -p["ms"])[:5]],
            "timeline": bool(compute)}


# Ops launching a GEMM kernel of their own (no aten matmul op around it) whose first two inputs are x [..., k] and a
# weight [n, k]: gemm_fc1's quack version (its autograd Function, engine/ops/gemm_fc1/quack_gated.py). Not
# aten::linear: its aten::mm / addmm child is the op a kernel is tied to, and on CPU it would count twice.
_LINEAR_LIKE = ("_GemmFc1",)


def gemm_flops(op: str, dims: list) -> float | None:
    """FLOPs of one call of a matmul op from its recorded input shapes (2 m n k per product); None when unknown."""
    name = op.removeprefix("aten::").rstrip("_")
    try:
        if name in _LINEAR_LIKE:
            (*lead, k), (n, k_w) = dims[0], dims[1]
            return 2.0 * math.prod(lead) * n * k if k == k_w else None
        if name == "mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 2.0 * m * n * k
        if name == "addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 2.0 * m * n * k
        if name == "bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2.0 * b * m * n * k
        if name == "baddbmm":
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return 2.0 * b * m * n * k
    except (IndexError, TypeError, ValueError):
        return None
    return None


def gemms_by_shape(events: list[dict], steps: int) -> list[dict]:
    """GEMM time per step grouped by the launching op and its input shapes, slowest group first.

    events: a chrome trace's. On CUDA a GEMM kernel is tied to the innermost op that launched it by their shared
    "External id"; without device kernels (CPU) the matmul ops' own times are used. A kernel launched outside any
    recorded op (a library's own launcher) is grouped under its kernel name."""
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel" and family(e["name"]) == "GEMM"]
    if not kernels:
        kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                   and gemm_flops(e["name"], e.get("args", {}).get("Input Dims", [])) is not None]
    groups: dict[tuple[str, str], list] = defaultdict(lambda: [0.0, 0, None])
    for k in kernels:
        op = k if k.get("cat") == "cpu_op" else ops.get(k.get("args", {}).get("External id"))
        name = op["name"] if op else k["name"].split("_object_at_")[0][:60]
        dims = [d for d in (op or {}).get("args", {}).get("Input Dims", []) if d]
        group = groups[(name, " x ".join(str(d).replace(" ", "") for d in dims))]
        group[0] += float(k["dur"])
        group[1] += 1
        group[2] = gemm_flops(name, (op or {}).get("args", {}).get("Input Dims", []))
    rows = []
    for (name, shapes), (dur_us, calls, flops) in groups.items():
        tflops = flops * calls / (dur_us * 1e-6) / 1e12 if flops and dur_us else None
        rows.append({"op": name, "shapes": shapes, "calls": calls / steps, "ms": dur_us / 1e3 / steps,
                     "tflops": tflops})
    return sorted(rows, key=lambda r: -r["ms"])


def idle_gaps(events: list[dict], steps: int) -> dict:
    """When the GPU had nothing to run inside a step, and what the host was doing meanwhile.

    events: a chrome trace's. Each `STEP_MARK` span (one train_step on the host's clock; the profiler also puts a
    copy on the device timeline, not used) minus the union of its device kernels, copies and memsets is idle time.
    Gaps under `BUBBLE_US` are the device's own spacing between queued kernels ("between queued kernels"); a longer
    gap is charged to the innermost host event (an aten op, a CUDA runtime call such as cudaStreamSynchronize)
    running at its midpoint, or to "host (no op recorded)", the Python between ops: a gap right after a sync
    (`aten::item`) is the host catching up, one at the start the host preparing the step before its first kernel.
    The five largest gaps are listed with where they fell in their step and the host events around them. Under
    the profiler every host op runs slower (recording, shapes), so host-caused gaps are upper bounds: time the
    host code without it before acting on one."""
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("ph") == "X" and e.get("name") == STEP_MARK and e.get("cat") == "user_annotation"]
    device = _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    host = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation")
                  and e.get("name") != STEP_MARK)
    by_host: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    largest: list[dict] = []
    idle = span_total = 0.0
    for start, end in spans:
        span_total += end - start
        cursor = start
        for a, b in [(max(a, start), min(b, end)) for a, b in device if b > start and a < end] + [(end, end)]:
            if a > cursor:
                stack = [BUBBLE]  # outer to inner; only gaps that are not bubbles look at the host
                if a - cursor >= BUBBLE_US:
                    mid = (cursor + a) / 2
                    stack = [n for _, n in sorted(((hb - ha, n) for ha, hb, n in host if ha <= mid <= hb),
                                                  reverse=True)] or ["host (no op recorded)"]
                by_host[stack[-1]][0] += a - cursor
                by_host[stack[-1]][1] += 1
                idle += a - cursor
                largest.append({"ms": (a - cursor) / 1e3, "at_ms": (cursor - start) / 1e3,
                                "host": " > ".join(stack[-4:])})
            cursor = max(cursor, b)
    rows = sorted(({"host": n, "ms": t / 1e3 / steps, "gaps": c / steps} for n, (t, c) in by_host.items()),
                  key=lambda r: -r["ms"])
    largest = sorted(largest, key=lambda g: -g["ms"])[:5]
    return ({"idle_ms": idle / 1e3 / steps, "step_ms": span_total / 1e3 / steps, "by_host": rows, "largest": largest}
            if spans else {})


def markdown(title: str, summary: dict, step_ms: float, top: int = 15) -> str:
    total = summary["total_ms"] or 1.0
    lines = [f"#### {title}", "",
             f"Step {step_ms:.1f} ms (wall, median of the profiled steps); kernel time {summary['total_ms']:.1f} ms per "
             f"step (summed over streams).", "", "| family | ms / step | % of kernel time |", "| --- | ---: | ---: |"]
    for fam in FAMILIES:
        lines.append(f"| {fam} | {summary['families'][fam]:.2f} | {100 * summary['families'][fam] / total:.1f} |")
    if summary["timeline"]:
        lines.append(f"| communication exposed (no compute kernel beside it) | {summary['exposed_comm_ms']:.2f} | "
                     f"{100 * summary['exposed_comm_ms'] / total:.1f} |")
        if summary.get("tail_comm_ms"):
            lines.append(f"| communication after the step's last compute kernel (the engine runs it beside the next "
                         f"forward) | {summary['tail_comm_ms']:.2f} | {100 * summary['tail_comm_ms'] / total:.1f} |")
        if summary.get("exposed_largest"):
            lines += ["", "Exposed communication by collective (ms / step): " + "; ".join(
                f"`{n[:60]}` {t:.2f}" for n, t in list(summary["exposed_by_collective"].items())[:4]),
                "", "Largest exposed pieces (ms after the first compute kernel profiled): " + "; ".join(
                f"{p['ms']:.2f} ms at {p['at_ms']:.1f} ms (`{p['name'][:60]}`)" for p in summary["exposed_largest"])]
    lines += ["", "| kernel | family | calls / step | ms / step | % |", "| --- | --- | ---: | ---: | ---: |"]
    for k in summary["top"][:top]:
        name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {k['family']} | {k['calls']:.0f} | {k['ms']:.2f} | "
                     f"{100 * k['ms'] / total:.1f} |")
    if summary.get("gemms"):
        lines += ["", "| GEMM launched by | input shapes | calls / step | ms / step | TFLOP/s |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for g in summary["gemms"][:top]:
            rate = f"{g['tflops']:.3g}" if g["tflops"] is not None else "-"
            lines.append(f"| `{g['op']}` | {g['shapes'] or '-'} | {g['calls']:.0f} | {g['ms']:.2f} | {rate} |")
    idle = summary.get("idle")
    if idle:
        lines += ["", f"GPU idle inside the step: {idle['idle_ms']:.3f} ms of {idle['step_ms']:.1f} "
                      f"({100 * idle['idle_ms'] / (idle['step_ms'] or 1.0):.1f} %), by what the host was doing:", "",
                  "| host during the gap | gaps / step | idle ms / step |", "| --- | ---: | ---: |"]
        for r in idle["by_host"][:8]:
            lines.append(f"| `{r['host']}` | {r['gaps']:.3g} | {r['ms']:.3f} |")
        lines += ["", "Largest gaps (ms into its step; the host events running, outer to inner): " + "; ".join(
            f"{g['ms']:.3f} ms at {g['at_ms']:.1f} ms ({g['host']})" for g in idle.get("largest", []))]
    return "\n".join(lines) + "\n"


def insert_section(doc: Path, section: str, text: str) -> None:
    """Replace the text between the section's markers in `doc` (append the marked section when absent)."""
    begin, end = f"<!-- profile:{section} -->", f"<!-- /profile:{section} -->"
    old = doc.read_text() if doc.exists() else ""
    block = f"{begin}\n{text}{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    write_text_atomic(doc, new)


def _kernels_from_trace(events: list[dict]) -> list[dict]:
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])} for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def _cpu_ops(prof) -> list[dict]:
    return [{"name": a.key, "dur": float(a.self_cpu_time_total), "count": a.count} for a in prof.key_averages()
            if a.self_cpu_time_total > 0 and a.key != STEP_MARK]


def profile_steps(step: Callable[[], object], steps: int, device: torch.device,
                  trace_dir: str = "", rank: int = 0) -> tuple[dict, list[float], Path | None]:
    """Run `step` `steps` times under torch.profiler, each inside `STEP_MARK` and synchronised: the summary (families,
    top kernels, GEMMs by shape, idle gaps on CUDA), each step's wall time, and the raw trace's path (trace_dir or a
    temp folder). Every rank profiles (so collectives line up); only `rank` (0 unless asked: a collective's time on one
    rank is its wait for the slowest, so the slow rank's own trace says why) writes and summarises its trace, the
    others get an empty summary and no path. Shared by engine steps (main) and the peers' steps (bench/peers/run.py --profile-json)."""
    on_cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if on_cuda else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    times = []
    sync()
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            with torch.profiler.record_function(STEP_MARK):
                step()
                sync()
            times.append(time.perf_counter() - t0)
    me = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if me != rank:
        return {}, times, None  # `rank`'s trace is the one summarised
    folder = Path(trace_dir or tempfile.mkdtemp(prefix="profile-trace-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"trace_rank{rank}.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text()).get("traceEvents", [])
    kernels = _kernels_from_trace(events) if on_cuda else _cpu_ops(prof)
    windows = step_windows(events) if on_cuda else None
    summary = {**summarize_kernels(kernels, steps, windows), "gemms": gemms_by_shape(events, steps),
               "idle": idle_gaps(events, steps) if on_cuda else {}}
    return summary, times, trace


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="profiled optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="steps run first, not profiled (compile, autotune)")
    p.add_argument("--title", default="", help="section title (default: the engine flags)")
    p.add_argument("--md", default="", help="write the markdown table here")
    p.add_argument("--insert", default="", help="markdown file whose profile section to replace, e.g. docs/benchmarks.md")
    p.add_argument("--section", default="engine", help="section name for --insert")
    p.add_argument("--trace-dir", default="", help="where the raw chrome trace goes (default: a temp folder)")
    p.add_argument("--json", default="", help="also write the summary as JSON")
    p.add_argument("--rank", type=int, default=0, help="the rank whose trace is summarised (under torchrun; a rank that "
                   "waits in its collectives is waiting for another: profile that one)")
    args = p.parse_args(argv[:split])
    flags = argv[split + 1:]

    from engine.distributed import init_parallel, shutdown_parallel
    from engine.env import launch_env
    from engine.train import Trainer, make_reproducible, resolve_device
    from engine.runinfo import device_name

    env = launch_env()
    if not 0 <= args.rank < env.world_size:
        p.error(f"--rank {args.rank}: this launch has ranks 0..{env.world_size - 1} (torchrun --nproc-per-node N for more)")
    cfg = engine_config(flags, env.world_size)
    device_type, dtype = resolve_device(cfg)
    scratch = None if cfg.run_dir else tempfile.mkdtemp(prefix="profile-step-")  # the run's config.json, metrics.jsonl
    cfg = replace(cfg, device=device_type, compute_dtype="bf16" if dtype == torch.bfloat16 else "fp32",
                  num_steps=args.warmup + args.steps, eval_samples=0, save_final=False, run_dir=cfg.run_dir or scratch)
    make_reproducible(cfg, device_type)
    kv_replicas = cfg.tp // cfg.num_kv_heads if cfg.tp > cfg.num_kv_heads else 1
    par = init_parallel(env, cfg.tp, device_type, kv_replicas=kv_replicas)
    try:
        trainer = Trainer(cfg, par, dtype, launcher=env.launcher)
        for _ in range(args.warmup):
            trainer.train_step()
        summary, times, trace = profile_steps(trainer.train_step, args.steps, par.device, args.trace_dir, args.rank)
        if par.rank != args.rank:
            return 0
        where = f" (rank {args.rank} of {par.world_size})" if par.world_size > 1 else ""
        title = args.title or (f"{device_name(par.device)}{where}, {time.strftime('%Y-%m-%d')}, {' '.join(flags)}; ops "
                               + " ".join(f"{k}={v}" for k, v in sorted(trainer.ops.versions.items())))
        text = markdown(title, summary, 1e3 * statistics.median(times))
        print(text)
        print(f"raw trace (not for git): {trace}")
        if args.md:
            write_text_atomic(Path(args.md), text)
        if args.insert:
            insert_section(Path(args.insert), args.section, text)
            print(f"updated section {args.section!r} of {args.insert}")
        if args.json:
            write_text_atomic(Path(args.json), json.dumps({"title": title, "step_s": times, **summary}, indent=1))
        return 0
    finally:
        shutdown_parallel()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
