"""harness/judge/claims/bitwise.py: two runs' checkpoints compared tensor by tensor, and digits.py: printed numbers
held to the documented format's digits.

The checkpoints are a real tiny CPU run's (the session's `honest` run, tests/judge/conftest.py), re-saved with
one planted change: a one-ulp step of one element of each tensor kind, a saved value, a missing or extra key,
another dtype or shape. Every change must be found and named (key, count, largest difference); the unchanged
copy must compare equal. Tolerances: none for the bitwise comparison (it compares bits); the layout comparison is
relative L2 per tensor.
"""

import math
import shutil
from pathlib import Path

import pytest
import torch

from harness.judge.claims.bitwise import compare_bitwise, compare_layouts, diff_tensors, diff_values, job_checkpoints
from harness.judge.claims.checkpoint_reader import list_checkpoints, read_stored, stored_entries
from harness.judge.claims.digits import digit_problems, short
from harness.judge.logparse import EVAL_FORMAT, LOSS_FORMAT, LogParseError, parse_engine_log, parse_eval_lines
from harness.spec import SpecError, load_milestone
from tests.judge.runs import pair_spec

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
PARAM = "layers.1.mlp.fc1"


def _final(run) -> Path:  # noqa: ANN001 -- the honest Run
    return list_checkpoints(run.save_dir)[-1]


def _resave(src: Path, dst: Path, change) -> Path:  # noqa: ANN001 -- change(state) edits the flat state in place
    """A copy of `src` with every stored key as stored, after `change(state)`, written by DCP (no manifest)."""
    import torch.distributed.checkpoint as dcp  # here, not at collection: ~1.5 s that every xdist worker would pay
    state = read_stored(src, stored_entries(src))
    change(state)
    dst.mkdir(parents=True)
    dcp.save(state, checkpoint_id=str(dst), no_dist=True)
    shutil.copy(src / "meta.json", dst / "meta.json")
    return dst


def _one(path: Path) -> dict[int, Path]:
    return {1: path}


def _nudge(key: str, index: int = 7):  # noqa: ANN202
    def change(state: dict) -> None:
        t = state[key]
        t[index] = torch.nextafter(t[index], torch.tensor(math.inf, dtype=t.dtype))
    return change


def test_an_unchanged_copy_compares_equal(honest, tmp_path):
    src = _final(honest)
    copy = _resave(src, tmp_path / "copy", lambda state: None)
    result = compare_bitwise(_one(copy), _one(src), [1])
    assert result.differences == [] and result.differing == 0
    assert result.keys > 3 * 20  # every parameter's master and two moments, and the trainer's values
    assert "equal" in result.describe()


@pytest.mark.parametrize("kind", ["master", "exp_avg", "exp_avg_sq"])
def test_one_ulp_in_any_tensor_kind_is_found_and_named(honest, tmp_path, kind):
    src = _final(honest)
    key = f"optim.{kind}/{PARAM}"
    copy = _resave(src, tmp_path / "copy", _nudge(key))
    result = compare_bitwise(_one(copy), _one(src), [1])
    assert result.differing == 1
    (diff,) = result.differences
    assert diff.key == key and diff.what == "bits" and diff.count == 1
    value = read_stored(src, {key: stored_entries(src)[key]})[key][7]
    assert diff.max_abs == float(torch.nextafter(value, torch.tensor(math.inf))) - float(value) > 0  # one fp32 ulp
    assert key in result.describe() and "1 of" in result.describe()


@pytest.mark.parametrize("key,value", [("trainer.step", 99), ("trainer.adam_step", 99),
                                       ("trainer.data.consumed_samples", 12345)])
def test_a_saved_value_that_differs_is_named(honest, tmp_path, key, value):
    src = _final(honest)
    copy = _resave(src, tmp_path / "copy", lambda state: state.__setitem__(key, value))
    result = compare_bitwise(_one(copy), _one(src), [1])
    assert [d.key for d in result.differences] == [key] and result.differences[0].what == "value"


def test_missing_and_extra_keys_fail(honest, tmp_path):
    src = _final(honest)
    missing = _resave(src, tmp_path / "missing", lambda state: state.pop(f"optim.exp_avg_sq/{PARAM}"))
    result = compare_bitwise(_one(missing), _one(src), [1])
    assert [(d.key, d.what) for d in result.differences] == [(f"optim.exp_avg_sq/{PARAM}", "missing")]
    assert result.differing == result.differences[0].numel > 0
    extra = _resave(src, tmp_path / "extra", lambda state: state.__setitem__("optim.shadow/x", torch.zeros(4)))
    result = compare_bitwise(_one(extra), _one(src), [1])
    assert [(d.key, d.what) for d in result.differences] == [("optim.shadow/x", "extra")]


