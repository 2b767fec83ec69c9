"""The judge's reference forward (harness/judge/claims/reference.py) against independent implementations.

- Llama-style config (mup off) vs transformers' LlamaForCausalLM, fp32 on CPU, same weights.
  Tolerance: logits atol 1e-4 (values of order 1-10; both sides are fp32 with different op orders:
  SDPA vs eager softmax attention, rsqrt placement, fused vs split projections -> differences of
  ~1e-6 relative per op, grown over 2 layers; 1e-4 is far below any real disagreement, which shows
  up at 1e-1), loss rel 1e-5.
- MiniCPM scalings (`tiny` preset) vs the engine's own forward in fp32 (tests only may import
  engine): logits atol 1e-4, loss rel 1e-5, for the same reasons.
- muP folding: MiniCPM scalings folded into the weights (as export-hf does) give the same logits
  with mup off, a check that needs neither engine nor transformers.
- Gradients (loss_and_grads, what the exact-step check holds a step's applied gradient against) vs
  HF's autograd on the same weights and labels (one masked), in one pass, in passes of one row and with
  each layer recomputed: relative L2 1e-5 per tensor (fp32 sums in another order, ~1e-7 seen).
- Packed documents (document_mask, reset_position_ids): each document of a packed row gives the
  logits the reference gives it alone (1e-5 relative: the same sums over other lengths), and the
  engine's --document-mask forward agrees (atol 1e-4, as above); without the EOS id it refuses.
"""

import math

import pytest
import torch

from harness.judge.claims import reference

LLAMA = {"vocab_size": 300, "vocab_pad_multiple": 128, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
         "num_kv_heads": 2, "head_dim": 16, "ffn_hidden_size": 96, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "mup": False}


def random_params(cfg: dict, seed: int = 0, std: float = 0.2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, d, nh, nkv, ffn = (cfg[k] for k in ("hidden_size", "head_dim", "num_heads", "num_kv_heads", "ffn_hidden_size"))
    padded = math.ceil(cfg["vocab_size"] / cfg["vocab_pad_multiple"]) * cfg["vocab_pad_multiple"]

    def rnd(*shape, s=std):
        return torch.randn(*shape, generator=gen) * s

    p = {"embed.weight": rnd(padded, h, s=1.0), "final_norm.weight": 1 + rnd(h, s=0.1), "lm_head": rnd(padded, h)}
    for i in range(cfg["num_layers"]):
        p |= {f"layers.{i}.attn_norm.weight": 1 + rnd(h, s=0.1), f"layers.{i}.attn.qkv": rnd((nh + 2 * nkv) * d, h),
              f"layers.{i}.attn.o": rnd(h, nh * d), f"layers.{i}.mlp_norm.weight": 1 + rnd(h, s=0.1),
              f"layers.{i}.mlp.fc1": rnd(2 * ffn, h), f"layers.{i}.mlp.fc2": rnd(h, ffn)}
    return p


def to_hf(cfg: dict, p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Engine names -> HF Llama names (written here from the layouts, not taken from engine/checkpoint/hf_export.py)."""
    v, d, nh, nkv = cfg["vocab_size"], cfg["head_dim"], cfg["num_heads"], cfg["num_kv_heads"]
    out = {"model.embed_tokens.weight": p["embed.weight"][:v], "model.norm.weight": p["final_norm.weight"],
           "lm_head.weight": p["lm_head"][:v]}
    for i in range(cfg["num_layers"]):
        q, k, vv = p[f"layers.{i}.attn.qkv"].split([nh * d, nkv * d, nkv * d])
        gate, up = p[f"layers.{i}.mlp.fc1"].chunk(2)
        hf = f"model.layers.{i}"
        out |= {f"{hf}.input_layernorm.weight": p[f"layers.{i}.attn_norm.weight"], f"{hf}.self_attn.q_proj.weight": q,
                f"{hf}.self_attn.k_proj.weight": k, f"{hf}.self_attn.v_proj.weight": vv,
                f"{hf}.self_attn.o_proj.weight": p[f"layers.{i}.attn.o"],
                f"{hf}.post_attention_layernorm.weight": p[f"layers.{i}.mlp_norm.weight"],
                f"{hf}.mlp.gate_proj.weight": gate, f"{hf}.mlp.up_proj.weight": up,
                f"{hf}.mlp.down_proj.weight": p[f"layers.{i}.mlp.fc2"]}
    return {k: t.contiguous() for k, t in out.items()}


def _hf_llama(cfg: dict):
    """transformers' LlamaForCausalLM for a Llama-style config of ours, fp32, eager attention."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["ffn_hidden_size"],
        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
        num_key_value_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"], rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"], max_position_embeddings=128, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, hidden_act="silu", torch_dtype="float32")
    hf_cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(hf_cfg).float()


