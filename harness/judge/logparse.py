"""Turn training output into step records: the engine's wire lines, its JSONL twin, Megatron-LM logs.

Part of the judge: nothing here imports the engine. The parsers are
- tolerant of everything around the records: other output, torchrun's rank prefixes (`[rank0]: `,
  `[default0]:`), srun's `--label` prefix (`0: `), carriage-return progress bars on the same line;
- strict about the records themselves: a line that starts with `[LOSS]` / `[EVAL]` (after those
  prefixes) must match the wire format exactly, number formats included (`%.9e` keeps bitwise
  comparisons honest, so fewer digits is a defect, not a style). A wire marker in the middle of a
  line is a torn write (two processes interleaving output) and is reported too. Every problem is
  collected and raised together as a `LogParseError`, never skipped.

Line numbers count "\\n"-terminated lines from 1, the same count the local launcher's arrival-time
sidecar uses (harness/jobs/local.py), so a record can be joined with the time its line arrived.

Wire formats (DESIGN.md section 3; restated below as LOSS_FORMAT, EVAL_FORMAT, SKIP_FORMAT, which the parser uses):
    [LOSS] step=N global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=N time_s=%.6f mfu=%.4f
    [EVAL] step=N val_loss=%.9e val_bpb=%.6f tokens=N
    [SKIP] step=N global_loss=%.9e running_mean=%.9e factor=%g consecutive=N skipped_batches=N
(`[SKIP]`: the update of step N was not applied, a loss spike under --skip-spike-factor; step N is retried
on the next batch, and skipped_batches counts the run's skips so far, resumes included.)
`tokens` is the number of tokens this step trained on across all data-parallel ranks and `time_s`
the step's wall time; `mfu` is the engine's own claim, kept for comparison and never trusted.
"""

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "pipe_mismatch",
    "StepRecord",
    "EvalRecord",
    "MetricsFile",
    "LineProblem",
    "LogParseError",
    "strip_rank_prefix",
    "parse_engine_log",
    "parse_eval_lines",
    "SkipRecord",
    "parse_skip_lines",
    "parse_metrics_jsonl",
    "parse_megatron_log",
    "read_line_times",
    "LOSS_FORMAT",
    "EVAL_FORMAT",
    "SKIP_FORMAT",
]

SOURCE_ENGINE_LOG = "engine-log"
SOURCE_METRICS_JSONL = "metrics-jsonl"
SOURCE_MEGATRON_LOG = "megatron-log"


@dataclass(kw_only=True, frozen=True)
class StepRecord:
    """One optimizer step (or, for Megatron, one logging interval's per-iteration average).

    `reported_mfu` / `reported_tflops` are what the training program claims about itself; the judge
    recomputes MFU from `tokens` and `time_s` (harness/judge/claims/measured_mfu.py) and only compares.
    """

    step: int
    loss: float | None  # engine: global_loss; Megatron: "lm loss" (absent when all iterations were skipped)
    grad_norm: float | None
    lr: float | None
    tokens: int | None  # tokens of this step over all DP ranks; Megatron: only when seq_length is known
    time_s: float | None  # wall time of this step
    reported_mfu: float | None = None
    reported_tflops: float | None = None  # Megatron's "throughput per GPU (TFLOP/s/GPU)"
    samples: int | None = None  # Megatron's global batch size
    source: str
    line_no: int  # 1-based line of the log (or JSONL file) the record came from
    rank: int | None = None  # from a torchrun / srun prefix, when the line had one
    raw: str = ""  # the record's text after prefixes, for messages and exact comparisons


@dataclass(kw_only=True, frozen=True)
class EvalRecord:
    step: int
    val_loss: float
    val_bpb: float
    tokens: int
    source: str
    line_no: int
    rank: int | None = None
    raw: str = ""


@dataclass(kw_only=True, frozen=True)
class SkipRecord:
    step: int  # the step whose update was skipped (it is retried on the next batch)
    loss: float  # global_loss of the skipped batch
    running_mean: float
    factor: float
    consecutive: int
    skipped_batches: int  # skips of the run so far, this one included
    line_no: int
    raw: str = ""


@dataclass(kw_only=True, frozen=True)
class MetricsFile:
    """The records of a `<run_dir>/metrics.jsonl`.

    `truncated_tail` holds a last line that has no newline and is not valid JSON: what a writer
    killed mid-line leaves behind (a timed-out job). It is surfaced, not parsed and not hidden.
    """

    steps: list[StepRecord]
    evals: list[EvalRecord]
    truncated_tail: str = ""


@dataclass(kw_only=True, frozen=True)
class LineProblem:
    line_no: int
    line: str
    reason: str

    def __str__(self) -> str:
        shown = self.line if len(self.line) <= 200 else self.line[:200] + "..."
        return f"line {self.line_no}: {self.reason}: {shown!r}"


