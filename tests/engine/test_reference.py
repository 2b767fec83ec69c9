"""The engine against independent references.

- Forward: with the llama-style preset and identical weights, the engine's logits and loss equal HF
  transformers' LlamaForCausalLM. Tolerance rel. 1e-5 in fp32: the two differ only in the order of
  floating-point reductions (fused QKV, SDPA vs eager attention).
- MiniCPM muP preset: the same comparison after folding the scalings into the weights (export-hf's
  mapping), which also checks the scalings themselves.
- Training: 20 steps of the engine equal a plain PyTorch loop (HF Llama + torch.optim.AdamW +
  clip_grad_norm_ + a closed-form cosine schedule) on the same batches within 1e-5 relative.
"""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.config import build_config, resolve
from engine.distributed import ParallelState
from engine.checkpoint.hf_export import llama_config, to_llama_state_dict
from engine.model import build_model
from engine.ops import resolve_ops
from engine.optim import describe_multipliers, lr_multipliers
from engine.train import Trainer
from tests.engine.adamw_reference import HIDDEN_MATRICES, cosine, param_groups, train_reference

transformers = pytest.importorskip("transformers")

CPU = torch.device("cpu")


def hf_llama(cfg, weights):
    conf = {k: v for k, v in llama_config(cfg, "float32").items() if k not in ("architectures", "temper", "torch_dtype")}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**conf)).eval()
    model.load_state_dict(to_llama_state_dict(cfg, weights), strict=True)
    return model


def engine_model(**overrides):
    cfg = resolve(build_config({"seq_length": 64, **overrides}))
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    return cfg, model


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("preset", ["llama-tiny", "tiny"])
def test_logits_and_loss_match_hf_llama(preset):
    torch.manual_seed(0)
    cfg, model = engine_model(preset=preset)
    hf = hf_llama(cfg, {n: p.detach() for n, p in model.named_parameters()})
    tokens = torch.randint(0, cfg.vocab_size, (2, 64))
    labels = torch.randint(0, cfg.vocab_size, (2, 64))
    labels[0, :5] = -100
    with torch.no_grad():
        ref = hf(tokens).logits
        ref_loss = F.cross_entropy(ref.reshape(-1, cfg.vocab_size), labels.reshape(-1), ignore_index=-100, reduction="sum")
        loss = model(tokens, labels)
    assert rel(model.logits(tokens), ref) < 1e-5
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < 1e-5


TRAIN = dict(preset="llama-tiny", device="cpu", seq_length=64, micro_batch_size=4, grad_accum_steps=2, num_steps=20,
             lr=3e-3, warmup_steps=4, min_lr_ratio=0.1, lr_schedule="cosine", weight_decay=0.1, grad_clip=0.5,
             eval_samples=0, save_final=False)


def plain_loop(trainer, model, cfg, forward, steps=20):
    """A plain PyTorch loop: .grad accumulation, torch.optim.AdamW (muP param groups when cfg.mup),
    clip_grad_norm_, closed-form LR.
    Yields (engine loss, engine grad norm, reference loss, reference grad norm) per step."""
    from engine.data.loader import BatchLoader

    opt = torch.optim.AdamW(param_groups(dict(model.named_parameters()), cfg), lr=cfg.lr,
                            betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, foreach=True)
    loader = BatchLoader(trainer.data.train, micro_batch_size=cfg.micro_batch_size,
                         grad_accum_steps=cfg.grad_accum_steps, dp_rank=0, dp_size=1, seed=cfg.seed)
    for step in range(steps):
        loss, grad_norm, lr = trainer.train_step()
        trainer.step += 1
        micro = loader.next_step()
        valid = sum(int((y != -100).sum()) for _, y in micro)
        opt.zero_grad(set_to_none=True)
        ref_loss = 0.0
        for x, y in micro:
            l_sum = forward(x, y)
            (l_sum / valid).backward()
            ref_loss += l_sum.item()
        ref_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
        scheduled = cosine(step, peak=cfg.lr, floor=cfg.lr * cfg.min_lr_ratio, warmup=cfg.warmup_steps,
                           total=cfg.num_steps)
        for group in opt.param_groups:
            group["lr"] = scheduled * group["mult"]
        opt.step()
        assert lr == pytest.approx(scheduled, rel=1e-12)
        yield loss, grad_norm, ref_loss / valid, ref_norm


@pytest.mark.parametrize("preset", ["llama-tiny", "tiny"])
def test_twenty_steps_match_plain_pytorch_adamw_on_the_same_model(tmp_path: Path, preset):
    """The trainer's machinery (flat fp32 grad buffer, fp32 masters, AdamW over shards, clipping,
    schedule, global-token loss normalisation) against a plain loop on an identical model.
    Losses: 1e-5 relative (observed <= 3e-6 over 20 steps). The two differ only in the order of the
    grad-norm summation (flat buffer vs per-tensor norms): ~1 ulp in the clip coefficient, which
    grows chaotically by a few ulps per step. Grad norms are more sensitive to that drift at a loss
    spike (observed <= 3e-4 after step 10), hence 1e-5 for the first 10 steps and 1e-3 after."""
    cfg = resolve(build_config({**TRAIN, "preset": preset, "run_dir": str(tmp_path / "run")}))
    trainer = Trainer(cfg, ParallelState.single(CPU), torch.float32)
    model = build_model(cfg, ParallelState.single(CPU), resolve_ops(cfg, CPU), torch.float32)
    model.load_state_dict(trainer.model.state_dict())
    for step, (loss, norm, ref_loss, ref_norm) in enumerate(plain_loop(trainer, model, cfg, model), start=1):
        assert abs(loss - ref_loss) / ref_loss < 1e-5, f"step {step}: {loss} vs {ref_loss}"
        assert abs(norm - ref_norm) / ref_norm < (1e-5 if step <= 10 else 1e-3), f"step {step}: {norm} vs {ref_norm}"
    assert loss < math.log(cfg.vocab_size) - 0.5  # and it learned something


