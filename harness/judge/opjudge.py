"""The judge's decision on an op version: outputs against its own fp32 math, speed by its own clock.

A bench or stress gate runs harness/opbench.py in two roles, alternately: `reference` in a checkout of the
base commit (the base's `baseline` version) and `candidate` in the judged checkout. Neither process reports
a time or a verdict; this module reads what they wrote (harness/judge/tensorfile.py, never pickle) and the
arrival times of their `[BENCH]` lines on the judge's pipe:

- correctness: for every case drawn from the judging's seed, the judge regenerates the inputs and computes
  the contract in fp32 (harness/judge/opcases.py). Each output and gradient of the candidate must be within
  MAX_REL_ERR of it (relative Frobenius error) and within BASE_FACTOR x the base baseline's own error +
  BASE_SLACK (a version may round differently, not worse than twice as much);
- every timed call's checksum row (a fixed random projection and the norm of each result) must match the
  reference process's row for the same fresh inputs within CHECK_TOL of the result's norm: a call that was
  skipped, or answered from a cache, cannot;
- time per call = (op segments - overhead segments) / calls, by the judge's clock; speedup = the median
  reference time / the median candidate time over the rounds;
- stress: every loaded iteration agrees with the unloaded call within STRESS_TOL, and the unloaded call
  with the reference process's within CHECK_TOL.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.judge.logparse import pipe_mismatch, read_line_times
from harness.judge.opcases import DTYPES, draw_cases, make_inputs, reference, result_names
from harness.judge.tensorfile import TensorFileError, read_tensors

__all__ = ["OpRun", "judge_bench", "judge_stress", "segment_times", "MAX_REL_ERR", "BASE_FACTOR", "BASE_SLACK",
           "CHECK_TOL", "STRESS_TOL"]

MAX_REL_ERR = 1e-2  # bf16 outputs of a correct kernel sit near 4e-3 (one rounding of O(1) values)
BASE_FACTOR, BASE_SLACK = 2.0, 1e-3
CHECK_TOL = 5e-2  # two correct bf16 versions differ by ~1e-2 of a result's norm; a stale result by ~1.4x
STRESS_TOL = 1e-3  # the same inputs twice: only a kernel's nondeterministic reduction order may differ
_SEGMENT = re.compile(r"^\[BENCH\] segment=(op|overhead) index=(\d+)(?: reps=(\d+))? (start|end)\s*$")


@dataclass(frozen=True)
class OpRun:
    """One process of a bench or stress gate: its role, round, folder and the judge's log of it."""

    role: str  # "reference" | "candidate"
    round: int
    out_dir: Path
    log_path: Path
    line_times_path: Path | None


def segment_times(run: OpRun) -> tuple[dict[str, float], int, list[str]]:
    """(seconds per segment kind, calls timed, problems) from the judge's log and line times of a bench run."""
    text = run.log_path.read_bytes().decode("utf-8", errors="replace") if run.log_path.is_file() else ""
    lines = text.splitlines()
    if run.line_times_path is None or not run.line_times_path.is_file():
        return {}, 0, [f"{run.role} round {run.round}: the judge has no line times for its log"]
    times = read_line_times(run.line_times_path)
    if mismatch := pipe_mismatch(text, times):
        return {}, 0, [f"{run.role} round {run.round}: {mismatch}"]
    open_at: dict[tuple[str, str], float] = {}
    total = {"op": 0.0, "overhead": 0.0}
    calls = {"op": 0, "overhead": 0}
    for number, line in enumerate(lines):
        m = _SEGMENT.match(line)
        if not m:
            continue
        kind, index, reps, edge = m.groups()
        if edge == "start":
            open_at[(kind, index)] = times[number]
            calls[kind] += int(reps or 0)
        elif (kind, index) in open_at:
            total[kind] += times[number] - open_at.pop((kind, index))
    if open_at or not calls["op"] or calls["op"] != calls["overhead"]:
        return {}, 0, [f"{run.role} round {run.round}: its timed segments are incomplete (the job stopped early or "
                       "printed out of order)"]
    return total, calls["op"], []


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.float() - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-30))


def _read(path: Path, who: str, problems: list[str]) -> dict[str, torch.Tensor] | None:
    try:
        return read_tensors(path)
    except TensorFileError as err:
        problems.append(f"{who}: {err}")
        return None