class LogParseError(ValueError):
    """Malformed records. `problems` lists every one found (line number, text, what is wrong)."""

    def __init__(self, what: str, problems: list[LineProblem]):
        self.problems = problems
        head = "; ".join(str(p) for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"{len(problems)} malformed {what}: {head}{more}")


# torchrun --tee / --local-ranks-filter: "[default0]:"; torch's per-rank error output: "[rank0]: ";
# srun --label: "0: ". They can stack ("[default0]:[rank0]: ").
_PREFIX = re.compile(r"\[(?:rank|default)(\d+)\]: ?|(\d+): ")


def strip_rank_prefix(line: str) -> tuple[str, int | None]:
    """The line without launcher prefixes, and the rank of the outermost prefix (None if none)."""
    rank = None
    pos = 0
    while True:
        m = _PREFIX.match(line, pos)
        if not m:
            break
        if rank is None:
            rank = int(m.group(1) or m.group(2))
        pos = m.end()
    return line[pos:], rank


def _lines(text: str) -> Iterator[tuple[int, str, int | None]]:
    """(line number, candidate text, rank) for each "\\n" line and each "\\r" segment of it.

    A progress bar redraws with "\\r", so "50%\\r[LOSS] ..." shows a wire line on a terminal; each
    segment is judged on its own, under the line's number.
    """
    for no, line in enumerate(text.split("\n"), start=1):
        for segment in line.split("\r"):
            if segment:
                body, rank = strip_rank_prefix(segment)
                yield no, body.strip(), rank


# Exactly what Python's %-formats print, including nan / inf (a diverged run must still parse so
# the gates can judge it).
_NONFINITE = r"[-+]?(?:nan|inf)"
_E9 = re.compile(rf"(?:[-+]?\d\.\d{{9}}e[-+]\d{{2,3}}|{_NONFINITE})")
_E6 = re.compile(rf"(?:[-+]?\d\.\d{{6}}e[-+]\d{{2,3}}|{_NONFINITE})")
_F6 = re.compile(rf"(?:[-+]?\d+\.\d{{6}}|{_NONFINITE})")
_F4 = re.compile(rf"(?:[-+]?\d+\.\d{{4}}|{_NONFINITE})")
_INT = re.compile(r"\d+")
_G = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]\d+)?")

_FORMAT_NAMES = {_E9: "%.9e", _E6: "%.6e", _F6: "%.6f", _F4: "%.4f", _INT: "a non-negative integer", _G: "%g"}
_BY_FORMAT = {"%d": _INT, "%.9e": _E9, "%.6e": _E6, "%.6f": _F6, "%.4f": _F4, "%g": _G}

# The engine's documented wire format (engine/step_log.py, DESIGN.md section 3), restated here and owned by the
# judge: it is never read from the engine an agent edits. Every field must be present, in this order, in exactly
# this format; harness/judge/claims/digits.py holds the measured fields to the digits the format promises.
LOSS_FORMAT = "[LOSS] step=%d global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=%d time_s=%.6f mfu=%.4f"
EVAL_FORMAT = "[EVAL] step=%d val_loss=%.9e val_bpb=%.6f tokens=%d"
SKIP_FORMAT = "[SKIP] step=%d global_loss=%.9e running_mean=%.9e factor=%g consecutive=%d skipped_batches=%d"


