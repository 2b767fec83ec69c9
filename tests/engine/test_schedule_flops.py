"""LR schedules against their closed forms, and the MFU FLOP count against hand arithmetic."""

import math

import pytest

from engine.config import build_config, resolve
from engine.errors import ConfigError
from engine.flops import PEAK_FP8_TFLOPS, PEAK_TFLOPS, flops_per_token, matmul_params, mfu, peak_flops, peak_fp8_flops
from engine.optim import lr_at


def cfg_for(schedule, **kw):
    return resolve(build_config({"lr_schedule": schedule, "lr": 1.0, "min_lr_ratio": 0.1, "num_steps": 100,
                                 "warmup_steps": 10, **kw}))


def test_warmup_is_linear_to_peak():
    cfg = cfg_for("cosine")
    assert [lr_at(cfg, s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])


def test_cosine_endpoints_and_midpoint():
    cfg = cfg_for("cosine", num_steps=101)  # decay over steps 10..100: 90 intervals
    assert lr_at(cfg, 10) == pytest.approx(1.0)
    assert lr_at(cfg, 55) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert lr_at(cfg, 100) == pytest.approx(0.1)  # the last step trains at the minimum


def decayed(schedule: str, s: int, *, peak: float, floor: float, warmup: int, steps: int) -> float:
    """docs/configuration.md's schedule written out: warmup to peak, then from peak at step `warmup` to floor at the
    last step `steps - 1` (0-based); fraction x = (s - warmup) / (steps - 1 - warmup) of the way."""
    if s < warmup:
        return peak * (s + 1) / warmup
    x = (s - warmup) / (steps - 1 - warmup) if steps - 1 > warmup else 0.0
    return floor + (peak - floor) * ((1 + math.cos(math.pi * x)) / 2 if schedule == "cosine" else 1 - x)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("warmup,steps", [(0, 3), (1, 3), (2, 3), (10, 100), (0, 1), (5, 40)])
def test_decay_reaches_the_minimum_at_the_last_step(schedule, warmup, steps):
    """Every step against the closed form (float64 arithmetic both sides: 1e-12 relative is rounding); a 3-step
    cosine run with warmup 1 ends at lr x min_lr_ratio = 1e-3, not half way (5.5e-3)."""
    cfg = cfg_for(schedule, lr=1e-2, warmup_steps=warmup, num_steps=steps)
    want = [decayed(schedule, s, peak=1e-2, floor=1e-3, warmup=warmup, steps=steps) for s in range(steps)]
    assert [lr_at(cfg, s) for s in range(steps)] == pytest.approx(want, rel=1e-12)
    if steps - 1 > warmup:
        assert lr_at(cfg, steps - 1) == pytest.approx(1e-3, rel=1e-12)


def test_linear_and_constant():
    assert lr_at(cfg_for("linear", num_steps=101), 55) == pytest.approx(1.0 - 0.9 * 0.5)
    assert [lr_at(cfg_for("constant"), s) for s in (10, 50, 99)] == [1.0, 1.0, 1.0]


def test_wsd_stable_then_decays_to_min():
    cfg = cfg_for("wsd", decay_steps=20)
    assert lr_at(cfg, 50) == 1.0 and lr_at(cfg, 79) == 1.0
    assert lr_at(cfg, 80) == pytest.approx(1.0 - 0.9 / 20)
    assert lr_at(cfg, 99) == pytest.approx(0.1)
    default = cfg_for("wsd")  # decay defaults to 10% of the run
    assert lr_at(default, 89) == 1.0 and lr_at(default, 99) == pytest.approx(0.1)


def test_minicpm4_8b_flops_by_hand():
    cfg = resolve(build_config({"preset": "minicpm4-8b"}))
    h, L, f, v, s = 4096, 32, 16384, 73448, 4096
    qkv = h * (32 + 2 * 2) * 128
    per_layer = qkv + 4096 * h + h * 2 * f + f * h
    assert matmul_params(cfg) == L * per_layer + h * v
    assert flops_per_token(cfg) == 6 * (L * per_layer + h * v) + 6 * L * 4096 * s
    # 8B-class: ~7.88e9 matmul params -> 4.73e10 + attention 3.2e9 = ~5.05e10 FLOP per token
    assert 5.0e10 < flops_per_token(cfg) < 5.1e10
    # one step of 8 x 4096 tokens in 2.5 s on 8 GPUs at 989 TFLOP/s
    assert mfu(cfg, 8 * 4096, 2.5, 8, 989e12) == pytest.approx(flops_per_token(cfg) * 8 * 4096 / (2.5 * 8 * 989e12))


def test_fp8_peak_is_the_datasheet_dense_fp8_and_twice_bf16():
    """H100 / H200 SXM: 1,979 TFLOP/s dense FP8 (datasheet: 3,958 with sparsity) beside 989 bf16; only with --fp8."""
    fp8 = resolve(build_config({"fp8": "tensorwise"}))
    assert peak_fp8_flops(fp8, "NVIDIA H100 80GB HBM3") == 1979e12
    assert peak_fp8_flops(fp8, "NVIDIA H200") == 1979e12 and peak_flops(fp8, "NVIDIA H200") == 989e12
    for name, tflops in PEAK_FP8_TFLOPS.items():  # every FP8 part: about twice its bf16 peak (L40S 733 / 362)
        assert 2.0 <= tflops / PEAK_TFLOPS[name] < 2.03, name
    assert peak_fp8_flops(resolve(build_config({})), "NVIDIA H200") == 0.0  # --fp8 off: no FP8 MFU
    assert peak_fp8_flops(fp8, "cpu") == 0.0
    assert peak_fp8_flops(resolve(build_config({"fp8": "tensorwise", "peak_tflops": 500.0})), "cpu") == 1000e12
    with pytest.raises(ConfigError, match="--peak-tflops"):
        peak_fp8_flops(fp8, "NVIDIA A100-SXM4-80GB")  # no FP8 tensor cores (and --fp8 is refused there)


def _elapsed(step: int) -> float:
    return 0.3 * step + (5.0 * (step - 80) if step >= 80 else 0.0)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd", "wsd-warmdown"])
def test_schedule_fields_are_exactly_what_lr_at_reads(schedule):
    """engine/checkpoint/store.py refuses a resume that changes one of schedule_fields(): each of them must change
    some step's lr, and every other field of EngineConfig must change none (checked by perturbing it).
    wsd-warmdown: wsd with --warmdown-frac under a --max-wall-s budget of 40 s, read with 0.3 s per step that
    become 5.3 s from step 80 on (the steps decide the decay at first, the time at the end)."""
    from dataclasses import fields, replace

    from engine.config import EngineConfig
    from engine.optim.schedule import schedule_fields

    warmdown = schedule == "wsd-warmdown"
    schedule = schedule.removesuffix("-warmdown")
    base = cfg_for(schedule, warmdown_frac=0.3, max_wall_s=40.0) if warmdown else cfg_for(schedule, decay_steps=20)
    curve = [lr_at(base, s, _elapsed(s)) for s in range(150)]
    listed = set(schedule_fields(schedule, warmdown=warmdown))
    for f in fields(EngineConfig):
        value = getattr(base, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or f.name == "lr_schedule":
            continue
        other = replace(base, **{f.name: value + (5 if isinstance(value, int) else 0.05)})
        changed = [lr_at(other, s, _elapsed(s)) for s in range(150)] != curve
        assert changed == (f.name in listed), f"{f.name}: changes the schedule {changed}, listed {f.name in listed}"
