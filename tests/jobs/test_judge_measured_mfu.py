"""The judge's FLOP count and MFU, checked three independent ways:
1. hand arithmetic for MiniCPM4-8B (written out below);
2. parameter counts of real modules: HF transformers' LlamaForCausalLM with MiniCPM4-8B's shapes (on
   the meta device: no memory), whose nn.Linear weights are exactly the GEMMs of the count;
3. FLOPs measured by torch.utils.flop_counter on forward + backward of a small decoder built here,
   with full (unmasked-cost) attention GEMMs, so measured = count + the causal half it skips.
Integers throughout, so equality is exact; MFU values are compared to 1e-12 relative (float division).
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from harness.judge.logparse import StepRecord, parse_engine_log
from harness.judge.claims.measured_mfu import (
    ModelShape,
    clock_step_times,
    expected_tokens_per_step,
    flops_per_token,
    matmul_params,
    mfu,
    step_mfu,
)

__all__: list[str] = []

MINICPM4_8B = dict(vocab_size=73448, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=2, head_dim=128,
                   ffn_hidden_size=16384, seq_length=4096)


def test_minicpm4_8b_by_hand() -> None:
    m = ModelShape(**MINICPM4_8B)
    # Per layer:
    #   QKV  4096 x (32 + 2 x 2) x 128  = 4096 x 4608  =  18,874,368
    #   O    32 x 128 x 4096            =                16,777,216
    #   FC1  4096 x 2 x 16384           =               134,217,728
    #   FC2  16384 x 4096               =                67,108,864
    #   sum                                             236,978,176
    # x 32 layers                                     7,583,301,632
    # LM head 4096 x 73448                              300,843,008
    # matmul params N                                 7,884,144,640
    assert matmul_params(m) == 7_884_144_640
    # 6 N                                            47,304,867,840
    # attention 6 x 32 x (32 x 128) x 4096            3,221,225,472
    # per token                                      50,526,093,312
    assert flops_per_token(m) == 50_526_093_312
    # Padded vocab (Megatron's count): 73448 -> 73472 (multiple of 128), 24 more rows x 4096 x 6.
    assert m.padded_vocab_size == 73472
    assert flops_per_token(m, vocab="padded") - flops_per_token(m) == 24 * 4096 * 6 == 589_824
    # MFU: 8 GPUs, 1 step of 64 x 4096 tokens in 4.2 s at 989 TFLOP/s peak
    #   50,526,093,312 x 262,144 / (4.2 x 8 x 989e12) = 13,245,112,205,180,928 / 3.32304e16 = 0.3985842
    rec = StepRecord(step=1, loss=None, grad_norm=None, lr=None, tokens=262_144, time_s=4.2, source="test", line_no=1)
    assert step_mfu(rec, flops_per_token(m), num_gpus=8) == pytest.approx(0.3985842, rel=1e-6)
    assert step_mfu(rec, flops_per_token(m), 8) == pytest.approx(50_526_093_312 * 262_144 / (4.2 * 8 * 989e12), rel=1e-12)


def test_matmul_params_equal_hf_llama_linear_weights() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=73448, hidden_size=4096, intermediate_size=16384, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=2, head_dim=128, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, nn.Linear))
    embedding = model.model.embed_tokens.weight.numel()
    assert linear == matmul_params(ModelShape(**MINICPM4_8B))
    # The count leaves out exactly the embedding and the norms: nothing else has parameters.
    norms = (2 * 32 + 1) * 4096
    assert sum(p.numel() for p in model.parameters()) == linear + embedding + norms


class _Block(nn.Module):
    """A MiniCPM/Llama decoder layer with explicit attention GEMMs (flop_counter sees q@k^T and p@v)."""

    def __init__(self, m: ModelShape):
        super().__init__()
        self.m = m
        h, d = m.hidden_size, m.head_dim
        self.q = nn.Linear(h, m.num_heads * d, bias=False)
        self.k = nn.Linear(h, m.num_kv_heads * d, bias=False)
        self.v = nn.Linear(h, m.num_kv_heads * d, bias=False)
        self.o = nn.Linear(m.num_heads * d, h, bias=False)
        self.gate = nn.Linear(h, m.ffn_hidden_size, bias=False)
        self.up = nn.Linear(h, m.ffn_hidden_size, bias=False)
        self.down = nn.Linear(m.ffn_hidden_size, h, bias=False)
        self.norm1 = nn.RMSNorm(h)
        self.norm2 = nn.RMSNorm(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, (b, s, _) = self.m, x.shape
        rep = m.num_heads // m.num_kv_heads
        y = self.norm1(x)
        q = self.q(y).view(b, s, m.num_heads, m.head_dim).transpose(1, 2)
        k = self.k(y).view(b, s, m.num_kv_heads, m.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
        v = self.v(y).view(b, s, m.num_kv_heads, m.head_dim).transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(m.head_dim)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def test_count_matches_flops_measured_on_a_real_forward_backward() -> None:
    m = ModelShape(vocab_size=100, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                   ffn_hidden_size=96, seq_length=32)
    batch = 2
    torch.manual_seed(0)
    emb = nn.Embedding(m.vocab_size, m.hidden_size)
    blocks = nn.ModuleList(_Block(m) for _ in range(m.num_layers))
    head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)
    ids = torch.randint(0, m.vocab_size, (batch, m.seq_length + 1))
    with FlopCounterMode(display=False) as counter:
        x = emb(ids[:, :-1])
        for block in blocks:
            x = block(x)
        F.cross_entropy(head(x).flatten(0, 1), ids[:, 1:].flatten()).backward()
    tokens = batch * m.seq_length
    measured_per_token, remainder = divmod(counter.get_total_flops(), tokens)
    assert remainder == 0
    # The dense attention GEMMs here cost the full s x s; the count takes the causal half of it.
    full_minus_causal = 6 * m.num_layers * m.num_heads * m.head_dim * m.seq_length
    assert measured_per_token - full_minus_causal == flops_per_token(m)


def test_count_equals_megatron_formula_with_padded_vocab() -> None:
    # Megatron-LM's transformer count, per token, rebuilt from its published structure:
    #   3 x [ 4 h h_attn (1 + g/n) / ... ] -> written out term by term below.
    m = ModelShape(**MINICPM4_8B, tp=2)
    h, n, g, d, s, f, L = 4096, 32, 2, 128, 4096, 16384, 32
    h_attn = n * d
    attn_fwd = 4 * h * h_attn * (1 + g / n) + 2 * s * h_attn  # QKV + O GEMMs; q@k^T and p@v causal
    mlp_fwd = 6 * h * f  # SwiGLU: 3 GEMMs of h x f
    logits_fwd = 2 * h * m.padded_vocab_size
    megatron = 3 * (L * (attn_fwd + mlp_fwd) + logits_fwd)
    assert m.padded_vocab_size == 73472  # multiple of 128 x TP 2 = 256
    assert flops_per_token(m, vocab="padded") == megatron


def test_model_shape_from_config_json(tmp_path: Path) -> None:
    config = {**MINICPM4_8B, "preset": "minicpm4-8b", "global_batch_size": 64, "tp": 2, "vocab_pad_multiple": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    shape = ModelShape.from_config_json(path)
    assert shape == ModelShape(**MINICPM4_8B, tp=2, vocab_pad_multiple=128)
    assert expected_tokens_per_step(config) == 64 * 4096
    with pytest.raises(ValueError, match="lacks model fields"):
        ModelShape.from_config({"hidden_size": 4096})
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelShape(**MINICPM4_8B | {"num_kv_heads": 3})


# --- summaries -----------------------------------------------------------------------------------

TINY = ModelShape(vocab_size=1000, hidden_size=100, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=50,
                  ffn_hidden_size=300, seq_length=10)


def _records(times: list[float], tokens: int = 1000, claim: float | None = None) -> list[StepRecord]:
    return [StepRecord(step=i + 1, loss=1.0, grad_norm=1.0, lr=1e-3, tokens=tokens, time_s=t, reported_mfu=claim,
                       source="test", line_no=i + 1) for i, t in enumerate(times)]


def test_summary_skips_warmup_and_takes_the_median() -> None:
    fpt = flops_per_token(TINY)
    # TINY: per layer QKV 100 x 200 = 20,000; O 10,000; FC1 60,000; FC2 30,000 -> 120,000; x2 = 240,000;
    # head 100,000 -> N = 340,000; 6N = 2,040,000; attention 6 x 2 x 100 x 10 = 12,000 -> 2,052,000.
    assert fpt == 2_052_000
    peak = 1e-3  # 1 GFLOP/s, so that the tiny model has human-sized MFUs
    # MFU of a step = 2,052,000 x 1000 / (t x 2 GPUs x 1e9) = 1.026 / t
    times = [50.0, 9.0, 2.0, 2.5, 2.0, 4.0]  # two warm-up steps, then 0.513, 0.4104, 0.513, 0.2565
    summary = mfu(_records(times, claim=0.9), TINY, num_gpus=2, peak_tflops=peak, skip_first=2)
    assert summary.steps == (3, 4, 5, 6) and summary.skipped == 2
    assert summary.per_step == pytest.approx((0.513, 0.4104, 0.513, 0.2565), rel=1e-12)
    assert summary.median == pytest.approx((0.4104 + 0.513) / 2, rel=1e-12)
    assert summary.mean == pytest.approx((0.513 * 2 + 0.4104 + 0.2565) / 4, rel=1e-12)
    assert (summary.min, summary.max) == pytest.approx((0.2565, 0.513), rel=1e-12)
    assert summary.tflops_per_gpu == pytest.approx(summary.median * peak, rel=1e-12)
    # median of the steps' rates 250, 200, 250, 125 tokens/s/GPU (not the rate at the median time)
    assert summary.tokens_per_s_per_gpu == pytest.approx(225.0, rel=1e-12)
    assert not summary.implausible
    assert summary.reported_median == 0.9 and any("engine claims MFU 90.00%" in w for w in summary.warnings)
    assert any("varies a lot" in w for w in summary.warnings)  # stdev 0.12 > 20% of the median
    assert "true vocab" in summary.describe()


def test_mfu_above_the_gemm_ceiling_is_implausible() -> None:
    fine = mfu(_records([2.0] * 4), TINY, num_gpus=2, peak_tflops=1e-3, skip_first=1)  # 0.513
    assert not fine.implausible and not fine.warnings
    high = mfu(_records([1.2] * 4), TINY, num_gpus=2, peak_tflops=1e-3, skip_first=1)  # 0.855
    assert high.implausible and "GEMM ceiling 80%" in high.implausible_reasons[0]
    assert "IMPLAUSIBLE" in high.describe()
    assert mfu(_records([1.2] * 4), TINY, num_gpus=2, peak_tflops=1e-3, skip_first=1, ceiling=0.9).implausible is False


def test_single_step_faster_than_physics_is_implausible() -> None:
    summary = mfu(_records([2.0, 2.0, 2.0, 0.5, 2.0]), TINY, num_gpus=2, peak_tflops=1e-3, skip_first=1)  # step 4: 2.052
    assert summary.median == pytest.approx(0.513) and summary.implausible
    assert "steps [4] claim more than 100% of peak" in summary.implausible_reasons[0]


def test_token_counts_must_match_the_batch() -> None:
    recs = _records([2.0] * 4, tokens=1000)
    assert not mfu(recs, TINY, 2, 1e-3, 1, expected_tokens=1000).implausible
    inflated = mfu(recs, TINY, 2, 1e-3, 1, expected_tokens=500)
    assert inflated.implausible and "tokens per step must be 500" in inflated.implausible_reasons[0]


def test_bad_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="no steady-state steps"):
        mfu(_records([1.0, 1.0]), TINY, 1, skip_first=2)
    with pytest.raises(ValueError, match="time_s = 0.0 is not a positive time"):
        mfu(_records([1.0, 0.0]), TINY, 1, skip_first=0)
    no_tokens = [StepRecord(step=1, loss=1.0, grad_norm=None, lr=None, tokens=None, time_s=1.0, source="m", line_no=1)]
    with pytest.raises(ValueError, match="pass seq_length"):
        mfu(no_tokens, TINY, 1, skip_first=0)
    with pytest.raises(ValueError, match="vocab"):
        flops_per_token(TINY, vocab="rounded")


def test_engine_log_to_mfu_end_to_end() -> None:
    m = ModelShape(**MINICPM4_8B)
    tokens = 64 * 4096
    line = "[LOSS] step=%d global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=%d time_s=%.6f mfu=%.4f"
    log = "\n".join(line % (i, 3.0, 1.0, 1e-2, tokens, t, 0.40) for i, t in enumerate([30.0, 6.0, 4.2, 4.2, 4.3], 1))
    summary = mfu(parse_engine_log(log), m, num_gpus=8, skip_first=2, expected_tokens=tokens)
    assert summary.median == pytest.approx(50_526_093_312 * tokens / (4.2 * 8 * 989e12), rel=1e-12)
    assert not summary.implausible and summary.warnings == ()


# --- the harness's clock against claimed step times (real local jobs) ----------------------------

STEPPER = """
import sys, time
claim = float(sys.argv[1])  # 0: report the measured time honestly
for step in range(1, 9):
    t0 = time.perf_counter()
    time.sleep(0.2)  # the "step"
    took = time.perf_counter() - t0
    print("[LOSS] step=%d global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=%d time_s=%.6f mfu=%.4f"
          % (step, 3.0, 1.0, 1e-3, 1000, claim or took, 0.5))