def _fields(documented: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(name, pattern) of each `name=%fmt` of a documented wire format."""
    return tuple((name, _BY_FORMAT[fmt]) for name, fmt in (tok.split("=", 1) for tok in documented.split()[1:]))


_LOSS_FIELDS = _fields(LOSS_FORMAT)
_EVAL_FIELDS = _fields(EVAL_FORMAT)
_SKIP_FIELDS = _fields(SKIP_FORMAT)


def _parse_wire(body: str, marker: str, spec: tuple[tuple[str, re.Pattern[str]], ...]) -> dict[str, str]:
    """Split `[MARKER] k=v ...` and check keys (set and order) and each value's exact format."""
    tokens = body[len(marker):].split()
    expected = [name for name, _ in spec]
    pairs = []
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep:
            raise ValueError(f"{tok!r} is not key=value")
        pairs.append((key, value))
    keys = [k for k, _ in pairs]
    if keys != expected:
        raise ValueError(f"expected fields {' '.join(expected)}, got {' '.join(keys) or 'none'}")
    values = {}
    for (name, pattern), (_, value) in zip(spec, pairs, strict=True):
        if not pattern.fullmatch(value):
            raise ValueError(f"{name}={value!r} is not {_FORMAT_NAMES[pattern]}")
        values[name] = value
    return values


def _scan(text: str, marker: str, build: Callable[[dict[str, str], int, int | None, str], Any],
          spec: tuple[tuple[str, re.Pattern[str]], ...], what: str) -> list[Any]:
    records = []
    problems = []
    torn = marker + " step="
    for no, body, rank in _lines(text):
        if body.startswith(marker):
            try:
                values = _parse_wire(body, marker, spec)
            except ValueError as err:
                problems.append(LineProblem(line_no=no, line=body, reason=str(err)))
                continue
            records.append(build(values, no, rank, body))
        elif torn in body:
            problems.append(LineProblem(line_no=no, line=body,
                                        reason=f"{marker} in the middle of a line (torn or interleaved write)"))
    if problems:
        raise LogParseError(what, problems)
    return records


def _step_from_wire(v: dict[str, str], no: int, rank: int | None, raw: str) -> StepRecord:
    return StepRecord(step=int(v["step"]), loss=float(v["global_loss"]), grad_norm=float(v["grad_norm"]),
                      lr=float(v["lr"]), tokens=int(v["tokens"]), time_s=float(v["time_s"]),
                      reported_mfu=float(v["mfu"]), source=SOURCE_ENGINE_LOG, line_no=no, rank=rank, raw=raw)


def _eval_from_wire(v: dict[str, str], no: int, rank: int | None, raw: str) -> EvalRecord:
    return EvalRecord(step=int(v["step"]), val_loss=float(v["val_loss"]), val_bpb=float(v["val_bpb"]),
                      tokens=int(v["tokens"]), source=SOURCE_ENGINE_LOG, line_no=no, rank=rank, raw=raw)


def _skip_from_wire(v: dict[str, str], no: int, rank: int | None, raw: str) -> SkipRecord:
    return SkipRecord(step=int(v["step"]), loss=float(v["global_loss"]), running_mean=float(v["running_mean"]),
                      factor=float(v["factor"]), consecutive=int(v["consecutive"]),
                      skipped_batches=int(v["skipped_batches"]), line_no=no, raw=raw)


def parse_engine_log(text: str) -> list[StepRecord]:
    """Every `[LOSS]` line of an engine log, in log order. Raises LogParseError on malformed ones.

    Order and duplicates are kept as printed (a resumed run repeats steps); judging them is the
    caller's business.
    """
    return _scan(text, "[LOSS]", _step_from_wire, _LOSS_FIELDS, "[LOSS] lines")


def parse_eval_lines(text: str) -> list[EvalRecord]:
    """Every `[EVAL]` line of an engine log, in log order. Raises LogParseError on malformed ones."""
    return _scan(text, "[EVAL]", _eval_from_wire, _EVAL_FIELDS, "[EVAL] lines")


def parse_skip_lines(text: str) -> list[SkipRecord]:
    """Every `[SKIP]` line of an engine log, in log order. Raises LogParseError on malformed ones."""
    return _scan(text, "[SKIP]", _skip_from_wire, _SKIP_FIELDS, "[SKIP] lines")


# --- JSONL twin ---------------------------------------------------------------------------------

_JSON_LOSS = {"step": int, "global_loss": float, "grad_norm": float, "lr": float, "tokens": int,
              "time_s": float, "mfu": float}
_JSON_EVAL = {"step": int, "val_loss": float, "val_bpb": float, "tokens": int}


def _typed(obj: dict[str, Any], spec: dict[str, type]) -> dict[str, Any]:
    out = {}
    for key, kind in spec.items():
        if key not in obj:
            raise ValueError(f"missing key {key!r}")
        value = obj[key]
        # bool is an int to Python, never to us; an int is a fine float (json writes 2.0 as 2.0, but
        # other writers may not).
        ok = not isinstance(value, bool) and (isinstance(value, int) if kind is int else isinstance(value, (int, float)))
        if not ok:
            raise ValueError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}")
        if kind is int and value < 0:
            raise ValueError(f"{key}={value!r} is negative")
        out[key] = kind(value)
    return out


def parse_metrics_jsonl(path: str | Path) -> MetricsFile:
    """Read `<run_dir>/metrics.jsonl`: objects with "kind": "loss" | "eval" and the wire line's keys.

    Extra keys are allowed; missing or mistyped ones, unknown kinds and lines that are not JSON
    objects raise LogParseError (all problems at once). NaN / Infinity (Python's json writes them)
    are accepted as values.
    """
    data = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = data.split("\n")
    tail = ""
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            tail = lines.pop()
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    problems = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            kind = obj.get("kind")
            if kind == "loss":
                v = _typed(obj, _JSON_LOSS)
                steps.append(StepRecord(step=v["step"], loss=v["global_loss"], grad_norm=v["grad_norm"], lr=v["lr"],
                                        tokens=v["tokens"], time_s=v["time_s"], reported_mfu=v["mfu"],
                                        source=SOURCE_METRICS_JSONL, line_no=no, raw=line))
            elif kind == "eval":
                v = _typed(obj, _JSON_EVAL)
                evals.append(EvalRecord(step=v["step"], val_loss=v["val_loss"], val_bpb=v["val_bpb"],
                                        tokens=v["tokens"], source=SOURCE_METRICS_JSONL, line_no=no, raw=line))
            else:
                raise ValueError(f"unknown kind {kind!r} (expected 'loss' or 'eval')")
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            problems.append(LineProblem(line_no=no, line=line, reason=str(err)))
    if problems:
        raise LogParseError(f"records in {path}", problems)
    return MetricsFile(steps=steps, evals=evals, truncated_tail=tail)


