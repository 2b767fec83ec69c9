"""Metric rules: values the judge computes itself from a job's log and resolved config, never the
engine's own claims.

Each train job leaves in its folder the launcher's `log` (and, for local jobs, `log.times`: when each
line arrived), the engine's `metrics.jsonl` and its resolved `config.json`. From these:
- step records come from the `[LOSS]` lines of the log (strictly parsed: a malformed wire line fails
  the gate), else from metrics.jsonl; evaluations from `[EVAL]` lines, else from metrics.jsonl;
- MFU is recomputed with harness.judge.mfu from tokens, time_s and the model shape in config.json,
  with the clock check against the launcher's line times; the printed `mfu=` is ignored except to
  report the difference;
- config.json's model fields must be the model the milestone's job asked for: the preset named by
  `--preset` in the job's argv, as the base commit's engine/model_spec.toml defines it, overridden by
  model flags in that argv. A run that trained a smaller model fails here, whatever its numbers.
"""

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.jobs import JobResult
from harness.judge.logparse import (
    EvalRecord,
    LogParseError,
    StepRecord,
    parse_engine_log,
    parse_eval_lines,
    parse_metrics_jsonl,
    read_line_times,
)
from harness.judge.mfu import H100_PEAK_TFLOPS, ModelShape, expected_tokens_per_step, mfu
from harness.spec import JobGate, MetricRule, MetricsGate, compare

__all__ = ["JobOutcome", "JobData", "MODEL_FIELDS", "load_job_data", "model_mismatches", "judge_metrics", "RuleFailure"]

# The fields that decide what model was trained (and what the FLOP count is).
MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "ffn_hidden_size", "seq_length")
_WARMUP_STEPS = 2  # steps left out of MFU when a rule gives no window (allocator warm-up, compilation)


class RuleFailure(ValueError):
    """A metric could not be computed (no data, wrong job kind); the rule fails with this message."""


@dataclass(frozen=True)
class JobOutcome:
    """One job gate's run during this judging: its folder under runs/<id>/jobs/ and how it ended."""

    gate: JobGate
    job_id: str
    job_dir: Path
    result: JobResult


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
    source = "log"
    line_times = None
    twin = outcome.job_dir / outcome.gate.metrics_file
    if not steps and not problems and twin.is_file():
        try:
            parsed = parse_metrics_jsonl(twin)
            steps, evals, source = parsed.steps, parsed.evals or evals, outcome.gate.metrics_file
        except LogParseError as err:
            problems.append(f"job {outcome.gate.name}: {err}")
    elif steps and outcome.result.line_times_path is not None and outcome.result.line_times_path.is_file():
        line_times = read_line_times(outcome.result.line_times_path)
    config = None
    config_file = outcome.job_dir / "config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else None
        except ValueError as err:
            problems.append(f"job {outcome.gate.name}: config.json is not JSON ({err})")
    return JobData(steps=steps, evals=evals, config=config, line_times=line_times, source=source, problems=problems)


