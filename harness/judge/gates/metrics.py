"""The metrics gate (MODEL = MetricsGate): metric rules over earlier jobs, values the judge computes itself from a
job's log and resolved config, never the engine's own claims.

The judge keeps each job's `log` (the job's stdout + stderr through a pipe the judge owns) and
`log.times` (when each line arrived, by the judge's clock) in its own records, where the job cannot
write. The job's own folder (`{job_dir}`: `config.json`, `metrics.jsonl`, checkpoints) holds claims.
- step records come only from the `[LOSS]` lines of the judge's log (strictly parsed: a malformed
  wire line fails the gate), evaluations from its `[EVAL]` lines; the JSONL twin is never read;
- step times come from the judge's clock: `step_time_s`, `tokens_per_s` and `mfu` use the spacing of
  the [LOSS] lines, and a claimed time_s more than 5 % off that clock fails the rule with both numbers;
- MFU is recomputed with harness.judge.claims.measured_mfu from the model the milestone's job asked for (the base
  commit's preset + the model flags of the argv), never from config.json; the printed `mfu=` is
  ignored except to report the difference;
- the measured numbers of those lines must carry the digits of the documented format (harness/judge/claims/digits.py);
- `val_loss_rel_diff` compares two verified jobs' judged val losses (the judge's forward pass over the windows it
  drew for this judging, the same text for both: their digests must match), signed, never printed numbers;
- `state_bitwise_diff` / `state_rel_diff` compare two jobs' checkpoints, read by the judge (harness/judge/claims/bitwise.py):
  a claim that two runs agree never rests on their printed numbers alone (the spec requires the twin rule);
- config.json's model fields must be the model the milestone's job asked for: the preset named by
  `--preset` in the job's argv, as the base commit's engine/model_spec.toml defines it, overridden by
  model flags in that argv. A run that trained a smaller model fails here, whatever its numbers.
"""

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.judge.baseconfig import ConfigUnknown, expected_config, flag_values
from harness.judge.claims.bitwise import compare_bitwise, compare_layouts, job_checkpoints
from harness.judge.claims.checkpoint_reader import CheckpointError
from harness.judge.claims.digits import digit_problems
from harness.judge.claims.measured_mfu import CLOCK_TOLERANCE, H100_PEAK_TFLOPS, ModelShape, clock_step_times, mfu
from harness.judge.judging import JobOutcome, Judging, tail
from harness.judge.logparse import (
    EvalRecord,
    LogParseError,
    StepRecord,
    parse_engine_log,
    parse_eval_lines,
    pipe_mismatch,
    read_line_times,
)
from harness.spec import OP_TASKS, STATE_METRICS, MetricRule, MetricsGate, compare
from harness.verdict import GateResult

__all__ = ["MODEL", "run", "JobData", "MODEL_FIELDS", "load_job_data", "expected_model", "model_mismatches", "judge_metrics",
           "RuleFailure"]

# The fields that decide what model was trained (and what the FLOP count is).
MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "ffn_hidden_size", "seq_length")
_BATCH_FIELDS = ("global_batch_size",)
_WARMUP_STEPS = 2  # steps left out of MFU when a rule gives no window (allocator warm-up, compilation)


MODEL = MetricsGate


def run(gate: MetricsGate, judging: Judging) -> GateResult:
    defaults, presets = judging.ctx.base_config()
    violations, metrics, flags = judge_metrics(gate, judging.jobs, tree=judging.tree, presets=presets or None,
                                               defaults=defaults)
    judging.flags += flags
    if violations:
        tails = [tail(o.result.read_log(), 20) for o in judging.jobs.values()]
        return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations), metrics=metrics,
                          log_tail="\n".join(tails), summary=f"{len(violations)} of {len(gate.rules)} rule(s) fail")
    return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=metrics,
                      summary=f"{len(gate.rules)} rule(s) hold")


class RuleFailure(ValueError):
    """A metric could not be computed (no data, wrong job kind); the rule fails with this message."""


