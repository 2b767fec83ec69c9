"""Log parsing: engine wire lines (with launcher prefixes, noise, malformed lines), the JSONL twin,
and Megatron-LM iteration lines.

The reference for the wire format is Python's own %-formatting of the format strings in
DESIGN.md section 3: what a correct engine prints must parse back to the same numbers, bit for bit
(`%.9e` round-trips through float() exactly: both are correctly rounded)."""

import json
import math
from pathlib import Path

import pytest

from harness.judge.logparse import (
    LogParseError,
    parse_engine_log,
    parse_eval_lines,
    parse_megatron_log,
    parse_metrics_jsonl,
    parse_skip_lines,
    strip_rank_prefix,
)

__all__: list[str] = []

LOSS_FMT = "[LOSS] step=%d global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=%d time_s=%.6f mfu=%.4f"
EVAL_FMT = "[EVAL] step=%d val_loss=%.9e val_bpb=%.6f tokens=%d"
FIXTURES = Path(__file__).with_name("fixtures")


def _loss(step: int, loss: float, gn: float = 1.25, lr: float = 3e-4, tokens: int = 65536, t: float = 0.5,
          mfu: float = 0.4123) -> str:
    return LOSS_FMT % (step, loss, gn, lr, tokens, t, mfu)


def test_engine_lines_round_trip_among_noise_and_rank_prefixes() -> None:
    losses = [10.98765432, 9.5, 8.123456789e-3]  # at most 10 significant digits
    log = "\n".join([
        "[temper] job 12 (train) restart 0 on vm",
        "W1122 torch/distributed/run.py: Setting OMP_NUM_THREADS environment variable for each process",
        _loss(1, losses[0]),
        "[rank0]: some warning from rank 0",
        "[rank0]: " + _loss(2, losses[1], t=0.25),
        "[default0]:" + _loss(3, losses[2]),
        "0: " + EVAL_FMT % (3, 2.5, 1.25, 8192),
        "train: 100%|##########| 3/3",
    ]) + "\n"
    steps = parse_engine_log(log)
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.loss for s in steps] == losses  # exact: the printed precision is enough to round-trip these
    assert [s.rank for s in steps] == [None, 0, 0]
    assert [s.line_no for s in steps] == [3, 5, 6]
    first = steps[1]
    assert (first.grad_norm, first.lr, first.tokens, first.time_s, first.reported_mfu) == (1.25, 3e-4, 65536, 0.25, 0.4123)
    assert first.source == "engine-log" and first.raw.startswith("[LOSS] step=2 ")
    (ev,) = parse_eval_lines(log)
    assert (ev.step, ev.val_loss, ev.val_bpb, ev.tokens, ev.rank, ev.line_no) == (3, 2.5, 1.25, 8192, 0, 7)


def test_loss_values_round_trip_exactly_at_printed_precision() -> None:
    # float("%.9e" % x) is the nearest double to the 10-digit decimal: comparing parsed values is
    # comparing printed strings. Both directions are checked on awkward values.
    # (not max-double: %.9e rounds it up past the double range, to a string that parses as inf)
    values = [1 / 3, 2.0 ** -30, 123456.789012345, 5e-324, 1.2345678901234567e300]
    steps = parse_engine_log("\n".join(_loss(i, v) for i, v in enumerate(values)))
    for value, rec in zip(values, steps, strict=True):
        assert rec.loss == float("%.9e" % value)
        assert "%.9e" % rec.loss == "%.9e" % value


def test_diverged_run_with_nan_still_parses() -> None:
    (rec,) = parse_engine_log(_loss(7, float("nan"), gn=float("inf")))
    assert math.isnan(rec.loss) and rec.grad_norm == math.inf


def test_progress_bar_carriage_returns_do_not_hide_a_wire_line() -> None:
    log = "step 1/3 33%\rstep 1/3 66%\r" + _loss(1, 2.0) + "\n"
    (rec,) = parse_engine_log(log)
    assert rec.step == 1 and rec.line_no == 1