@pytest.mark.slow  # ~41 s; by default: HF logits (tests/milestones/test_alignment.py) and 20 steps against plain PyTorch AdamW below
def test_twenty_steps_track_hf_llama_training(tmp_path: Path):
    """The same 20 steps against HF's LlamaForCausalLM as the model (fully independent code).
    Step 1 agrees to 1e-5 like the forward test; later steps drift because reduction-order
    differences of ~1e-7 in gradients are amplified by Adam wherever a gradient is near zero
    (m / sqrt(v) turns noise into full-size updates). Observed: <= 9e-6 over 20 steps (torch 2.13);
    the bound 2e-3 still catches any real difference in the update rule or the data."""
    cfg = resolve(build_config({**TRAIN, "run_dir": str(tmp_path / "run")}))
    trainer = Trainer(cfg, ParallelState.single(CPU), torch.float32)
    hf = hf_llama(cfg, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}).train()

    def forward(x, y):
        logits = hf(x).logits
        return F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1), ignore_index=-100, reduction="sum")

    worst = 0.0
    for step, (loss, norm, ref_loss, ref_norm) in enumerate(plain_loop(trainer, hf, cfg, forward), start=1):
        err = abs(loss - ref_loss) / ref_loss
        worst = max(worst, err)
        assert err < (1e-5 if step == 1 else 2e-3), f"step {step}: {loss} vs {ref_loss}"
    print(f"worst relative loss difference over 20 steps: {worst:.2e}")


def test_mup_learning_rates_match_torch_adamw_param_groups(tmp_path: Path):
    """MiniCPM's muP learning rates (tiny preset: hidden 128, dim_model_base 32): 20 engine steps against
    an independent loop, the judge's plain fp32 forward trained by torch.optim.AdamW with explicit param
    groups (hidden matrices at lr / 4; embedding, LM head and norm gains at lr; tests/engine/adamw_reference.py).
    Every tensor's final weights agree to 1e-4 of the distance it travelled (observed <= 1.1e-6: fp32
    reduction order only); the same loop with one lr for all tensors ends >= 0.1 away on every tensor
    (observed 0.16-1.05), so the comparison sees a dropped or changed multiplier."""
    cfg = resolve(build_config({**TRAIN, "preset": "tiny", "lr": 1e-2, "run_dir": str(tmp_path / "run")}))
    trainer = Trainer(cfg, ParallelState.single(CPU), torch.float32)
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert {n for n, m in trainer.lr_multipliers.items() if m != 1.0} == {n for n in initial if n.endswith(HIDDEN_MATRICES)}
    for _ in range(cfg.num_steps):
        trainer.train_step()
        trainer.step += 1
    engine = {n: p.detach() for n, p in trainer.model.named_parameters()}
    ref, _ = train_reference(initial, cfg, cfg.num_steps)
    uniform, _ = train_reference(initial, cfg, cfg.num_steps, mup_lr=False)
    for name, w in engine.items():
        travelled = (ref[name] - initial[name]).norm()
        assert ((w - ref[name]).norm() / travelled).item() < 1e-4, name
        assert ((w - uniform[name]).norm() / (uniform[name] - initial[name]).norm()).item() > 0.1, name


def test_multipliers_per_preset_and_their_header_line():
    """tiny (muP, hidden 128 / base 32): the four hidden matrices of every layer at 1/4, the rest at 1;
    llama-tiny (muP off): all at 1, so the llama-style presets train exactly as before."""
    cfg, model = engine_model(preset="tiny")
    mults = lr_multipliers(model, cfg)
    assert set(mults) == {n for n, _ in model.named_parameters()}
    assert {n for n, m in mults.items() if m == 0.25} == {n for n in mults if n.endswith(HIDDEN_MATRICES)}
    assert {m for m in mults.values()} == {0.25, 1.0} and len([m for m in mults.values() if m == 0.25]) == 4 * cfg.num_layers
    assert describe_multipliers(mults, cfg).startswith(
        "[RUN] optim lr multipliers (muP: hidden matrices at lr / (hidden 128 / dim_model_base 32)) "
        "x0.25: attn.qkv attn.o mlp.fc1 mlp.fc2; x1: lm_head embed.weight attn_norm.weight mlp_norm.weight "
        "final_norm.weight; weight decay 0.1 on 2-D tensors, decoupled")
    cfg, model = engine_model(preset="llama-tiny")
    assert set(lr_multipliers(model, cfg).values()) == {1.0}
    assert "(muP off: every parameter at lr) x1: lm_head embed.weight" in describe_multipliers(lr_multipliers(model, cfg), cfg)