@dataclass(frozen=True)
class JobData:
    """What the judge read back from a job's folder."""

    steps: list[StepRecord]
    evals: list[EvalRecord]
    config: dict[str, Any] | None
    line_times: list[float] | None  # only when the steps came from the log they index into
    source: str
    problems: list[str]


def load_job_data(outcome: JobOutcome) -> JobData:
    problems: list[str] = []
    log_text = outcome.result.read_log()
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    try:
        steps = parse_engine_log(log_text)
        evals = parse_eval_lines(log_text)
    except LogParseError as err:
        problems.append(f"job {outcome.gate.name}: {err}")
    problems += [f"job {outcome.gate.name}: {p}" for p in digit_problems(steps, evals)]
    line_times = None
    if steps and outcome.result.line_times_path is not None and outcome.result.line_times_path.is_file():
        line_times = read_line_times(outcome.result.line_times_path)
        if mismatch := pipe_mismatch(log_text, line_times):
            problems.append(f"job {outcome.gate.name}: {mismatch}")
    config = None
    config_file = outcome.job_dir / "config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else None
        except ValueError as err:
            problems.append(f"job {outcome.gate.name}: config.json is not JSON ({err})")
    return JobData(steps=steps, evals=evals, config=config, line_times=line_times, source="log", problems=problems)


