"""The judge's own FLOP count and MFU, recomputed from step records; never the engine's claim.

Count (Megatron-LM / ForgeTrain, so numbers compare with theirs), per trained token:

    6 x (matmul parameters)  +  6 x L x h_attn x s

- matmul parameters per layer: QKV  hidden x (num_heads + 2 x num_kv_heads) x head_dim   (GQA)
                               O    num_heads x head_dim x hidden
                               FC1  hidden x 2 x ffn   (SwiGLU gate and up)
                               FC2  ffn x hidden
  times num_layers, plus the LM head hidden x vocab. Embedding lookups, norms and biases count 0.
- 6 x L x h_attn x s, h_attn = num_heads x head_dim: QK^T and AV are 2 x s x h_attn FLOPs each per
  token in the forward pass, halved by the causal mask, and x3 for forward + backward.
- 6 = 2 FLOPs per multiply-add x (1 forward + 2 backward GEMMs). Activation recomputation is not
  counted (it is overhead, not model work).

Vocabulary: the TRUE vocab_size, not the padded one. Padding rows are not model work, and the pad
multiple is a config knob a run could turn to inflate its number. Megatron counts the padded vocab;
for MiniCPM4-8B (73448 -> 73472 at TP 1 or 2) that is 24 x 4096 x 6 FLOPs per token, 0.001% of the
total. `flops_per_token(..., vocab="padded")` gives Megatron's exact number when comparing.

Inputs: the model fields of the engine's resolved `<run_dir>/config.json`. The harness should check
those against the milestone's expected model before trusting them (a smaller model would inflate
nothing here, but it would change what was trained).

Step MFU = flops_per_token x tokens / (time_s x num_gpus x peak_tflops x 1e12). The summary is the
median over steady-state steps (first `skip_first` records dropped: allocator warm-up, JIT and
kernel compilation) with mean, spread and extremes, and a plausibility verdict: above the GEMM
ceiling (default 0.80 of peak: dense bf16 GEMMs on H100 reach ~0.75-0.8) is flagged implausible.

`time_s` is itself the engine's claim. Local jobs come with the harness's own clock (the arrival
time of every log line, harness/jobs/local.py); given it, the median spacing of consecutive [LOSS]
lines per step is held against the median claimed time_s. Claimed times well below the clock
inflate MFU (implausible); lines arriving much faster than the steps they report mean buffered
output, which leaves the times unverifiable (implausible too: the engine must flush each line).
"""

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.judge.logparse import StepRecord

__all__ = [
    "ModelShape",
    "MfuSummary",
    "COUNT_NAME",
    "H100_PEAK_TFLOPS",
    "GEMM_CEILING",
    "matmul_params",
    "flops_per_token",
    "step_mfu",
    "mfu",
    "expected_tokens_per_step",
    "clock_step_times",
    "CLOCK_TOLERANCE",
]

COUNT_NAME = "megatron: 6 x matmul params (QKV, O, FC1, FC2, LM head over the true vocab) + 6 x L x h_attn x s; embeddings 0"
H100_PEAK_TFLOPS = 989.0  # dense bf16, H100 SXM and H200 (no sparsity)
GEMM_CEILING = 0.80
_CLAIM_TOLERANCE = 0.10  # the engine's own MFU may differ (padded vocab, its own timer) but not by more
# The judge's clock (arrival of [LOSS] lines on its pipe) decides step times; a claimed time_s more than
# 5 % off it (understated, or lines arriving in bursts because output was buffered) is rejected.
CLOCK_TOLERANCE = 0.05
_SPREAD_WARNING = 0.20  # stdev / median of step MFU above this: noisy steps, the median is less telling

_MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "ffn_hidden_size", "seq_length")


@dataclass(kw_only=True, frozen=True)
class ModelShape:
    """The model fields of an EngineConfig that the FLOP count needs (names as in config.json)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    seq_length: int
    vocab_pad_multiple: int = 128
    tp: int = 1

    def __post_init__(self) -> None:
        for name in _MODEL_FIELDS + ("vocab_pad_multiple", "tp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{name} = {value!r}: expected a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.num_kv_heads = {self.num_kv_heads} does not divide num_heads = {self.num_heads}")

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.vocab_pad_multiple * self.tp
        return -(-self.vocab_size // multiple) * multiple

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelShape":
        """From a resolved EngineConfig as a dict (config.json); unrelated keys are ignored."""
        missing = [name for name in _MODEL_FIELDS if name not in config]
        if missing:
            raise ValueError(f"config lacks model fields {missing}; expected the engine's resolved config.json")
        extra = {k: config[k] for k in ("vocab_pad_multiple", "tp") if k in config}
        return cls(**{name: config[name] for name in _MODEL_FIELDS}, **extra)

    @classmethod
    def from_config_json(cls, path: str | Path) -> "ModelShape":
        return cls.from_config(_read_json_object(path))


def _read_json_object(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def expected_tokens_per_step(config: Mapping[str, Any]) -> int:
    """global_batch_size x seq_length of a resolved config: what each [LOSS] line's tokens must be."""
    gbs, seq = config.get("global_batch_size"), config.get("seq_length")
    if not isinstance(gbs, int) or not isinstance(seq, int) or gbs <= 0 or seq <= 0:
        raise ValueError(f"config has global_batch_size={gbs!r}, seq_length={seq!r}; expected the resolved config.json")
    return gbs * seq