def test_dtype_and_shape_mismatches_fail(honest, tmp_path):
    src = _final(honest)
    key = f"optim.master/{PARAM}"
    retyped = _resave(src, tmp_path / "retyped", lambda state: state.__setitem__(key, state[key].double()))
    assert [(d.key, d.what) for d in compare_bitwise(_one(retyped), _one(src), [1]).differences] == [(key, "dtype")]
    reshaped = _resave(src, tmp_path / "reshaped", lambda state: state.__setitem__(key, state[key].view(2, -1).clone()))
    assert [(d.key, d.what) for d in compare_bitwise(_one(reshaped), _one(src), [1]).differences] == [(key, "shape")]


def test_wall_clock_and_global_generator_states_are_left_out(honest, tmp_path):
    """No two honest runs share them (torch seeds its global generator from the OS at start-up)."""
    src = _final(honest)

    def change(state: dict) -> None:
        state["trainer.elapsed_s"] = 1234.5
        for key in [k for k in state if k.startswith("rng/")]:
            state[key] = torch.zeros_like(state[key])
    copy = _resave(src, tmp_path / "copy", change)
    assert compare_bitwise(_one(copy), _one(src), [1]).differences == []


def test_bits_not_values():
    assert diff_tensors(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))[0] == 1
    nan = torch.tensor([math.nan])
    assert diff_tensors(nan, nan.clone()) == (0, 0.0)
    assert diff_tensors(torch.tensor([1, 2], dtype=torch.int64), torch.tensor([1, 3], dtype=torch.int64)) == (1, 1.0)
    assert diff_values(1.0, 1) and diff_values(0.0, -0.0) and not diff_values({"a": [1, 2.5]}, {"a": [1, 2.5]})


def test_layouts_within_tolerance_pass_and_beyond_it_are_named(honest, tmp_path):
    src = _final(honest)
    key = f"optim.exp_avg/{PARAM}"

    def scale(factor: float):  # noqa: ANN202
        return lambda state: state.__setitem__(key, state[key] * factor)
    near = _resave(src, tmp_path / "near", scale(1 + 1e-6))
    result = compare_layouts(_one(near), _one(src), [1], tolerance=1e-4)
    assert result.differences == [] and 5e-7 < result.max_rel < 2e-6 and PARAM in result.worst
    far = _resave(src, tmp_path / "far", scale(1.01))
    result = compare_layouts(_one(far), _one(src), [1], tolerance=1e-4)
    assert [(d.key, d.what) for d in result.differences] == [(f"exp_avg/{PARAM}", "tolerance")]
    moved = _resave(src, tmp_path / "moved", lambda state: state.__setitem__("trainer.data.consumed_samples", 7))
    assert [d.key for d in compare_layouts(_one(moved), _one(src), [1], tolerance=1e-4).differences] == [
        "trainer.data.consumed_samples"]


def test_job_checkpoints_reads_the_save_dir_and_the_keepers_links(honest, tmp_path):
    found = job_checkpoints(["pretrain", "--save-dir", str(honest.save_dir)])
    assert sorted(found) == [int(p.name[5:]) for p in list_checkpoints(honest.save_dir)]
    kept = tmp_path / "step_00000002"
    assert job_checkpoints(["pretrain"], [kept]) == {2: kept}


# --------------------------------------------------------------------------------------------- printed digits


def _loss(step: int, loss: float, grad: float = 0.4123456789) -> str:
    return LOSS_FORMAT % (step, loss, grad, 1e-3, 512, 0.05, 0.0)


HONEST_LOSSES = [5.561234817, 5.373915672, 5.050796986, 4.713209224, 4.499281883, 4.207743645, 3.979181290, 3.822091579]


def test_the_documented_format_is_the_engines():
    from engine.step_log import eval_line, loss_line
    assert loss_line(3, 2.5, 0.25, 1e-3, 512, 0.051234, 0.1234) == LOSS_FORMAT % (3, 2.5, 0.25, 1e-3, 512, 0.051234, 0.1234)
    assert eval_line(3, 2.5, 1.25, 4096) == EVAL_FORMAT % (3, 2.5, 1.25, 4096)