def expected_model(argv: Sequence[str], presets: Mapping[str, Any] | None,
                   defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The configuration the milestone's job asked for (harness/judge/baseconfig.py: the base commit's
    defaults < its preset named by `--preset` < the argv's flags). Raises RuleFailure when unknown."""
    typed = {name: 0 for name in (*MODEL_FIELDS, *_BATCH_FIELDS)} | dict(defaults or {})
    try:
        config = expected_config(argv, defaults=typed, presets=presets or {})
    except ConfigUnknown as err:
        raise RuleFailure(str(err)) from None
    stated = set(defaults or {}) | set((presets or {}).get(str(config.get("preset")), {})) | {
        f.replace("-", "_") for f in flag_values(argv)}
    return {k: v for k, v in config.items() if k in stated or k == "preset"}


def model_mismatches(argv: Sequence[str], config: Mapping[str, Any] | None, presets: Mapping[str, Any] | None,
                     defaults: Mapping[str, Any] | None = None) -> list[str]:
    """Violations where the model the job says it trained (config.json) is not the one its argv asked for."""
    if config is None:
        return ["the job wrote no readable config.json in its run folder; the judge cannot tell what model it trained"]
    try:
        expected = expected_model(argv, presets, defaults)
    except RuleFailure as err:
        return [str(err)]
    if "preset" in expected and config.get("preset") != expected["preset"]:
        return [f"config.json says preset {config.get('preset')!r}, the job asked for {expected['preset']!r}"]
    return [f"config.json has {name} = {config.get(name)!r}, the milestone's job asks for {value!r}"
            for name, value in expected.items() if name in MODEL_FIELDS and config.get(name) != value]


def _window(records: Sequence[Any], rule: MetricRule) -> list[Any]:
    return [r for r in records if (rule.from_step is None or r.step >= rule.from_step)
            and (rule.to_step is None or r.step <= rule.to_step)]


def _ref_rows(path: Path) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise RuleFailure(f"reference {path.name}:{number} is not JSON ({err})") from None
        if isinstance(obj, dict) and "_meta" not in obj and isinstance(obj.get("step"), int):
            rows[obj["step"]] = {k: float(v) for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return rows


def _rows(steps: Sequence[StepRecord]) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for r in steps:  # a resumed run repeats steps; the last print of a step wins
        row = {}
        if r.loss is not None:
            row["global_loss"] = r.loss
        if r.grad_norm is not None:
            row["grad_norm"] = r.grad_norm
        rows[r.step] = row
    return rows


def _diff(ours: Mapping[int, Mapping[str, float]], ref: Mapping[int, Mapping[str, float]], key: str,
          rule: MetricRule, relative: bool, mean: bool = False) -> float:
    common = sorted(s for s in set(ours) & set(ref) if key in ours[s] and key in ref[s]
                    and (rule.from_step is None or s >= rule.from_step) and (rule.to_step is None or s <= rule.to_step))
    if not common:
        raise RuleFailure(f"no step in common with the reference that has {key}")
    diffs = []
    for step in common:
        a, b = ours[step][key], ref[step][key]
        if math.isnan(a) or math.isnan(b):
            return math.nan
        d = abs(a - b)
        if relative:
            d = 0.0 if d == 0 else d / abs(b) if b else math.inf
        diffs.append(d)
    return statistics.fmean(diffs) if mean else max(diffs)


@dataclass
class _Ctx:
    presets: Mapping[str, Any] | None
    defaults: Mapping[str, Any]
    tree: Path
    jobs: Mapping[str, JobOutcome]
    data: dict[str, JobData]
    flags: list[str]
    metrics: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)  # "job.metric" -> where a comparison found its largest difference


def _value(rule: MetricRule, ctx: _Ctx) -> float:
    outcome, data = ctx.jobs[rule.job], ctx.data[rule.job]
    steps = _window(data.steps, rule)
    metric = rule.metric
    if metric == "val_loss" and outcome.evidence and "judge_val_loss" in outcome.evidence and rule.to_step is None:
        return outcome.evidence["judge_val_loss"]  # the judge's own forward pass over its own held-out draw
    if metric in ("val_loss", "val_bpb"):
        evals = _window(data.evals, rule)
        if not evals:
            raise RuleFailure(f"job {rule.job} printed no [EVAL] line in the window")
        return getattr(evals[-1], metric)
    if metric == "val_loss_rel_diff":
        return _judged_rel_diff(rule, ctx)
    if metric == "speedup":
        if not outcome.evidence or "speedup" not in outcome.evidence:
            raise RuleFailure(f"job {rule.job} has no speedup: the judge could not time both roles")
        return outcome.evidence["speedup"]
    if not steps:
        raise RuleFailure(f"job {rule.job} logged no [LOSS] step in the window ({data.source})")
    if metric == "steps":
        return float(len({r.step for r in steps}))
    if metric == "final_loss":
        return float("nan") if steps[-1].loss is None else steps[-1].loss
    if metric == "min_loss":
        losses = [r.loss for r in steps if r.loss is not None]
        return float("nan") if not losses or any(math.isnan(x) for x in losses) else min(losses)
    if metric == "step_time_s":
        return _clock_step_s(rule, data, steps)
    if metric == "tokens_per_s":
        clock = _clock_step_s(rule, data, steps)
        return statistics.median(r.tokens for r in steps if r.tokens) / clock
    if metric == "mfu":
        return _mfu(rule, outcome, data, steps, ctx)
    if metric in STATE_METRICS:
        return _state(rule, ctx)
    if metric in ("loss_rel_diff", "loss_mean_rel_diff", "loss_max_abs_diff", "grad_norm_rel_diff"):
        if rule.ref is not None:
            ref_file = ctx.tree / rule.ref
            if not ref_file.is_file():
                raise RuleFailure(f"reference file {rule.ref} does not exist")
            ref = _ref_rows(ref_file)
        else:
            ref = _rows(ctx.data[rule.ref_job or ""].steps)
        key = "grad_norm" if metric == "grad_norm_rel_diff" else "global_loss"
        return _diff(_rows(steps), ref, key, rule, relative=metric != "loss_max_abs_diff",
                     mean=metric == "loss_mean_rel_diff")
    raise RuleFailure(f"metric {metric} is not computed by this judge")


def _judged_rel_diff(rule: MetricRule, ctx: _Ctx) -> float:
    """(job - ref) / ref of the two jobs' judged val losses (their verification's evidence), signed; only on the same
    drawn windows (equal digests): losses on different text say nothing about the runs."""
    ref_name = rule.ref_job or ""
    found = {}
    for name in (rule.job, ref_name):
        evidence = ctx.jobs[name].evidence or {}
        if "judge_val_loss" not in evidence or "judge_val_windows" not in evidence:
            raise RuleFailure(f"job {name} has no judged val loss: the judge measures it when it verifies a train job's "
                              "final weights, and this job's verification did not (see its job gate)")
        found[name] = evidence
    ours, ref = found[rule.job]["judge_val_loss"], found[ref_name]["judge_val_loss"]
    if found[rule.job]["judge_val_windows"] != found[ref_name]["judge_val_windows"]:
        raise RuleFailure(f"jobs {rule.job} and {ref_name} were judged on different validation windows (their data or "
                          "seq_length differ), so their losses do not compare")
    ctx.notes[f"{rule.job}.{rule.metric}"] = f"judged val loss {ours:.6g} vs {ref:.6g} of job {ref_name}"
    if math.isnan(ours) or math.isnan(ref):
        return math.nan
    return (ours - ref) / ref if ref else math.inf


def _state(rule: MetricRule, ctx: _Ctx) -> float:
    """The two jobs' checkpoints of every step both kept, the last step both printed among them (bitwise.py)."""
    ref_name = rule.ref_job or ""
    ours = job_checkpoints(ctx.jobs[rule.job].argv, ctx.jobs[rule.job].kept)
    ref = job_checkpoints(ctx.jobs[ref_name].argv, ctx.jobs[ref_name].kept)
    common = sorted(set(ours) & set(ref))
    last = min(max((r.step for r in ctx.data[n].steps), default=0) for n in (rule.job, ref_name))
    if last not in common:
        raise RuleFailure(f"no checkpoint of step {last} (the last step both jobs printed) in both jobs' folders "
                          f"(job {rule.job} kept steps {sorted(ours) or 'none'}, job {ref_name} {sorted(ref) or 'none'}): "
                          "the judge compares the runs' saved state, not their printed numbers")
    try:
        if rule.metric == "state_bitwise_diff":
            result = compare_bitwise(ours, ref, common)
            value = float(result.differing)
        else:
            result = compare_layouts(ours, ref, common, tolerance=rule.value)
            value = math.inf if any(d.what != "tolerance" for d in result.differences) else result.max_rel
    except CheckpointError as err:
        raise RuleFailure(f"the judge cannot read a checkpoint to compare: {err}") from None
    where = result.describe() if result.differences else f"largest at {result.worst}" if result.worst else ""
    ctx.notes[f"{rule.job}.{rule.metric}"] = f"steps {common[0]}..{common[-1]}, {result.keys} tensors and values; {where}"
    return value


def _clock_step_s(rule: MetricRule, data: JobData, steps: list[StepRecord]) -> float:
    """Median seconds per step by the judge's clock over the window; the claimed time_s must agree within 5 %."""
    if data.line_times is None:
        raise RuleFailure(f"job {rule.job}: the judge has no clock for its [LOSS] lines (no line times)")
    pairs = clock_step_times(steps, data.line_times)
    if not pairs:
        raise RuleFailure(f"job {rule.job}: fewer than two consecutive [LOSS] lines in the window, so the judge's clock "
                          "cannot time a step")
    clock = statistics.median(dt for _, dt in pairs)
    claimed = statistics.median(r.time_s for r in steps if r.time_s is not None)
    if clock <= 0 or abs(claimed - clock) > CLOCK_TOLERANCE * clock:
        raise RuleFailure(f"job {rule.job}: time_s claims {claimed:.6f} s per step, the judge's clock measured "
                          f"{clock:.6f} s ({abs(claimed - clock) / max(clock, 1e-12):.1%} apart; tolerance "
                          f"{CLOCK_TOLERANCE:.0%})")
    return clock


def _mfu(rule: MetricRule, outcome: JobOutcome, data: JobData, steps: list[StepRecord], ctx: _Ctx) -> float:
    gpus = outcome.gate.gpus * outcome.gate.nodes
    if gpus == 0:
        raise RuleFailure(f"mfu needs a GPU job; job {rule.job} runs on CPU (gpus = 0)")
    expected = expected_model(outcome.argv or outcome.gate.argv, ctx.presets, ctx.defaults)
    try:
        shape = ModelShape.from_config(expected)
        tokens = int(expected["global_batch_size"]) * int(expected["seq_length"])
    except (KeyError, ValueError, TypeError) as err:
        raise RuleFailure(f"job {rule.job}: the judge cannot size the model it asked for ({err}): the job's argv "
                          "must name --preset (a preset of the base commit) and --global-batch-size") from None
    skip = 0 if rule.from_step is not None else _WARMUP_STEPS
    try:
        summary = mfu(steps, shape, gpus, H100_PEAK_TFLOPS, skip_first=min(skip, max(len(steps) - 1, 0)),
                      expected_tokens=tokens, line_times=data.line_times)
    except ValueError as err:
        raise RuleFailure(f"job {rule.job}: {err}") from None
    if summary.reported_median is not None:
        ctx.metrics[f"{rule.job}.mfu_engine_claim"] = summary.reported_median
    ctx.metrics[f"{rule.job}.mfu_by_time_s"] = summary.median
    for reason in summary.implausible_reasons:
        ctx.flags.append(f"job {rule.job}: {reason}")
    if summary.implausible:
        raise RuleFailure(f"MFU of {rule.job} is implausible: " + "; ".join(summary.implausible_reasons))
    if summary.clock_mfu is None:
        raise RuleFailure(f"job {rule.job}: the judge's clock could not time its steps, so it has no MFU")
    return summary.clock_mfu


def judge_metrics(gate: MetricsGate, jobs: Mapping[str, JobOutcome], *, tree: Path, presets: Mapping[str, Any] | None,
                  defaults: Mapping[str, Any] | None = None) -> tuple[list[str], dict[str, float], list[str]]:
    """(violations, computed metrics, implausibility flags) of one metrics gate. `presets` and `defaults` are
    the base commit's (harness/judge/baseconfig.py): what a job was asked to run is derived from them."""
    ctx = _Ctx(presets=presets, defaults=defaults or {}, tree=tree, jobs=jobs, data={}, flags=[], metrics={})
    violations: list[str] = []
    needed = {r.job for r in gate.rules} | {r.ref_job for r in gate.rules if r.ref_job}
    for name in sorted(needed):
        if name not in jobs:
            violations.append(f"job {name} did not run in this attempt")
            continue
        if jobs[name].gate.task in OP_TASKS:  # judged from its files and clock by the job gate (opjudge.py)
            ctx.data[name] = JobData(steps=[], evals=[], config=None, line_times=None, source="bench", problems=[])
            continue
        ctx.data[name] = load_job_data(jobs[name])
        violations += ctx.data[name].problems
        if jobs[name].gate.task == "train":
            violations += [f"job {name}: {v}" for v in model_mismatches(jobs[name].argv or jobs[name].gate.argv,
                                                                         ctx.data[name].config, presets, ctx.defaults)]
    if violations:
        return violations, ctx.metrics, ctx.flags
    for rule in gate.rules:
        try:
            value = _value(rule, ctx)
        except RuleFailure as err:
            violations.append(f"{rule.describe()}: {err}")
            continue
        ctx.metrics[f"{rule.job}.{rule.metric}"] = value
        if not compare(rule.op, value, rule.value):
            note = ctx.notes.get(f"{rule.job}.{rule.metric}")
            violations.append(f"{rule.metric} of {rule.job} = {value:.6g}, needs {rule.op} {rule.value:g}"
                              + (f" ({rule.describe()})" if rule.ref or rule.ref_job or rule.from_step or rule.to_step else "")
                              + (f": {note}" if note else ""))
    return violations, ctx.metrics, ctx.flags