def _vocab(model: ModelShape, vocab: str) -> int:
    if vocab == "true":
        return model.vocab_size
    if vocab == "padded":
        return model.padded_vocab_size
    raise ValueError(f"vocab = {vocab!r}: expected 'true' or 'padded'")


def matmul_params(model: ModelShape, *, vocab: str = "true") -> int:
    """Parameters of the GEMMs one token passes through (QKV, O, FC1, FC2 per layer; LM head)."""
    h, d = model.hidden_size, model.head_dim
    qkv = h * (model.num_heads + 2 * model.num_kv_heads) * d
    o = model.num_heads * d * h
    fc1 = h * 2 * model.ffn_hidden_size
    fc2 = model.ffn_hidden_size * h
    return model.num_layers * (qkv + o + fc1 + fc2) + h * _vocab(model, vocab)


def flops_per_token(model: ModelShape, *, vocab: str = "true") -> int:
    """Training FLOPs (forward + backward) per token; see the module docstring for the count."""
    attention = 6 * model.num_layers * model.num_heads * model.head_dim * model.seq_length
    return 6 * matmul_params(model, vocab=vocab) + attention


def step_mfu(record: StepRecord, flops: int, num_gpus: int, peak_tflops: float = H100_PEAK_TFLOPS) -> float:
    """MFU of one step from its tokens and time_s (not from its reported mfu)."""
    if record.tokens is None or record.time_s is None:
        raise ValueError(f"step {record.step} (line {record.line_no}) has no tokens / time_s; "
                         "for Megatron logs pass seq_length to parse_megatron_log")
    if not (math.isfinite(record.time_s) and record.time_s > 0):
        raise ValueError(f"step {record.step} (line {record.line_no}): time_s = {record.time_s} is not a positive time")
    return flops * record.tokens / (record.time_s * num_gpus * peak_tflops * 1e12)


@dataclass(kw_only=True, frozen=True)
class MfuSummary:
    """MFU over the steady-state steps, with enough context to print and to judge.

    `implausible` is True when any `implausible_reasons` exist: the number must not pass a gate.
    `warnings` are worth printing but do not invalidate the number.
    """

    median: float
    mean: float
    stdev: float  # 0.0 with a single step
    min: float
    max: float
    steps: tuple[int, ...]  # the step numbers used
    per_step: tuple[float, ...]
    skipped: int
    flops_per_token: int
    tokens_per_s_per_gpu: float  # median
    tflops_per_gpu: float  # median achieved TFLOP/s per GPU
    num_gpus: int
    peak_tflops: float
    ceiling: float
    reported_median: float | None  # the engine's own claim, for comparison only
    claimed_step_s: float  # median time_s of the steady steps
    clock_step_s: float | None  # median seconds per step between [LOSS] lines by the harness's clock
    clock_mfu: float | None  # MFU with the clock's step time instead of time_s
    implausible_reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    count: str = COUNT_NAME

    @property
    def implausible(self) -> bool:
        return bool(self.implausible_reasons)

    def describe(self) -> str:
        text = (f"MFU {self.median:.2%} (median of {len(self.per_step)} steps, mean {self.mean:.2%}, "
                f"stdev {self.stdev:.2%}, range {self.min:.2%}..{self.max:.2%}; {self.tflops_per_gpu:.1f} TFLOP/s/GPU "
                f"of {self.peak_tflops:g} on {self.num_gpus} GPUs; count {self.count})")
        if self.implausible_reasons:
            text += " IMPLAUSIBLE: " + "; ".join(self.implausible_reasons)
        return text


def clock_step_times(records: Sequence[StepRecord], line_times: Sequence[float]) -> list[tuple[int, float]]:
    """(step, seconds per step) by the harness's clock, between each record and the one before it.

    `line_times[i]` is when log line i + 1 arrived. A gap of several steps (log_every > 1) is divided
    by the number of steps; pairs where the step does not advance (a resumed run) are left out.
    """
    out = []
    for prev, cur in zip(records, records[1:], strict=False):
        if cur.source != "engine-log" or prev.source != "engine-log":
            raise ValueError("the clock check needs records parsed from the job's log (line numbers of that log)")
        gap = cur.step - prev.step
        if gap <= 0 or max(cur.line_no, prev.line_no) > len(line_times):
            continue
        out.append((cur.step, (line_times[cur.line_no - 1] - line_times[prev.line_no - 1]) / gap))
    return out


