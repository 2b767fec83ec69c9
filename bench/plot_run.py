"""Plot a run's metrics.jsonl: training loss and learning rate per step, validation loss and bits per byte.

    python bench/plot_run.py RUN/metrics.jsonl docs/img/run.png --title "minicpm4-0.5b, real corpus, H200"

Reads the records the engine writes (engine/step_log.py: kind "loss" every step, kind "eval" at each
evaluation), so it plots any run, on any machine. Needs matplotlib (not an engine dependency).
"""

import argparse
import json
from pathlib import Path

__all__ = ["main", "read_metrics"]


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(loss records, eval records) of a metrics.jsonl, each sorted by step."""
    losses, evals = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            (losses if record["kind"] == "loss" else evals if record["kind"] == "eval" else []).append(record)
    return sorted(losses, key=lambda r: r["step"]), sorted(evals, key=lambda r: r["step"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses, evals = read_metrics(args.metrics)
    if not losses:
        raise SystemExit(f"plot_run: {args.metrics} has no loss records (kind 'loss'): is it a run's metrics.jsonl?")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in losses]
    left.plot(steps, [r["global_loss"] for r in losses], lw=0.8, label="train loss")
    if evals:
        left.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", ms=3, label="val loss")
    left.set_xlabel("step")
    left.set_ylabel("loss (nats / token)")
    left.set_yscale("log")
    left.grid(alpha=0.3)
    left.legend(loc="upper right")
    lr = left.twinx()
    lr.plot(steps, [r["lr"] for r in losses], color="gray", ls="--", lw=0.8)
    lr.set_ylabel("lr (printed: base rate)", color="gray")
    if evals:
        right.plot([r["step"] for r in evals], [r["val_bpb"] for r in evals], "o-", ms=3, color="C2")
    right.set_xlabel("step")
    right.set_ylabel("validation bits per byte")
    right.grid(alpha=0.3)
    fig.suptitle(args.title)
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"plot_run: {len(losses)} steps, {len(evals)} evaluations -> {args.png}")


if __name__ == "__main__":
    main()
