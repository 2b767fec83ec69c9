"""Muon against AdamW at equal tokens: `minicpm4-0.5b` on the real corpus, one GPU.

Two real training runs (bench/mfu.py's `run_engine`: subprocesses, metrics.jsonl steps and evaluations), the
same seed, batch, steps and schedule, one after the other in the same job: `--optimizer adamw` and
`--optimizer muon` (engine/optim/muon.py: the hidden matrices orthogonalised, at the same --lr and muP
multipliers, with Moonlight's update scale). Reported: val_loss and val_bpb of the final evaluation (the first
--eval-samples validation windows, the same for both), the last train loss, and the step-time overhead of
Muon (median step time after --skip warm-up steps, Muon / AdamW). Both runs tokenize into one cache folder,
so the second reuses the first's shards.

    python bench/muon_vs_adamw.py --steps 150 --out bench/results/muon_vs_adamw_05b_h200.json

About 2 x (150 x 0.25 s + ~40 s start-up, data and evaluation) on an H200. Data defaults: the shared corpus
and MiniCPM4 tokenizer at --data-root (../shared/data from the repository root, as docs/benchmarks.md uses).
Prints a table last; writes JSON with every step's numbers.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mfu import run_engine  # noqa: E402

__all__ = ["main"]


def data_flags(root: Path, cache: str) -> list[str]:
    corpus = root / "corpus"
    return ["--hf-dataset", str(corpus / "train-00000-of-00002.parquet"),
            "--hf-val-dataset", str(corpus / "validation-00000-of-00001.parquet"),
            "--tokenizer-path", str(root / "tokenizers" / "minicpm4"), "--data-cache-dir", cache]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="minicpm4-0.5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--skip", type=int, default=5, help="steps dropped as warm-up from the step-time median")
    p.add_argument("--data-root", default="../shared/data", help="folder with corpus/ and tokenizers/minicpm4/")
    p.add_argument("--eval-samples", type=int, default=64)
    p.add_argument("--common", default="--seq-length 4096 --micro-batch-size 4 --grad-accum-steps 2 --warmup-steps 15 "
                                        "--decay-steps 30 --log-every 10",
                   help="flags added to both runs (the batch and schedule; the preset's lr 1e-2, WSD)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    root = Path(args.data_root)
    if not (root / "corpus").is_dir():
        p.error(f"--data-root {root}: no corpus/ folder there; pass the shared data folder")
    results = []
    with tempfile.TemporaryDirectory() as cache:
        common = [*data_flags(root, cache), "--eval-samples", str(args.eval_samples), *args.common.split()]
        common = ["--preset", args.preset, *common]
        # run_engine trains --skip + --steps steps and times the last --steps: both optimizers see equal tokens
        run_args = argparse.Namespace(device=args.device, steps=args.steps, warmup=args.skip, max_connections=0,
                                      peak_tflops=args.peak_tflops)
        for name in ("adamw", "muon"):
            print(f"running {name}", flush=True)
            results.append(run_engine(name, [*common, "--optimizer", name], run_args))
            if "error" in results[-1]:
                print(f"  FAILED (exit {results[-1]['returncode']}):\n{results[-1]['error']}", flush=True)
    ok = all("error" not in r and r["evals"] for r in results)
    summary = {}
    if ok:
        adamw, muon = results
        summary = {"tokens": adamw["tokens_per_step"] * (args.steps + args.skip),
                   "step_time_overhead": muon["median_step_s"] / adamw["median_step_s"],
                   "val_bpb": {r["name"]: r["evals"][-1]["val_bpb"] for r in results},
                   "val_loss": {r["name"]: r["evals"][-1]["val_loss"] for r in results}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"preset": args.preset, "steps": args.steps, "skip": args.skip,
                                              "summary": summary, "results": results}, indent=2))
    if not ok:
        print("a run failed or printed no [EVAL] line: no comparison")
        return 1
    print(f"\n{args.preset}, {args.steps + args.skip} steps x {results[0]['tokens_per_step']} tokens = {summary['tokens']} tokens "
          f"each, device {results[0]['device']}")
    print(f"{'optimizer':<10}{'step s':>10}{'vs adamw':>10}{'MFU':>8}{'mem GiB':>9}{'train loss':>12}{'val loss':>10}"
          f"{'val bpb':>9}")
    for r in results:
        mem = f"{max(r['peak_mem_gib_per_gpu']):.1f}" if r["peak_mem_gib_per_gpu"] else "-"
        last = r["evals"][-1]
        print(f"{r['name']:<10}{r['median_step_s']:>10.4f}{r['median_step_s'] / results[0]['median_step_s']:>10.3f}"
              f"{r['mfu']:>8.3f}{mem:>9}{r['final_loss']:>12.4f}{last['val_loss']:>10.4f}{last['val_bpb']:>9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