def mfu(records: Sequence[StepRecord], model: ModelShape, num_gpus: int, peak_tflops: float = H100_PEAK_TFLOPS,
        skip_first: int = 2, *, ceiling: float = GEMM_CEILING, vocab: str = "true",
        expected_tokens: int | None = None, line_times: Sequence[float] | None = None) -> MfuSummary:
    """Recompute MFU from each step's tokens and time_s; summarize the steps after `skip_first`.

    `records` in log order (the first `skip_first` are warm-up). `expected_tokens` (from
    `expected_tokens_per_step(config)`) checks each step's token count: a step claiming more tokens
    than the batch holds would inflate MFU, so a mismatch is implausible, not a warning.
    `line_times` (logparse.read_line_times of a local job's `<log>.times`) enables the clock check.
    """
    if num_gpus <= 0 or peak_tflops <= 0 or skip_first < 0 or not 0 < ceiling <= 1:
        raise ValueError(f"num_gpus={num_gpus}, peak_tflops={peak_tflops}, skip_first={skip_first}, ceiling={ceiling}: "
                         "expected positive GPUs and peak, skip_first >= 0, 0 < ceiling <= 1")
    steady = list(records)[skip_first:]
    if not steady:
        raise ValueError(f"no steady-state steps: {len(records)} records, skip_first={skip_first}")
    flops = flops_per_token(model, vocab=vocab)
    per_step = [step_mfu(r, flops, num_gpus, peak_tflops) for r in steady]

    implausible = []
    median = statistics.median(per_step)
    if median > ceiling:
        implausible.append(f"median MFU {median:.2%} is above the GEMM ceiling {ceiling:.0%} of peak")
    over_peak = [r.step for r, m in zip(steady, per_step, strict=True) if m > 1.0]
    if over_peak:
        implausible.append(f"steps {over_peak[:10]} claim more than 100% of peak (their time_s is too small)")
    if expected_tokens is not None:
        wrong = [(r.step, r.tokens) for r in records if r.tokens != expected_tokens]
        if wrong:
            implausible.append(f"tokens per step must be {expected_tokens} (global batch x seq_length); "
                               f"(step, tokens) {wrong[:5]} differ")

    warnings = []
    stdev = statistics.stdev(per_step) if len(per_step) > 1 else 0.0
    if stdev > _SPREAD_WARNING * median:
        warnings.append(f"step MFU varies a lot (stdev {stdev:.2%} vs median {median:.2%})")
    claims = [r.reported_mfu for r in steady if r.reported_mfu is not None and math.isfinite(r.reported_mfu)]
    reported = statistics.median(claims) if claims else None
    if reported is not None and abs(reported - median) > _CLAIM_TOLERANCE * median:
        warnings.append(f"the engine claims MFU {reported:.2%}, the judge counts {median:.2%}")
    if len(steady) < 3:
        warnings.append(f"only {len(steady)} steady-state steps")

    claimed_step_s = statistics.median(r.time_s for r in steady)  # type: ignore[type-var]
    clock_step_s = clock_mfu = None
    if line_times is not None:
        records = list(records)
        pairs = clock_step_times(records[max(0, skip_first - 1):], line_times)
        if pairs:
            clock_step_s = statistics.median(dt for _, dt in pairs)
            if clock_step_s > 0:
                tokens = statistics.median(r.tokens for r in steady)  # type: ignore[type-var]
                clock_mfu = flops * tokens / (clock_step_s * num_gpus * peak_tflops * 1e12)
            if claimed_step_s < (1 - CLOCK_TOLERANCE) * clock_step_s:
                implausible.append(f"claimed step time {claimed_step_s:.6f} s is below the judge's clock "
                                   f"{clock_step_s:.6f} s per step (more than {CLOCK_TOLERANCE:.0%} apart; "
                                   f"MFU by the clock: {clock_mfu:.2%})")
            elif claimed_step_s > (1 + CLOCK_TOLERANCE) * clock_step_s:
                implausible.append(f"[LOSS] lines arrive every {clock_step_s:.6f} s by the judge's clock but claim "
                                   f"{claimed_step_s:.6f} s steps (more than {CLOCK_TOLERANCE:.0%} apart): output is "
                                   "buffered or the times are made up")
        else:
            warnings.append("no consecutive steady steps to hold against the harness's clock")

    tokens_per_s = statistics.median(r.tokens / r.time_s / num_gpus for r in steady)
    return MfuSummary(
        median=median, mean=statistics.fmean(per_step), stdev=stdev, min=min(per_step), max=max(per_step),
        steps=tuple(r.step for r in steady), per_step=tuple(per_step), skipped=len(records) - len(steady),
        flops_per_token=flops, tokens_per_s_per_gpu=tokens_per_s, tflops_per_gpu=median * peak_tflops,
        num_gpus=num_gpus, peak_tflops=peak_tflops, ceiling=ceiling, reported_median=reported,
        claimed_step_s=claimed_step_s, clock_step_s=clock_step_s, clock_mfu=clock_mfu,
        implausible_reasons=tuple(implausible), warnings=tuple(warnings),
        count=COUNT_NAME if vocab == "true" else COUNT_NAME.replace("true vocab", "padded vocab"),
    )
