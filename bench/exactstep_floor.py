"""Per-tensor evidence for the exact-step check (harness/judge/claims/exactstep.py) on one finished GPU job.

Given the job's pretrain argv (its --save-dir holding checkpoints N - 1 and N), it states the batches of steps N and
N + 1 with the tree's own `engine batches` and prints, per tensor, how far from the judge's fp32 gradient of the exact
batch lie: the gradient the engine applied (from the Adam moments), the judge's own bf16 (+ FP8) pass, and two cheats
made from the honest checkpoints: "half" (the judge is told the step had batch N plus batch N + 1, so the engine
trained on half of it) and "next" (the judge is told batch N + 1); with --verdicts also the verdicts of
verify_exact_steps itself for the three (six more passes: ~2.5x the time). Writes everything as JSON; a short
table to stdout.

    python bench/exactstep_floor.py --label bf16 --out bf16.json -- pretrain --preset minicpm4-0.5b ... --save-dir D
"""

import argparse
import json
import math
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import torch

from harness.judge.baseconfig import engine_defaults, expected_config, flag_values
from harness.judge.claims import reference
from harness.judge.claims.batches import batches_argv, read_batches
from harness.judge.claims.checkpoint_reader import list_checkpoints, load_checkpoint
from harness.judge.claims.exactstep import (BF16, BF16_CAP, FLOOR_FACTOR, FP8_CAP, StepBatch, step_pairs,
                                            verify_exact_steps, weighted_rel)
from harness.judge.claims.fp8_reference import fp8_linear

REPO = Path(__file__).resolve().parent.parent


def grads_of(params, cfg, batch: StepBatch, device: str, *, bf16: bool = False, fp8: str = "off") -> dict:
    linear = fp8_linear(fp8) if fp8 != "off" else None
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        _, _, grads = reference.loss_and_grads(params, cfg, batch.inputs.to(device), batch.labels.to(device), linear=linear)
    return {k: g.double() for k, g in grads.items()}


