"""Produce milestones/alignment/refs/llama-tiny-hf-loss.jsonl: the 30-step HF reference trajectory.

What comes from the engine: only the inputs, i.e. the step-0 weights of `--seed 1234` (exported to HF
names with the engine's own export mapping, engine/checkpoint/hf_export.py) and the order of the training batches
(the engine's BatchLoader for that seed). Everything that is judged is HF / plain torch code:
- the model: transformers.LlamaForCausalLM (eager attention), fp32;
- the loss: sum of token cross-entropies over all micro-batches / the number of valid tokens;
- the optimizer: torch.optim.AdamW (single-tensor implementation, foreach=False), betas (0.9, 0.95),
  eps 1e-8, weight decay 0.1 on matrices and embeddings (ndim >= 2), none on norm gains;
- clipping: torch.nn.utils.clip_grad_norm_ at 1.0;
- the schedule: linear warmup lr * (s + 1) / W for the first W steps, then half a cosine from lr (step W)
  to 0.1 lr (the last step, N - 1), written out below (step s is 0-based; the [LOSS] line prints s + 1).

The engine job of milestones/alignment.toml runs exactly ENGINE_ARGV; the judge compares its [LOSS]
lines with this file (loss_rel_diff). Run from the repository root (see README.md beside this file):

    PYTHONPATH=. python milestones/alignment/make_reference.py
"""

import json
import math
import platform
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "refs" / "llama-tiny-hf-loss.jsonl"

# The job's argv in milestones/alignment.toml (less --run-dir); keep the two identical.
ENGINE_ARGV = [
    "pretrain", "--preset", "llama-tiny", "--device", "cpu", "--seed", "1234", "--compute-dtype", "fp32",
    "--seq-length", "64", "--micro-batch-size", "4", "--grad-accum-steps", "2", "--num-steps", "30",
    "--lr", "3e-3", "--warmup-steps", "5", "--lr-schedule", "cosine", "--min-lr-ratio", "0.1",
    "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8",
    "--grad-clip", "1.0", "--eval-samples", "0", "--no-save-final",
]
HP = dict(seed=1234, seq_length=64, micro_batch_size=4, grad_accum_steps=2, num_steps=30, lr=3e-3, warmup=5,
          min_lr_ratio=0.1, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, grad_clip=1.0)


def lr_at(step: int) -> float:
    peak, floor, warmup, total = HP["lr"], HP["lr"] * HP["min_lr_ratio"], HP["warmup"], HP["num_steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def engine_inputs(run_dir: Path):
    """(engine config, step-0 weights in HF names, the engine's batch loader) for HP's seed."""
    sys.path.insert(0, str(REPO))
    from engine.cli import build_parser, config_from_args
    from engine.config import resolve
    from engine.distributed import ParallelState
    from engine.checkpoint.hf_export import llama_config, to_llama_state_dict
    from engine.train import Trainer

    # The engine's own flag parsing, so the config is exactly what the judged job's argv means.
    cfg = resolve(config_from_args(build_parser().parse_args([*ENGINE_ARGV, "--run-dir", str(run_dir)])))
    assert (cfg.seed, cfg.seq_length, cfg.micro_batch_size, cfg.grad_accum_steps, cfg.num_steps, cfg.lr) == (
        HP["seed"], HP["seq_length"], HP["micro_batch_size"], HP["grad_accum_steps"], HP["num_steps"], HP["lr"])
    trainer = Trainer(cfg, ParallelState.single(torch.device("cpu")), torch.float32)
    weights = {n: p.detach().clone().float() for n, p in trainer.model.named_parameters()}
    conf = {k: v for k, v in llama_config(cfg, "float32").items() if k not in ("architectures", "temper", "torch_dtype")}
    return cfg, conf, to_llama_state_dict(cfg, weights), trainer.loader


def main() -> int:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg, conf, state, loader = engine_inputs(Path(tmp) / "run")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf, attn_implementation="eager")).float().train()
    model.load_state_dict(state, strict=True)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": HP["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=HP["lr"], betas=HP["betas"], eps=HP["eps"], foreach=False)
    rows = []
    for step in range(HP["num_steps"]):
        micro = loader.next_step()
        valid = sum(int((y != -100).sum()) for _, y in micro)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for x, y in micro:
            logits = model(input_ids=x).logits
            l_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=-100,
                                    reduction="sum")
            (l_sum / valid).backward()
            loss_sum += l_sum.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), HP["grad_clip"]).item()
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        rows.append({"step": step + 1, "global_loss": loss_sum / valid, "grad_norm": grad_norm, "lr": lr,
                     "tokens": HP["micro_batch_size"] * HP["grad_accum_steps"] * HP["seq_length"]})
        print(f"step {step + 1:3d} loss {loss_sum / valid:.9e} grad_norm {grad_norm:.6e} lr {lr:.6e}")
    meta = {"_meta": {
        "what": "HF transformers LlamaForCausalLM + torch.optim.AdamW trained from the engine's step-0 weights and "
                "data order; the reference of milestones/alignment.toml",
        "command": "PYTHONPATH=. python milestones/alignment/make_reference.py",
        "engine_argv": ENGINE_ARGV, "hyperparameters": HP,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "machine": platform.machine()},
        "seed": HP["seed"], "dtype": "float32", "device": "cpu",
    }}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(json.dumps(r) for r in [meta, *rows]) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({len(rows)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