def test_matches_hf_llama_fp32():
    cfg = LLAMA
    model = _hf_llama(cfg).eval()
    params = random_params(cfg)
    missing, unexpected = model.load_state_dict(to_hf(cfg, params), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    tokens = torch.randint(0, cfg["vocab_size"], (3, 49), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_logits = model(input_ids=tokens[:, :-1]).logits.float()
    ours = reference.logits(params, cfg, tokens[:, :-1])
    assert hf_logits.abs().max() > 1.0  # a non-trivial comparison
    torch.testing.assert_close(ours, hf_logits, atol=1e-4, rtol=1e-4)
    hf_loss = torch.nn.functional.cross_entropy(hf_logits.reshape(-1, cfg["vocab_size"]), tokens[:, 1:].reshape(-1))
    assert reference.loss(params, cfg, tokens) == pytest.approx(hf_loss.item(), rel=1e-5)


@pytest.mark.parametrize("rows_per_pass", [0, 1])
def test_gradients_match_hf_llama_autograd(rows_per_pass, monkeypatch):
    cfg = LLAMA
    params = random_params(cfg, seed=5)
    model = _hf_llama(cfg)
    model.load_state_dict(to_hf(cfg, params), strict=False)
    gen = torch.Generator().manual_seed(6)
    inputs = torch.randint(0, cfg["vocab_size"], (3, 40), generator=gen)
    labels = torch.randint(0, cfg["vocab_size"], (3, 40), generator=gen)
    labels[1, :5] = reference.IGNORE_INDEX
    logits = model(input_ids=inputs).logits.float()
    hf_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), labels.reshape(-1),
                                                ignore_index=reference.IGNORE_INDEX)
    hf_loss.backward()
    hf_grads = {name: p.grad for name, p in model.named_parameters()}
    if rows_per_pass == 1:  # the large-model path: one row per pass, every layer recomputed in backward
        monkeypatch.setattr(reference, "_LARGE_MODEL", 0)
    loss, count, grads = reference.loss_and_grads(params, cfg, inputs, labels, rows_per_pass=rows_per_pass)
    assert count == 3 * 40 - 5 and loss == pytest.approx(hf_loss.item(), rel=1e-5)
    ours = to_hf(cfg, grads)
    for name, want in hf_grads.items():
        assert want.norm() > 0, name
        assert ((ours[name] - want).norm() / want.norm()).item() < 1e-5, name
    assert grads["embed.weight"][cfg["vocab_size"]:].abs().max() == 0  # padding rows are never looked up