def _correctness(op: str, seed: int, count: int, scale: float, dtype: torch.dtype, runs: list[OpRun],
                 problems: list[str]) -> float:
    """Check every case of every run; the largest candidate error seen."""
    worst = 0.0
    base_run = next(r for r in runs if r.role == "reference")
    candidates = [r for r in runs if r.role == "candidate"]
    for i, case in enumerate(draw_cases(op, seed, count, scale=scale)):
        truth = reference(case, make_inputs(case, dtype=dtype))
        base = _read(base_run.out_dir / f"case-{i}.tensors", f"reference case {i}", problems)
        for run in candidates:
            got = _read(run.out_dir / f"case-{i}.tensors", f"candidate round {run.round} case {i}", problems)
            if got is None or base is None:
                continue
            for name in result_names(case):
                want = truth[name]
                if name not in got or tuple(got[name].shape) != tuple(want.shape):
                    problems.append(f"{case.label()}: {name} is missing or has the wrong shape "
                                    f"({tuple(got[name].shape) if name in got else None}, expected {tuple(want.shape)})")
                    continue
                if not torch.isfinite(got[name].float()).all():
                    problems.append(f"{case.label()}: {name} has NaN or Inf")
                    continue
                err, base_err = _rel(got[name], want), _rel(base[name], want)
                worst = max(worst, err)
                limit = min(MAX_REL_ERR, BASE_FACTOR * base_err + BASE_SLACK)
                if err > limit:
                    problems.append(f"{case.label()}: {name} is {err:.2e} from the judge's fp32 result (relative); "
                                    f"the limit is {limit:.2e} (the baseline's own error is {base_err:.2e})")
    return worst


def _match_rows(rows: torch.Tensor, ref: torch.Tensor, tol: float, names: list[str], what: str) -> list[str]:
    """Rows [calls, results, (dot, norm)] against ref rows of the same layout."""
    if rows.shape != ref.shape:
        return [f"{what}: {rows.shape[0] if rows.dim() else 0} checksum rows, the reference has {ref.shape[0]} "
                "(calls skipped or added)"]
    norm = ref[..., 1].abs()
    bad = ((rows - ref).abs() > tol * norm.unsqueeze(-1) + 1e-12).any(dim=-1)
    if not torch.isfinite(rows).all():
        bad |= ~torch.isfinite(rows).all(dim=-1)
    if not bad.any():
        return []
    call, result = (int(i) for i in bad.nonzero()[0])
    return [f"{what}: {int(bad.any(dim=1).sum())} of {rows.shape[0]} calls disagree with the reference process on the "
            f"same inputs beyond {tol:g} of the result's norm (first: call {call}, {names[result]}): a call skipped, "
            "cached or computed on other data"]


def judge_bench(*, op: str, seed: int, cases: int, case_scale: float, dtype: str, timing_names: list[str],
                runs: list[OpRun]) -> tuple[list[str], dict[str, float]]:
    """(problems, metrics) of a bench gate's runs: correctness, per-call checksums, speedup by the clock."""
    problems: list[str] = []
    worst = _correctness(op, seed, cases, case_scale, DTYPES[dtype], runs, problems)
    ref_rows = None
    per_call: dict[str, list[float]] = {"reference": [], "candidate": []}
    for run in runs:
        rows = _read(run.out_dir / "checks.tensors", f"{run.role} round {run.round} checksums", problems)
        if rows is not None and "rows" in rows:
            if run.role == "reference" and ref_rows is None:
                ref_rows = rows["rows"]
            elif run.role == "candidate" and ref_rows is not None:
                problems += _match_rows(rows["rows"], ref_rows, CHECK_TOL, timing_names, f"candidate round {run.round}")
        totals, calls, trouble = segment_times(run)
        problems += trouble
        if calls:
            seconds = (totals["op"] - totals["overhead"]) / calls
            if seconds <= 0:
                problems.append(f"{run.role} round {run.round}: its op segments took no longer than the overhead "
                                "ones by the judge's clock: the shape is too small to time, or calls were skipped")
            else:
                per_call[run.role].append(seconds)
    metrics = {"max_rel_err": worst}
    if per_call["reference"] and per_call["candidate"]:
        ref_s, cand_s = statistics.median(per_call["reference"]), statistics.median(per_call["candidate"])
        metrics.update({"reference_ms": ref_s * 1e3, "candidate_ms": cand_s * 1e3, "speedup": ref_s / cand_s})
    return problems, metrics


def judge_stress(*, timing_names: list[str], runs: list[OpRun], min_iterations: int = 1) -> tuple[list[str], dict[str, float]]:
    """(problems, metrics) of a stress gate: loaded iterations against the quiet call and the reference's."""
    problems: list[str] = []
    ref = next((r for r in runs if r.role == "reference"), None)
    ref_rows = _read(ref.out_dir / "checks.tensors", "reference checksums", problems) if ref else None
    metrics: dict[str, float] = {}
    for run in (r for r in runs if r.role == "candidate"):
        got = _read(run.out_dir / "checks.tensors", f"candidate round {run.round} checksums", problems)
        if got is None or "rows" not in got or got["rows"].dim() != 3 or got["rows"].shape[0] < 1:
            problems.append(f"candidate round {run.round}: no checksum rows")
            continue
        rows = got["rows"]
        metrics["iterations"] = float(rows.shape[0] - 1)
        if rows.shape[0] - 1 < min_iterations:
            problems.append(f"candidate round {run.round}: {rows.shape[0] - 1} loaded iterations, at least "
                            f"{min_iterations} required")
        problems += _match_rows(rows[1:], rows[:1].expand_as(rows[1:]), STRESS_TOL, timing_names,
                                f"candidate round {run.round} under load")
        if ref_rows is not None and "rows" in ref_rows:
            problems += _match_rows(rows[:1], ref_rows["rows"][:1], CHECK_TOL, timing_names,
                                    f"candidate round {run.round}, the quiet call")
    return problems, metrics
