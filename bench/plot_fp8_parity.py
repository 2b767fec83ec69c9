"""The FP8 loss-parity figure (docs/fp8.md): train and validation loss of bf16 and the --fp8 recipes, and each
recipe's validation loss relative to bf16 at the steps both evaluated.

    python bench/plot_fp8_parity.py bf16=RUN/metrics.jsonl tensorwise=... rowwise=... \
        --json bench/results/fp8_parity.json --png docs/img/fp8_parity.png --title "..."
    python bench/plot_fp8_parity.py --from-json bench/results/fp8_parity.json --png docs/img/fp8_parity.png

The first run named is the reference. `--json` keeps what the figure needs (per-step loss, evaluations, median
step time), so the figure can be redrawn without the runs. Needs matplotlib (not an engine dependency).
"""

import argparse
import json
import statistics
from pathlib import Path

from bench.plot_run import read_metrics

__all__ = ["main", "pack", "relative_val"]


def pack(named: list[str]) -> dict:
    """{name: {loss: [[step, loss]], eval: [[step, val_loss, val_bpb]], median_step_s}} of NAME=metrics.jsonl."""
    runs = {}
    for item in named:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"plot_fp8_parity: {item!r}: give NAME=path/to/metrics.jsonl")
        losses, evals = read_metrics(Path(path))
        times = [r["time_s"] for r in losses[10:]]  # the first steps carry warm-up (allocator, cuBLAS heuristics)
        runs[name] = {"loss": [[r["step"], r["global_loss"]] for r in losses],
                      "eval": [[r["step"], r["val_loss"], r["val_bpb"]] for r in evals],
                      "median_step_s": statistics.median(times) if times else None}
    return runs


def relative_val(runs: dict) -> dict[str, list[tuple[int, float]]]:
    """(step, (val - ref) / ref) of each run against the first, at the steps both evaluated (step 0 left out)."""
    ref_name = next(iter(runs))
    ref = {s: v for s, v, _ in runs[ref_name]["eval"]}
    return {name: [(s, (v - ref[s]) / ref[s]) for s, v, _ in run["eval"] if s in ref and s > 0]
            for name, run in runs.items() if name != ref_name}


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="NAME=metrics.jsonl, the reference first")
    parser.add_argument("--from-json", type=Path, help="redraw from a --json file instead of runs")
    parser.add_argument("--json", type=Path, help="write the packed runs (and --meta) here")
    parser.add_argument("--meta", type=json.loads, default={}, help="JSON object stored beside the runs (date, device, command)")
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--title", default="")
    parser.add_argument("--smooth", type=int, default=50, help="running mean of the train loss over this many steps")
    args = parser.parse_args(argv)
    if bool(args.runs) == bool(args.from_json):
        raise SystemExit("plot_fp8_parity: give either NAME=metrics.jsonl runs or --from-json FILE")
    if args.from_json:
        doc = json.loads(args.from_json.read_text(encoding="utf-8"))
    else:
        doc = {"meta": args.meta, "runs": pack(args.runs)}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    runs = doc["runs"]

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (name, run) in enumerate(runs.items()):
        steps = [s for s, _ in run["loss"]]
        left.plot(steps, _smooth([x for _, x in run["loss"]], args.smooth), lw=1.0, color=f"C{i}",
                  label=f"{name} train (mean of {args.smooth})")
        evals = [e for e in run["eval"] if e[0] > 0]
        left.plot([e[0] for e in evals], [e[1] for e in evals], "o--", ms=4, lw=0.8, color=f"C{i}", label=f"{name} val")
    left.set_xlabel("step")
    left.set_ylabel("loss (nats / token)")
    left.set_ylim(top=min(7.0, left.get_ylim()[1]))
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    for i, (name, points) in enumerate(relative_val(runs).items(), start=1):
        right.plot([s for s, _ in points], [100 * r for _, r in points], "o-", ms=4, color=f"C{i}", label=name)
    right.axhspan(-1, 1, color="gray", alpha=0.15, label="within 1 %")
    right.axhline(0, color="C0", lw=0.8)
    right.set_xlabel("step")
    right.set_ylabel(f"val loss vs {next(iter(runs))} (%)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    counts = ", ".join(f"{name} {len(run['loss'])} steps" for name, run in runs.items())
    print(f"plot_fp8_parity: {counts} -> {args.png}")


if __name__ == "__main__":
    main()