@pytest.mark.parametrize(("line", "reason"), [
    ("[LOSS] step=1 global_loss=2.5 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=8 time_s=0.500000 mfu=0.4000",
     "global_loss='2.5' is not %.9e"),
    ("[LOSS] step=1 global_loss=2.500000000e+00 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=8 time_s=0.500000",
     "expected fields"),
    ("[LOSS] step=1 global_loss=2.500000000e+00 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=8 time_s=0.500000 mfu=0.4000 extra=1",
     "expected fields"),
    ("[LOSS] step=1 grad_norm=1.000000000e+00 global_loss=2.500000000e+00 lr=3.000000e-04 tokens=8 time_s=0.500000 mfu=0.4000",
     "expected fields"),
    ("[LOSS] step=1.0 global_loss=2.500000000e+00 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=8 time_s=0.500000 mfu=0.4000",
     "step='1.0' is not a non-negative integer"),
    ("[LOSS] step=1 global_loss=2.500000000e+00 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=-8 time_s=0.500000 mfu=0.4000",
     "tokens='-8'"),
    ("[LOSS] step=1 global_loss=2.500000000e+00 grad_norm=1.000000000e+00 lr=3.000000e-04 tokens=8 time_s=0.5 mfu=0.4000",
     "time_s='0.5' is not %.6f"),
    ("[LOSS] garbage", "is not key=value"),
])
def test_malformed_wire_lines_are_reported_not_skipped(line: str, reason: str) -> None:
    log = _loss(1, 3.0) + "\nnoise\n" + line + "\n" + _loss(3, 2.0) + "\n"
    with pytest.raises(LogParseError) as err:
        parse_engine_log(log)
    (problem,) = err.value.problems
    assert problem.line_no == 3 and reason in problem.reason, problem
    assert "line 3" in str(err.value)


def test_torn_line_and_every_problem_are_reported_together() -> None:
    torn = "rank 1 says hel" + _loss(2, 1.0)
    bad = "[rank0]: [LOSS] step=3 global_loss=oops"
    with pytest.raises(LogParseError) as err:
        parse_engine_log("\n".join([_loss(1, 1.0), torn, bad, _loss(4, 1.0)]))
    assert [p.line_no for p in err.value.problems] == [2, 3]
    assert "torn" in err.value.problems[0].reason
    assert str(err.value).startswith("2 malformed [LOSS] lines")


def test_malformed_eval_line() -> None:
    with pytest.raises(LogParseError, match="val_bpb"):
        parse_eval_lines("[EVAL] step=5 val_loss=2.500000000e+00 val_bpb=1.25 tokens=10")


def test_skip_lines_as_the_engine_prints_them() -> None:
    """engine/step_log.py skip_line's format, restated: a skipped update and the run's count of skips."""
    [rec] = parse_skip_lines("x\n[rank0]: [SKIP] step=7 global_loss=5.544144630e+00 running_mean=5.540068626e+00 "
                             "factor=1.0001 consecutive=2 skipped_batches=3\n[LOSS] step=7 ...\n")
    assert (rec.step, rec.loss, rec.running_mean, rec.factor, rec.consecutive, rec.skipped_batches, rec.line_no) == \
        (7, 5.544144630, 5.540068626, 1.0001, 2, 3, 2)
    with pytest.raises(LogParseError, match="global_loss"):
        parse_skip_lines("[SKIP] step=7 global_loss=5.54 running_mean=5.540068626e+00 factor=2 consecutive=1 "
                         "skipped_batches=1")


@pytest.mark.parametrize(("line", "body", "rank"), [
    ("[rank3]: hello", "hello", 3),
    ("[default12]:hello", "hello", 12),
    ("[default1]:[rank1]: hello", "hello", 1),
    ("7: hello", "hello", 7),
    ("hello [rank0]: x", "hello [rank0]: x", None),
])
def test_strip_rank_prefix(line: str, body: str, rank: int | None) -> None:
    assert strip_rank_prefix(line) == (body, rank)


# --- JSONL ---------------------------------------------------------------------------------------