def _flag_values(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` and `--name=value` pairs of an argv (last one wins, as argparse does)."""
    out = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        if sep:
            out[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[name] = argv[i + 1]
    return out


def model_mismatches(argv: Sequence[str], config: Mapping[str, Any] | None, presets: Mapping[str, Any] | None) -> list[str]:
    """Violations where the trained model (config.json) is not the one the job's argv asked for."""
    if config is None:
        return ["the job wrote no readable config.json in its run folder; the judge cannot tell what model it trained"]
    flags = _flag_values(argv)
    preset = flags.get("preset")
    if preset is not None and config.get("preset") != preset:
        return [f"config.json says preset {config.get('preset')!r}, the job asked for {preset!r}"]
    expected: dict[str, Any] = {}
    if presets is not None and config.get("preset") in presets:
        expected.update({k: v for k, v in presets[config["preset"]].items() if k in MODEL_FIELDS})
    elif presets is not None and preset is not None:
        return [f"preset {preset!r} is not in the base commit's engine/model_spec.toml"]
    for name in MODEL_FIELDS:
        flag = name.replace("_", "-")
        if flag in flags:
            try:
                expected[name] = int(flags[flag])
            except ValueError:
                return [f"--{flag} {flags[flag]!r} in the job's argv is not an integer"]
    out = []
    for name, value in expected.items():
        if config.get(name) != value:
            out.append(f"config.json has {name} = {config.get(name)!r}, the milestone's job asks for {value!r}")
    return out


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
          rule: MetricRule, relative: bool) -> float:
    common = sorted(s for s in set(ours) & set(ref) if key in ours[s] and key in ref[s]
                    and (rule.from_step is None or s >= rule.from_step) and (rule.to_step is None or s <= rule.to_step))
    if not common:
        raise RuleFailure(f"no step in common with the reference that has {key}")
    worst = 0.0
    for step in common:
        a, b = ours[step][key], ref[step][key]
        if math.isnan(a) or math.isnan(b):
            return math.nan
        d = abs(a - b)
        if relative:
            d = 0.0 if d == 0 else d / abs(b) if b else math.inf
        worst = max(worst, d)
    return worst


@dataclass
class _Ctx:
    tree: Path
    jobs: Mapping[str, JobOutcome]
    data: dict[str, JobData]
    flags: list[str]
    metrics: dict[str, float]


def _value(rule: MetricRule, ctx: _Ctx) -> float:
    outcome, data = ctx.jobs[rule.job], ctx.data[rule.job]
    steps = _window(data.steps, rule)
    metric = rule.metric
    if metric in ("val_loss", "val_bpb"):
        evals = _window(data.evals, rule)
        if not evals:
            raise RuleFailure(f"job {rule.job} printed no [EVAL] line in the window")
        return getattr(evals[-1], metric)
    if metric == "speedup":
        raise RuleFailure("speedup needs a bench job's output, which the engine does not produce yet")
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
        return statistics.median(r.time_s for r in steps if r.time_s is not None)
    if metric == "tokens_per_s":
        return statistics.median(r.tokens / r.time_s for r in steps if r.tokens and r.time_s)
    if metric == "mfu":
        return _mfu(rule, outcome, data, steps, ctx)
    if metric in ("loss_rel_diff", "loss_max_abs_diff", "grad_norm_rel_diff"):
        if rule.ref is not None:
            ref_file = ctx.tree / rule.ref
            if not ref_file.is_file():
                raise RuleFailure(f"reference file {rule.ref} does not exist")
            ref = _ref_rows(ref_file)
        else:
            ref = _rows(ctx.data[rule.ref_job or ""].steps)
        key = "grad_norm" if metric == "grad_norm_rel_diff" else "global_loss"
        return _diff(_rows(steps), ref, key, rule, relative=metric != "loss_max_abs_diff")
    raise RuleFailure(f"metric {metric} is not computed by this judge")


def _mfu(rule: MetricRule, outcome: JobOutcome, data: JobData, steps: list[StepRecord], ctx: _Ctx) -> float:
    gpus = outcome.gate.gpus * outcome.gate.nodes
    if gpus == 0:
        raise RuleFailure(f"mfu needs a GPU job; job {rule.job} runs on CPU (gpus = 0)")
    if data.config is None:
        raise RuleFailure(f"job {rule.job} wrote no config.json: the judge needs the model shape for MFU")
    try:
        shape = ModelShape.from_config(data.config)
        tokens = expected_tokens_per_step(data.config)
    except ValueError as err:
        raise RuleFailure(f"job {rule.job}: {err}") from None
    skip = 0 if rule.from_step is not None else _WARMUP_STEPS
    try:
        summary = mfu(steps, shape, gpus, H100_PEAK_TFLOPS, skip_first=min(skip, max(len(steps) - 1, 0)),
                      expected_tokens=tokens, line_times=data.line_times)
    except ValueError as err:
        raise RuleFailure(f"job {rule.job}: {err}") from None
    ctx.metrics[f"{rule.job}.mfu"] = summary.median
    if summary.reported_median is not None:
        ctx.metrics[f"{rule.job}.mfu_engine_claim"] = summary.reported_median
    if summary.clock_mfu is not None:
        ctx.metrics[f"{rule.job}.mfu_by_clock"] = summary.clock_mfu
    for reason in summary.implausible_reasons:
        ctx.flags.append(f"job {rule.job}: {reason}")
    if summary.implausible:
        raise RuleFailure(f"MFU of {rule.job} is implausible: " + "; ".join(summary.implausible_reasons))
    return summary.median


def judge_metrics(gate: MetricsGate, jobs: Mapping[str, JobOutcome], *, tree: Path,
                  presets: Mapping[str, Any] | None) -> tuple[list[str], dict[str, float], list[str]]:
    """(violations, computed metrics, implausibility flags) of one metrics gate."""
    ctx = _Ctx(tree=tree, jobs=jobs, data={}, flags=[], metrics={})
    violations: list[str] = []
    needed = {r.job for r in gate.rules} | {r.ref_job for r in gate.rules if r.ref_job}
    for name in sorted(needed):
        if name not in jobs:
            violations.append(f"job {name} did not run in this attempt")
            continue
        ctx.data[name] = load_job_data(jobs[name])
        violations += ctx.data[name].problems
        if jobs[name].gate.task == "train":
            violations += [f"job {name}: {v}" for v in model_mismatches(jobs[name].gate.argv, ctx.data[name].config, presets)]
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
            violations.append(f"{rule.metric} of {rule.job} = {value:.6g}, needs {rule.op} {rule.value:g}"
                              + (f" ({rule.describe()})" if rule.ref or rule.ref_job or rule.from_step or rule.to_step else ""))
    return violations, ctx.metrics, ctx.flags