"""


def test_clock_check_catches_understated_and_buffered_step_times(tmp_path: Path) -> None:
    import sys

    from harness.jobs import JobSpec, launch
    from harness.judge.logparse import read_line_times

    def spec(name: str, claim: float, env: dict[str, str]) -> JobSpec:
        return JobSpec(name=name, argv=[sys.executable, "-c", STEPPER, str(claim)], log_path=tmp_path / f"{name}.log",
                       env=env, timeout_s=120)

    # Run side by side: ~2 s in all. The honest job's claim and the clock measure the same sleeps, so
    # their ratio stays near 1 under any load; the others are off by 20x and by "all at once".
    jobs = [launch(spec("honest", 0, {})), launch(spec("understated", 0.01, {})),
            launch(spec("buffered", 0, {"PYTHONUNBUFFERED": ""}))]  # empty = unset: block-buffered pipe
    summaries = {}
    for job in jobs:
        result = job.wait(poll_s=0.05)
        assert result.state == "completed", result.read_log()
        # peak 1 TFLOP/s: honest MFU ~1%, understated ~20%: only the clock check can object.
        summaries[result.name] = mfu(parse_engine_log(result.read_log()), TINY, num_gpus=1, peak_tflops=1.0,
                                     skip_first=1, line_times=read_line_times(result.line_times_path))
    honest = summaries["honest"]
    assert not honest.implausible, honest.implausible_reasons
    assert honest.clock_step_s is not None and honest.clock_mfu is not None
    understated = summaries["understated"]
    assert understated.implausible_reasons and "below the judge's clock" in understated.implausible_reasons[0]
    assert understated.clock_mfu is not None and understated.clock_mfu < understated.median / 5
    buffered = summaries["buffered"]
    assert buffered.implausible_reasons and "output is buffered" in buffered.implausible_reasons[0]


def test_clock_step_times_per_step_gap_and_resume() -> None:
    recs = [StepRecord(step=s, loss=1.0, grad_norm=1.0, lr=1.0, tokens=1, time_s=1.0, source="engine-log", line_no=n)
            for s, n in [(1, 2), (3, 4), (2, 5), (3, 7)]]
    times = [0.0, 1.0, 1.5, 3.5, 4.0, 4.2, 5.0]
    # steps 1 -> 3 (lines 2 -> 4): 3.5 - 1.0 = 2.5 s over 2 steps; 3 -> 2 goes back (a resume): left
    # out; 2 -> 3 (lines 5 -> 7): 5.0 - 4.0 = 1.0 s
    assert clock_step_times(recs, times) == [(3, 1.25), (3, 1.0)]
    jsonl = [StepRecord(step=1, loss=1.0, grad_norm=1.0, lr=1.0, tokens=1, time_s=1.0, source="metrics-jsonl", line_no=1)] * 2
    with pytest.raises(ValueError, match="records parsed from the job's log"):
        clock_step_times(jsonl, times)