def _jsonl(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


LOSS_ROW = {"kind": "loss", "step": 1, "global_loss": 2.5, "grad_norm": 1.0, "lr": 3e-4, "tokens": 8192,
            "time_s": 0.5, "mfu": 0.41}
EVAL_ROW = {"kind": "eval", "step": 1, "val_loss": 2.75, "val_bpb": 1.1, "tokens": 4096}


def test_jsonl_records_and_truncated_tail(tmp_path: Path) -> None:
    rows = [LOSS_ROW, EVAL_ROW, LOSS_ROW | {"step": 2, "global_loss": float("nan"), "extra_key": "kept out"}]
    path = _jsonl(tmp_path / "metrics.jsonl", rows, tail='{"kind": "loss", "st')
    parsed = parse_metrics_jsonl(path)
    assert [s.step for s in parsed.steps] == [1, 2] and math.isnan(parsed.steps[1].loss)  # type: ignore[arg-type]
    s = parsed.steps[0]
    assert (s.loss, s.grad_norm, s.lr, s.tokens, s.time_s, s.reported_mfu, s.source, s.line_no) == \
        (2.5, 1.0, 3e-4, 8192, 0.5, 0.41, "metrics-jsonl", 1)
    (e,) = parsed.evals
    assert (e.step, e.val_loss, e.val_bpb, e.tokens, e.line_no) == (1, 2.75, 1.1, 4096, 2)
    assert parsed.truncated_tail == '{"kind": "loss", "st'


def test_jsonl_agrees_with_the_wire_lines_it_twins() -> None:
    # What a correct engine writes to both: the JSONL numbers, printed with the wire formats, are the line.
    line = _loss(1, LOSS_ROW["global_loss"], LOSS_ROW["grad_norm"], LOSS_ROW["lr"], LOSS_ROW["tokens"],
                 LOSS_ROW["time_s"], LOSS_ROW["mfu"])
    (rec,) = parse_engine_log(line)
    assert (rec.loss, rec.grad_norm, rec.lr, rec.tokens, rec.time_s, rec.reported_mfu) == \
        tuple(LOSS_ROW[k] for k in ("global_loss", "grad_norm", "lr", "tokens", "time_s", "mfu"))


@pytest.mark.parametrize(("row", "reason"), [
    ({k: v for k, v in LOSS_ROW.items() if k != "time_s"}, "missing key 'time_s'"),
    (LOSS_ROW | {"tokens": 8192.0}, "tokens=8192.0 is not an integer"),
    (LOSS_ROW | {"tokens": True}, "tokens=True is not an integer"),
    (LOSS_ROW | {"global_loss": "2.5"}, "global_loss='2.5' is not a number"),
    (LOSS_ROW | {"kind": "header"}, "unknown kind 'header'"),
    ([1, 2], "not a JSON object"),
])
def test_jsonl_problems_are_reported(tmp_path: Path, row: object, reason: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(LOSS_ROW) + "\n" + json.dumps(row) + "\nnot json at all\n")
    with pytest.raises(LogParseError) as err:
        parse_metrics_jsonl(path)
    assert [p.line_no for p in err.value.problems] == [2, 3]
    assert reason in err.value.problems[0].reason


# --- Megatron-LM ---------------------------------------------------------------------------------

def test_megatron_excerpt() -> None:
    text = (FIXTURES / "megatron_excerpt.log").read_text()
    recs = parse_megatron_log(text, seq_length=4096)
    assert [r.step for r in recs] == [1, 10, 20, 30, 40]
    r10 = recs[1]
    assert (r10.loss, r10.grad_norm, r10.lr, r10.samples, r10.tokens, r10.reported_tflops) == \
        (9.876543, 4.512, 1e-05, 64, 64 * 4096, 303.9)
    assert r10.time_s == pytest.approx(1.3667, rel=1e-12)  # ms / 1000: float division, not exact
    assert recs[3].rank == 7 and recs[3].loss == 8.1
    old = recs[4]  # an older release: no timestamp, no throughput, lr as %.3E, no grad norm
    assert (old.lr, old.reported_tflops, old.grad_norm, old.source) == (4e-05, None, None, "megatron-log")
    assert parse_megatron_log(text)[1].tokens is None  # Megatron never prints the sequence length


def test_megatron_malformed_iteration_line() -> None:
    line = " iteration       10/     100 | consumed samples:          640 | elapsed time per iteration (ms): fast |"
    with pytest.raises(LogParseError, match="elapsed time per iteration"):
        parse_megatron_log("hello\n" + line)