def test_mup_scalings_fold_into_weights():
    cfg = LLAMA | {"mup": True, "scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 16}
    params = random_params(cfg, std=0.1)
    s = reference.scalings(cfg)
    assert (s.emb, s.residual, s.logit_divisor) == (12.0, 1.4 / math.sqrt(2), 4.0)
    folded = dict(params)
    folded["embed.weight"] = params["embed.weight"] * s.emb
    folded["lm_head"] = params["lm_head"] / s.logit_divisor
    for i in range(cfg["num_layers"]):
        for name in (f"layers.{i}.attn.o", f"layers.{i}.mlp.fc2"):
            folded[name] = params[name] * s.residual
    tokens = torch.randint(0, cfg["vocab_size"], (2, 33), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(reference.logits(params, cfg, tokens), reference.logits(folded, LLAMA, tokens),
                               atol=1e-4, rtol=1e-4)


def test_matches_engine_forward_tiny_preset():
    from engine.config import build_config, resolve, to_dict
    from engine.distributed import ParallelState
    from engine.model import build_model
    from engine.ops import resolve_ops

    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "compute_dtype": "fp32", "seq_length": 64}))
    assert cfg.mup and cfg.scale_emb != 1.0  # the MiniCPM scalings are exercised
    par = ParallelState(rank=0, world_size=1, tp_rank=0, tp_size=1, dp_rank=0, dp_size=1, device=torch.device("cpu"))
    model = build_model(cfg, par, resolve_ops(cfg, torch.device("cpu")), torch.float32)
    params = random_params(to_dict(cfg), seed=3, std=0.1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    tokens = torch.randint(0, cfg.vocab_size, (2, 65), generator=torch.Generator().manual_seed(4))
    engine_logits = model.logits(tokens[:, :-1]).float()
    torch.testing.assert_close(reference.logits(params, to_dict(cfg), tokens[:, :-1]), engine_logits, atol=1e-4, rtol=1e-4)
    engine_loss = model(tokens[:, :-1], tokens[:, 1:]).item() / tokens[:, 1:].numel()
    assert reference.loss(params, to_dict(cfg), tokens) == pytest.approx(engine_loss, rel=1e-5)


def test_missing_config_field_is_named():
    cfg = dict(LLAMA)
    del cfg["rope_theta"]
    with pytest.raises(KeyError, match="rope_theta"):
        reference.logits(random_params(LLAMA), cfg, torch.zeros(1, 4, dtype=torch.int64))


EOS = 257


def packed(vocab: int, lengths: tuple[int, ...], seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One row of documents, each but the last ending with EOS (the only EOS: other ids stay below 256)."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, min(vocab, 256), (n,), generator=g) for n in lengths]
    for d in docs[:-1]:
        d[-1] = EOS
    return torch.cat(docs)[None], docs


@pytest.mark.parametrize("reset", [True, False])
def test_document_mask_reads_each_document_alone(reset):
    cfg = LLAMA | {"vocab_size": 300, "mup": True, "scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 16,
                   "document_mask": True, "reset_position_ids": reset}
    params = random_params(cfg, seed=5, std=0.1)
    row, docs = packed(cfg["vocab_size"], (6, 1, 13, 9), seed=6)
    whole = reference.logits(params, cfg, row, eos_id=EOS)
    start = 0
    for d in docs:
        alone = reference.logits(params, cfg, d[None], eos_id=EOS)
        part = whole[:, start:start + len(d)]
        assert ((part - alone).norm() / alone.norm()).item() < 1e-5
        start += len(d)
    unmasked = reference.logits(params, LLAMA | {"vocab_size": 300, "mup": True, "scale_emb": 12.0, "scale_depth": 1.4,
                                                 "dim_model_base": 16}, row)
    assert ((unmasked - whole).norm() / whole.norm()).item() > 1e-2  # the mask is not a no-op here


@pytest.mark.parametrize("reset", [True, False])
def test_document_mask_matches_engine_forward(reset):
    from engine.config import build_config, resolve, to_dict
    from engine.distributed import ParallelState
    from engine.model import batch_documents, build_model
    from engine.ops import resolve_ops

    cfg = resolve(build_config({"preset": "tiny", "device": "cpu", "compute_dtype": "fp32", "seq_length": 64,
                                "document_mask": True, "reset_position_ids": reset}))
    model = build_model(cfg, ParallelState.single(torch.device("cpu")), resolve_ops(cfg, torch.device("cpu")),
                        torch.float32)
    params = random_params(to_dict(cfg), seed=3, std=0.1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    rows = torch.cat([packed(cfg.vocab_size, (20, 1, 30, 13), seed=7)[0], packed(cfg.vocab_size, (64,), seed=8)[0]])
    ours = model.logits(rows, batch_documents(cfg, rows, EOS, torch.device("cpu"))).float()
    torch.testing.assert_close(reference.logits(params, to_dict(cfg), rows, eos_id=EOS), ours, atol=1e-4, rtol=1e-4)


def test_document_mask_without_eos_is_refused():
    cfg = LLAMA | {"document_mask": True}
    with pytest.raises(ValueError, match="EOS"):
        reference.logits(random_params(LLAMA), cfg, torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="reset_position_ids without document_mask"):
        reference.logits(random_params(LLAMA), LLAMA | {"reset_position_ids": True}, torch.zeros(1, 4, dtype=torch.int64))


@pytest.mark.parametrize("rows_per_pass", [0, 1])
def test_masked_gradients_match_hf_llama_on_each_document_alone(rows_per_pass, monkeypatch):
    """document_mask + reset_position_ids: a packed row is its documents side by side, so loss_and_grads of the
    batch (sum over its labels / their count) and its gradient are HF LlamaForCausalLM's autograd over each
    document alone, positions from 0, summed. Labels are the row's next tokens (the EOS's label is the next
    document's first token, as the engine trains it), two masked. Passes of one row with every layer recomputed
    (the large-model path) too. Tolerance: relative L2 1e-5 per tensor, as for the unmasked gradients."""
    cfg = LLAMA | {"document_mask": True, "reset_position_ids": True}
    params = random_params(LLAMA, seed=7)
    model = _hf_llama(LLAMA)
    model.load_state_dict(to_hf(LLAMA, params), strict=False)
    rows = [packed(cfg["vocab_size"], (6, 1, 13, 21), seed=8), packed(cfg["vocab_size"], (41,), seed=9)]
    tokens = torch.cat([row for row, _ in rows])
    inputs, labels = tokens[:, :-1], tokens[:, 1:].clone()
    labels[0, 3], labels[1, 30] = reference.IGNORE_INDEX, reference.IGNORE_INDEX
    count = int((labels != reference.IGNORE_INDEX).sum())
    total = torch.zeros(())
    for r, (_, docs) in enumerate(rows):
        start = 0
        for doc in docs:
            end = min(start + len(doc), inputs.shape[1])
            out = model(input_ids=inputs[r:r + 1, start:end]).logits.float()
            total = total + torch.nn.functional.cross_entropy(out.reshape(-1, cfg["vocab_size"]), labels[r, start:end],
                                                              ignore_index=reference.IGNORE_INDEX, reduction="sum")
            start = end
    (total / count).backward()
    if rows_per_pass == 1:
        monkeypatch.setattr(reference, "_LARGE_MODEL", 0)
    loss, got_count, grads = reference.loss_and_grads(params, cfg, inputs, labels, rows_per_pass=rows_per_pass,
                                                      eos_id=EOS)
    assert got_count == count and loss == pytest.approx(total.item() / count, rel=1e-5)
    ours = to_hf(LLAMA, grads)
    for name, p in model.named_parameters():
        assert p.grad.norm() > 0, name
        assert ((ours[name] - p.grad).norm() / p.grad.norm()).item() < 1e-5, name
    with pytest.raises(ValueError, match="EOS"):
        reference.loss_and_grads(params, cfg, inputs, labels)


_RECOMPUTE_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
import torch
from harness.judge.claims import reference
from harness.judge.judging import judge_caches
sys.path.insert(0, sys.argv[1])
from test_reference import LLAMA, random_params
reference._LARGE_MODEL = 0  # the large-model path: every layer recomputed in backward
inputs = torch.randint(0, LLAMA["vocab_size"], (2, 8))
run = lambda: reference.loss_and_grads(random_params(LLAMA), LLAMA, inputs, inputs.clone())
if sys.argv[2] == "judge":
    with judge_caches(Path(sys.argv[3])):
        run()
else:
    run()
"""


@pytest.mark.parametrize("inside", [True, False])
def test_the_judges_recompute_leaves_nothing_in_tmpdir(tmp_path, inside):
    """The large-model path recomputes layers with torch.utils.checkpoint, which imports torch._dynamo, which makes
    Inductor's cache folder in $TMPDIR. Inside the judge's `judge_caches` that folder is the judging's own (removed
    with it); outside, the control shows torch's default, so the check can fail."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tmp, own = tmp_path / "tmp", tmp_path / "own"
    tmp.mkdir()
    here = str(Path(__file__).parent)
    env = {**os.environ, "TMPDIR": str(tmp)}
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(key, None)
    subprocess.run([sys.executable, "-c", _RECOMPUTE_IN_A_FRESH_PROCESS, here, "judge" if inside else "plain", str(own)],
                   env=env, check=True, timeout=300)
    left = sorted(p.name for p in tmp.iterdir())
    if inside:
        assert left == [] and (own / ".inductor").is_dir()
    else:
        assert [n for n in left if n.startswith("torchinductor_")]