# --- Megatron-LM --------------------------------------------------------------------------------

# training.py `training_log`: " [YYYY-mm-dd HH:MM:SS.ffffff] iteration {:8d}/{:8d} | consumed samples:
# {:12d} | elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): {:.1f} |
# learning rate: {:.6E} | global batch size: {:5d} | lm loss: {:.6E} | loss scale: {:.1f} |
# grad norm: {:.3f} | ... | number of skipped iterations: {:3d} | number of nan iterations: {:3d} |"
# (the timestamp and throughput are newer additions; older releases print lr as {:.3E}).
_MEGATRON_HEAD = re.compile(r"(?:^|\]|\s)iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_MEGATRON_REQUIRED = ("consumed samples", "elapsed time per iteration (ms)", "global batch size")


def _megatron_fields(rest: str) -> dict[str, str]:
    fields = {}
    for part in rest.split("|"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.rpartition(":")
        if not sep or not key.strip():
            raise ValueError(f"field {part!r} is not 'name: value'")
        fields[key.strip()] = value.strip()
    return fields


def _megatron_record(fields: dict[str, str], step: int, seq_length: int | None) -> dict[str, Any]:
    for key in _MEGATRON_REQUIRED:
        if key not in fields:
            raise ValueError(f"missing {key!r}")

    def num(key: str, kind: type = float) -> Any:
        if key not in fields:
            return None
        try:
            return kind(fields[key])
        except ValueError:
            raise ValueError(f"{key} = {fields[key]!r} is not a number") from None

    samples = num("global batch size", int)
    time_ms = num("elapsed time per iteration (ms)")
    if time_ms <= 0:
        raise ValueError(f"elapsed time per iteration {time_ms} ms is not positive")
    return dict(step=step, loss=num("lm loss"), grad_norm=num("grad norm"), lr=num("learning rate"),
                tokens=samples * seq_length if seq_length else None, time_s=time_ms / 1000.0,
                reported_tflops=num("throughput per GPU (TFLOP/s/GPU)"), samples=samples)


def parse_megatron_log(text: str, seq_length: int | None = None) -> list[StepRecord]:
    """Megatron-LM's iteration lines as StepRecords (for the same-settings baseline).

    Megatron prints one line per `--log-interval` iterations with the interval's average time per
    iteration; each becomes one record for its last iteration. It never prints the sequence length,
    so `tokens` (global batch size x seq_length) is only filled when `seq_length` is given.
    A line with an `iteration N/ M |` header whose fields do not parse raises LogParseError.
    """
    records = []
    problems = []
    for no, body, rank in _lines(text):
        m = _MEGATRON_HEAD.search(body)
        if not m or "elapsed time per iteration" not in body and "consumed samples" not in body:
            continue
        try:
            values = _megatron_record(_megatron_fields(body[m.end():]), int(m.group(1)), seq_length)
        except ValueError as err:
            problems.append(LineProblem(line_no=no, line=body, reason=str(err)))
            continue
        records.append(StepRecord(**values, source=SOURCE_MEGATRON_LOG, line_no=no, rank=rank, raw=body))
    if problems:
        raise LogParseError("Megatron iteration lines", problems)
    return records


def read_line_times(path: str | Path) -> list[float]:
    """The local launcher's `<log>.times`: row i is when line i of the log arrived (s since launch).

    Index with `record.line_no - 1` for records parsed from that log (not from metrics.jsonl).
    """
    rows = Path(path).read_text().split()
    try:
        times = [float(row) for row in rows]
    except ValueError as err:
        raise ValueError(f"{path}: not a line-times file ({err})") from None
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError(f"{path}: arrival times go backwards")
    return times


def pipe_mismatch(log_text: str, line_times: list[float]) -> str:
    """Why a log cannot be timed by the judge's clock ("" when it can): the judge's pump writes each line and
    its arrival time together, so only a writer outside its pipe makes the two counts differ."""
    written = log_text.count("\n")
    if len(line_times) == written:
        return ""
    return f"its log has {written} lines but the judge's pipe delivered {len(line_times)}: the log was written outside the judge's pipe"