def test_measured_numbers_pass(honest):
    assert digit_problems(honest.steps(), honest.evals()) == []
    steps = parse_engine_log("\n".join(_loss(i + 1, v, grad=v / 9.87654321) for i, v in enumerate(HONEST_LOSSES)))
    assert digit_problems(steps, []) == []


@pytest.mark.parametrize("rounding", [lambda x: float(f"{x:.4g}"), lambda x: float(f"{x:.7g}"),
                                      lambda x: float(torch.tensor(x).half()), lambda x: float(torch.tensor(x).bfloat16())],
                         ids=["4-digits", "7-digits", "float16", "bfloat16"])
def test_rounded_losses_are_refused_naming_the_field(rounding):
    steps = parse_engine_log("\n".join(_loss(i + 1, rounding(v)) for i, v in enumerate(HONEST_LOSSES)))
    (problem,) = digit_problems(steps, [])
    assert "global_loss" in problem and "fewer digits" in problem and "%.9e" in problem


def test_a_rounded_grad_norm_and_val_loss_are_refused():
    steps = parse_engine_log("\n".join(_loss(i + 1, v, grad=float(f"{v / 9.87654321:.5g}")) for i, v in enumerate(HONEST_LOSSES)))
    assert [p.split(" values")[0] for p in digit_problems(steps, [])] == ["printed digits: 8 of the 8 [LOSS] grad_norm"]
    evals = parse_eval_lines("\n".join(EVAL_FORMAT % (i, round(v, 3), 1.5, 4096) for i, v in enumerate(HONEST_LOSSES)))
    assert "val_loss" in digit_problems([], evals)[0]


def test_chance_and_exact_zeros_are_not_refused():
    """Two short values in eight happen (p ~ 1e-3 each), exact zeros are measurements: neither is refused."""
    values = HONEST_LOSSES[:6] + [2.5, 3.0]
    steps = parse_engine_log("\n".join(_loss(i + 1, v, grad=0.0) for i, v in enumerate(values)))
    assert digit_problems(steps, []) == []
    assert not short(0.0) and not short(math.nan) and short(2.5) and not short(5.561234817)


@pytest.mark.parametrize("line", [
    "[LOSS] step=1 global_loss=5.5612e+00 grad_norm=4.123456789e-01 lr=1.000000e-03 tokens=512 time_s=0.050000 mfu=0.0000",
    "[LOSS] step=1 global_loss=5.561234817e+00 grad_norm=4.123e-01 lr=1.000000e-03 tokens=512 time_s=0.050000 mfu=0.0000",
    "[LOSS] step=1 global_loss=5.561234817e+00 lr=1.000000e-03 tokens=512 time_s=0.050000 mfu=0.0000",
    "[LOSS] step=1 global_loss=5.561 grad_norm=4.123456789e-01 lr=1.000000e-03 tokens=512 time_s=0.050000 mfu=0.0000",
])
def test_fewer_printed_digits_or_a_missing_field_are_malformed(line):
    with pytest.raises(LogParseError, match="global_loss|grad_norm"):
        parse_engine_log(line)


# --------------------------------------------------------------------------------------------- the spec


def test_a_printed_comparison_alone_is_refused_by_the_spec(tmp_path):
    exact = '{ job = "b", metric = "loss_max_abs_diff", op = "==", value = 0, ref_job = "a" }'
    with pytest.raises(SpecError, match="state_bitwise_diff"):
        load_milestone(pair_spec(tmp_path, exact), root=tmp_path)
    load_milestone(pair_spec(tmp_path, exact + ', { job = "b", metric = "state_bitwise_diff", op = "==", value = 0, ref_job = "a" }'),
                   root=tmp_path)
    near = '{ job = "b", metric = "loss_rel_diff", op = "<=", value = 1e-5, ref_job = "a" }'
    with pytest.raises(SpecError, match="state_rel_diff"):
        load_milestone(pair_spec(tmp_path, near), root=tmp_path)
    with pytest.raises(SpecError, match="verify = false"):
        load_milestone(pair_spec(tmp_path, near + ', { job = "b", metric = "state_rel_diff", op = "<=", value = 1e-4, ref_job = "a" }',
                             verify="verify = false\n"), root=tmp_path)