def sq(t: torch.Tensor) -> float:
    return float(t.pow(2).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--verdicts", action="store_true", help="also run verify_exact_steps on the three")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- the job's pretrain argv")
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    defaults = engine_defaults((REPO / "engine" / "config.py").read_text())
    presets = tomllib.loads((REPO / "engine" / "model_spec.toml").read_text())
    expected = expected_config(argv, defaults=defaults, presets=presets)
    save_dir = Path(str(flag_values(argv)["save-dir"]))
    prev_path, path = step_pairs(list_checkpoints(save_dir))[-1]
    step = int(path.name.removeprefix("step_"))
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "engine", *batches_argv(argv, steps=[step, step + 1], world_size=1, out=Path(tmp))]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        batches = read_batches(Path(tmp) / "batches.json", seq_length=int(expected["seq_length"]),
                               vocab_size=int(expected["vocab_size"]))
    this, nxt = batches[step], batches[step + 1]
    whole = StepBatch(torch.cat([this.inputs, nxt.inputs]), torch.cat([this.labels, nxt.labels]))

    # the verdicts, as the judge gives them
    verdicts = {}
    for name, batch in (("honest", this), ("half", whole), ("next", nxt)) if args.verdicts else ():
        ev = verify_exact_steps([(prev_path, path)], expected_config=expected, printed_steps=[], batches={step: batch},
                                device=args.device)
        c = ev.checked[0] if ev.checked else None
        verdicts[name] = {"violations": ev.violations, **({k: c.as_dict()[k] for k in ("grad_rel", "grad_rel_plain",
                                                                                         "second_moment_rel", "floor")}
                                                           if c else {})}

    # per tensor
    prev = load_checkpoint(prev_path, kinds=("master",))
    cfg = reference.judged_config(expected, prev.config)
    b1, clip, fp8 = float(expected["adam_beta1"]), float(expected.get("grad_clip", 0.0)), str(expected.get("fp8", "off"))
    params = {k: v.to(args.device) for k, v in prev.masters.items()}
    del prev
    ref32 = {"honest": grads_of(params, cfg, this, args.device), "half": grads_of(params, cfg, whole, args.device),
             "next": grads_of(params, cfg, nxt, args.device)}
    own = grads_of(params, cfg, this, args.device, bf16=True, fp8=fp8)
    rows = {name: {"name": name, "numel": g.numel(), "own_err": sq(own[name] - g), "own_ref": sq(g)}
            for name, g in ref32["honest"].items()}  # the judge's own pass against its fp32 one, unclipped as the check
    own_rel = {n: r["own_err"] / r["own_ref"] if r["own_ref"] > 0 else 0.0 for n, r in rows.items()}
    del own
    for ref in ref32.values():  # the references clipped as the check clips them (by 1 for small late gradients)
        norm = math.sqrt(sum(sq(t) for t in ref.values()))
        for t in ref.values():
            t.mul_(min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0)
    a = load_checkpoint(prev_path, kinds=("exp_avg",))
    b = load_checkpoint(path, kinds=("exp_avg",))
    for name, row in rows.items():
        got = ((b.exp_avg[name].double() - b1 * a.exp_avg[name].double()) / (1 - b1)).to(args.device)
        for which, ref in ref32.items():
            row[f"{which}_ref"], row[f"{which}_err"] = sq(ref[name]), sq(got - ref[name])
    rows = list(rows.values())
    least = BF16.grad / FLOOR_FACTOR
    summary = {"floor_plain": math.sqrt(sum(r["own_err"] for r in rows) / sum(r["own_ref"] for r in rows)),
               "floor_weighted": weighted_rel({r["name"]: r["own_err"] for r in rows},
                                              {r["name"]: r["own_ref"] for r in rows}, own_rel, least)}
    cap = FP8_CAP.grad if fp8 != "off" else BF16_CAP.grad
    summary["bound"] = min(max(BF16.grad, FLOOR_FACTOR * summary["floor_weighted"]), cap)
    for which in ref32:
        err = {r["name"]: r[f"{which}_err"] for r in rows}
        ref = {r["name"]: r[f"{which}_ref"] for r in rows}
        summary[which] = {"plain": weighted_rel(err, ref, None, 0.0), "weighted": weighted_rel(err, ref, own_rel, least)}
    out = {"label": args.label, "step": step, "fp8": fp8, "argv": argv, "verdicts": verdicts, "summary": summary,
           "tensors": rows}
    args.out.write_text(json.dumps(out, indent=1))

    print(f"== {args.label}: step {step}, judge's own floor plain {summary['floor_plain']:.3f} weighted "
          f"{summary['floor_weighted']:.3f}, bound {summary['bound']:.3f}")
    for which in ref32:
        v = verdicts.get(which)
        said = "not asked (--verdicts)" if v is None else (
            f"{'ok' if not v['violations'] else 'REJECTED'} grad_rel {v.get('grad_rel', math.nan):.3f} v_rel "
            f"{v.get('second_moment_rel', math.nan):.3f} {[x[:90] for x in v['violations']]}")
        print(f"   {which:7} plain {summary[which]['plain']:.3f} weighted {summary[which]['weighted']:.3f} | verdict: {said}")
    worst = sorted(rows, key=lambda r: -r["honest_err"])[:8]
    print(f"   {'tensor':34} {'share_g2':>8} {'own':>6} {'engine':>6} {'half':>6} {'next':>6}")
    total = sum(r["honest_ref"] for r in rows)
    for r in worst:
        rel = {w: math.sqrt(r[f"{w}_err"] / r[f"{w}_ref"]) for w in ref32}
        print(f"   {r['name']:34} {r['honest_ref'] / total:8.4f} {math.sqrt(own_rel[r['name']]):6.3f} {rel['honest']:6.3f} "
              f"{rel['half']:6.3f} {rel['next']:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
