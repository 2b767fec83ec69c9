"""What a judging draws (harness/judge/draws.py), the [draw] table that says it (harness/spec/), the formula a
milestone states its learning rate with (harness/formula.py) and the contract check that holds every step to it
(harness/judge/claims/contract.py)."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from harness.formula import Formula, FormulaError
from harness.judge.claims.contract import PRINTED_RTOL, check_lr_contract, contract_lr
from harness.judge.draws import (LARGE_SEEDS, SMALL_SEEDS, DrawError, corpus_tokens, draw_values, load_override,
                                 write_corpus)
from harness.judge.claims.evidence import embedded_tokens, shard_tokens
from harness.judge.claims.exactstep import step_pairs
from harness.judge.claims.checkpoint_reader import list_checkpoints
from harness.spec import SpecError, load_milestone
from tests.judge.runs import REPO, expected_config, train

DEMO = REPO / "milestones" / "demo-tiny.toml"


def _spec(tmp_path: Path, draw: str, argv: str, extra: str = "") -> Path:
    (tmp_path / "milestones").mkdir(exist_ok=True)
    path = tmp_path / "milestones" / "m.toml"
    path.write_text(f'''id = "m"\ntitle = "t"\ngoal = "g"\neditable = ["engine/**"]\n{draw}\n
[[gates]]\nkind = "protected"\n[[gates]]\nkind = "job"\nname = "train"\ntask = "train"\ntimeout_s = 60\n{extra}
argv = ["pretrain", {argv} "--run-dir", "{{job_dir}}"]\n[budget]\nmax_turns = 1\nmax_tokens = 1\nmax_wall_s = 1\n'''
                    f'max_attempts = 1\n', encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- the draw

def test_the_draw_is_a_pure_function_of_the_secret_and_covers_its_ranges():
    table = load_milestone(DEMO).draw
    draws = [draw_values(table, secret) for secret in range(300)]
    assert draws[7] == draw_values(table, 7)  # replayable from the recorded secret
    assert len({json.dumps(d.values, sort_keys=True) for d in draws}) == 300
    seeds = [d.values["seed"] for d in draws]
    wide = [d.values["seed_wide"] for d in draws]
    assert all(SMALL_SEEDS[0] <= s <= SMALL_SEEDS[1] for s in seeds) and len(set(seeds)) > 50
    assert all(LARGE_SEEDS[0] <= s <= LARGE_SEEDS[1] for s in wide) and max(wide) > 2**62
    seq = [d.values["wide_seq"] for d in draws]
    assert min(seq) >= 520 and max(seq) <= 1024 and all(s % 8 == 0 for s in seq) and min(seq) < 560 and max(seq) > 990
    assert {d.values["wide_hidden"] for d in draws} == {1024, 1152}
    assert {d.values["steps"] for d in draws} == set(range(21, 27))
    # a milestone that names no seed still draws one, small or large
    any_seed = [draw_values({}, secret).values["seed"] for secret in range(200)]
    assert min(any_seed) <= SMALL_SEEDS[1] and max(any_seed) >= LARGE_SEEDS[0]


def test_a_recorded_draw_replays_and_a_wrong_one_is_refused(tmp_path):
    table = load_milestone(DEMO).draw
    first = draw_values(table, 11)
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"accepted": False, "seed": 11, "draw": first.as_json()}), encoding="utf-8")
    again = draw_values(table, 99, load_override(str(verdict)))
    assert again.values == first.values and set(again.overridden) == set(first.values)
    one = draw_values(table, 99, load_override('{"wide_seq": 1024}'))
    assert one.values["wide_seq"] == 1024 and one.values["steps"] == draw_values(table, 99).values["steps"]
    with pytest.raises(DrawError, match="does not draw"):
        draw_values(table, 1, {"hidden": 4096})
    with pytest.raises(DrawError, match="wide_seq"):
        draw_values(table, 1, {"wide_seq": "long"})
    with pytest.raises(DrawError, match="neither a JSON object"):
        load_override("not json")


def test_placeholders_and_a_drawn_layout_bind_the_gate(tmp_path):
    spec = _spec(tmp_path, '[draw]\nlayout = { choices = [{nproc = 3, gas = 4}, {nproc = 4, gas = 3}] }\nseq = { range = [64, 96], multiple = 32 }',
                 '"--seq-length", "{seq}", "--grad-accum-steps", "{layout.gas}", "--seed", "{seed}",', 'nproc = "{layout.nproc}"')
    m = load_milestone(spec, tmp_path)
    draw = draw_values(m.draw, 5)
    gate = draw.bind(m.job_gates()[0])
    assert gate.nproc == draw.values["layout"]["nproc"] and draw.placeholders()["layout.gas"] == str(draw.values["layout"]["gas"])
    assert draw.values["seq"] in (64, 96)


@pytest.mark.parametrize("draw,argv,extra,problem", [
    ('[draw]\nseq = { range = [65, 70], multiple = 64 }', '', '', "holds no multiple"),
    ('[draw]\nseq = { range = [64, 96], choices = [1] }', '', '', "exactly one of"),
    ('[draw]\ncorpus = "small"', '', '', "epoch-crossing"),
    ('[draw]\ndata = { range = [1, 2] }', '', '', "a drawn name"),
    ('', '"--seq-length", "{seq}",', '', "unknown placeholder {seq}"),
    ('[draw]\nlayout = { choices = [{nproc = 3}, {nproc = 16}] }', '', 'nproc = "{layout.nproc}"', "whole numbers 1..8"),
    ('', '', 'verify_schedule = false', "verify_schedule is gone"),
    ('', '', 'lr_contract = "__import__(\'os\').getpid()"', "outside what a formula may hold"),
])
def test_bad_draw_tables_are_refused_naming_the_field(tmp_path, draw, argv, extra, problem):
    with pytest.raises(SpecError, match=re.escape(problem) if "{" in problem else problem):
        load_milestone(_spec(tmp_path, draw, argv, extra), tmp_path)


def test_the_judge_cut_corpus_is_read_as_prepared_shards_and_crosses_an_epoch(tmp_path):
    train_text = (REPO / "engine/data/corpus/train.jsonl").read_bytes()
    val_text = (REPO / "engine/data/corpus/validation.jsonl").read_bytes()
    stream = embedded_tokens(train_text).tokens
    corpus = {"epoch_at": 0.5, "spare": 0.6, "offset": 123456789}
    expected = {"seq_length": 64, "micro_batch_size": 2, "grad_accum_steps": 2, "tp": 2, "num_steps": 12}
    tokens, k = corpus_tokens(expected, 4, corpus)  # TP 2 x DP 2: a global batch of 8 samples
    assert k == 6 and tokens == (6 * 8 + 4) * 64 + 1
    write_corpus(tmp_path, stream, embedded_tokens(val_text).tokens, offset=corpus["offset"], tokens=tokens, description="test")
    cut = shard_tokens(tmp_path / "train")
    start = corpus["offset"] % (stream.numel() - tokens + 1)
    assert torch.equal(cut.tokens, stream[start:start + tokens]) and cut.eos_id == 257
    samples = (cut.tokens.numel() - 1) // 64
    assert samples // 8 == k < expected["num_steps"]  # the loader's epoch ends at step k of 12
    assert torch.equal(shard_tokens(tmp_path / "validation").tokens, embedded_tokens(val_text).tokens)


# ---------------------------------------------------------------------------------------------- the formula

def test_the_formula_evaluates_the_goal_and_refuses_code():
    f = Formula("lr * min(s / W, sqrt(W / s))")
    for s in range(1, 40):
        assert f.value({"lr": 0.01, "W": 4, "s": s}) == pytest.approx(0.01 * min(s / 4, math.sqrt(4 / s)), rel=1e-15)
    assert Formula("min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * (s - W) / (N - W))) if s > W else lr * s / W").value(
        {"lr": 1.0, "min_lr": 0.1, "W": 2, "N": 10, "s": 6}) == pytest.approx(0.55)
    for bad in ("__import__('os').system('x')", "lr.real", "[lr][0]", "(lambda: 1)()", "open('f')", "lr if 'a' else 1",
                "min(*[lr])", "x * 2"):
        with pytest.raises(FormulaError):
            Formula(bad)
    with pytest.raises(FormulaError, match="no value for 'N'"):
        Formula("lr * N").value({"lr": 1.0})


# ---------------------------------------------------------------------------------------------- the contract

class _Line:
    def __init__(self, step: int, lr: float):
        self.step, self.lr = step, lr


def test_printed_lrs_are_held_to_the_contract_at_every_step():
    expected = {"lr": 0.01, "warmup_steps": 3, "num_steps": 30, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8}
    want, _ = contract_lr("lr * min(s / W, sqrt(W / s))", expected)
    honest = [_Line(s, float(f"{want(s):.6e}")) for s in range(1, 31)]
    assert check_lr_contract("lr * min(s / W, sqrt(W / s))", printed_steps=honest, expected=expected, pairs=[],
                             resumed=False)[0] == []
    # right for the first 20 steps only (the hidden test's and the old job's horizon)
    late = [_Line(r.step, r.lr * (1.0 if r.step <= 20 else 0.9)) for r in honest]
    problems, _ = check_lr_contract("lr * min(s / W, sqrt(W / s))", printed_steps=late, expected=expected, pairs=[], resumed=False)
    assert problems and "step 21 printed" in problems[0]
    # a step left out is a step not checked
    problems, _ = check_lr_contract("lr * min(s / W, sqrt(W / s))", printed_steps=honest[:-1], expected=expected, pairs=[],
                                    resumed=False)
    assert problems and "missing [30]" in problems[0]
    assert PRINTED_RTOL < 1e-4


# An engine whose applied lr leaves the printed one at step 4 alone (not the last step, which the evidence's
# final-pair fit covers): the printed lr is the schedule's, the update is not.
HALF_LR_AT_STEP_4 = ("import engine.optim.optimizer as o\n_orig = o.MixedPrecisionAdamW.step\n_n = [0]\n"
                     "def step(self, lr):\n    _n[0] += 1\n    return _orig(self, lr * (0.5 if _n[0] == 4 else 1.0))\n"
                     "o.MixedPrecisionAdamW.step = step\n")


def test_the_applied_lr_is_fitted_at_every_kept_step(honest, tmp_path):
    expected = expected_config()
    pairs = step_pairs(list_checkpoints(honest.save_dir))
    problems, measured = check_lr_contract("", printed_steps=honest.steps(), expected=expected, pairs=pairs, resumed=False)
    assert problems == [] and measured["lr_fitted_steps"] == len(pairs) >= 1 and measured["lr_fitted_rel_max"] < 1e-3
    problems, _ = check_lr_contract("lr", printed_steps=honest.steps(), expected=expected, pairs=pairs, resumed=False)
    assert problems and "contract lr = lr" in problems[0]
    # printed right at every step, applied wrong at step 4 only: the final pair (5, 6) the evidence fits is honest
    cheat = train(tmp_path / "cheat", keep_last=7, prelude=HALF_LR_AT_STEP_4)
    pairs = step_pairs(list_checkpoints(cheat.save_dir))
    assert len(pairs) == 5
    problems, _ = check_lr_contract("", printed_steps=cheat.steps(), expected=expected, pairs=pairs, resumed=False)
    assert len(problems) == 1 and "at step 4 the optimizer applied" in problems[0], problems
    assert check_lr_contract("", printed_steps=cheat.steps(), expected=expected, pairs=pairs[-1:], resumed=False)[0] == []

