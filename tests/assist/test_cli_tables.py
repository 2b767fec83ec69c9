"""`temper milestones` and `temper runs` show state at a glance: each milestone with what it needs and whether this
machine can judge it; each run with its milestone, status, attempts, last verdict and age. Real processes."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from harness.records import RunRecord
from harness.verdict import GateResult, Verdict

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]


def temper(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("TEMPER_RUNS_DIR", "TEMPER_DATA")}
    full.update(TEMPER_HOME=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def table(text: str) -> list[dict[str, str]]:
    """A column-aligned table (header first) as dicts, cut at the header's column starts."""
    header, *rows = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    cut = lambda line: [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None], strict=True)]  # noqa: E731
    return [dict(zip(names, cut(row), strict=True)) for row in rows]


def test_milestones_say_whether_this_machine_can_judge_them(tmp_path: Path) -> None:
    proc = temper("milestones", TEMPER_DATA=str(tmp_path / "no-data"))
    assert proc.returncode == 0, proc.stderr
    rows = {row["MILESTONE"]: row for row in table(proc.stdout)}
    specs = {p.stem: tomllib.loads(p.read_text()) for p in (REPO / "milestones").glob("*.toml")}
    assert set(rows) == set(specs)
    gpus_here = shutil.which("nvidia-smi") is not None
    for name, spec in specs.items():
        requires = spec.get("requires", {})
        reads_data = any("{data}" in arg for gate in spec["gates"] for arg in gate.get("argv", []))
        expected = (requires.get("device", "cpu") != "cuda" or gpus_here) and not requires.get("slurm", False) \
            and not reads_data
        if gpus_here and requires.get("device") == "cuda":
            continue  # which GPUs match is the judge's business (tests/judge/test_hardware.py)
        assert rows[name]["HERE"].startswith("yes" if expected else "no: "), (name, rows[name])
        assert rows[name]["GOAL"] == spec["title"]
    assert "lacks the data its jobs read" in rows["long-horizon"]["HERE"] and "{data}" not in rows["long-horizon"]["HERE"]
    if not gpus_here:
        assert rows["perf"]["HERE"] == "no: this machine has 0 (no GPU)" and rows["perf"]["NEEDS"] == "1 x H100/H200 GPU"


def test_runs_show_status_attempts_verdict_and_age(tmp_path: Path) -> None:
    runs = tmp_path / "runs"

    def record(run_id: str) -> RunRecord:
        return RunRecord.create(milestone_id="demo-tiny", spec_hash="0" * 64, agent={"backend": "replay"},
                                base_commit="0" * 40, branch="b", worktree="/w", runs_root=runs, run_id=run_id)

    def verdict(attempt: int, failed_gate: str | None) -> Verdict:
        gates = (GateResult("protected", "protected", True, "ok"),
                 GateResult("guards", "guards", failed_gate != "guards", "2 findings in engine"))
        return Verdict(attempt, failed_gate is None, gates, reason=f"gate {failed_gate} failed" if failed_gate else "")

    accepted = record("20250101-000000-demo-tiny-aaaaaa")
    accepted.attempt(verdict(1, "guards"), "")
    accepted.attempt(verdict(2, None), "")
    accepted.finish("accepted")
    rejected = record("20250102-000000-demo-tiny-bbbbbb")
    rejected.attempt(verdict(1, "guards"), "")
    rejected.finish("rejected")
    record("20250103-000000-demo-tiny-cccccc")  # still running, nothing judged yet

    proc = temper("runs", TEMPER_RUNS_DIR=str(runs))
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    assert [(r["RUN"][-6:], r["STATUS"], r["ATT"], r["VERDICT"]) for r in rows] == [
        ("aaaaaa", "accepted", "2", "accepted (attempt 2)"), ("bbbbbb", "rejected", "1", "rejected at guards (attempt 1)"),
        ("cccccc", "running", "0", "-")]
    assert all(re.fullmatch(r"\d+s ago|[1-9]\d*[mhd] ago", r["AGE"]) for r in rows), rows
    assert all(r["MILESTONE"] == "demo-tiny" and r["AGENT"] == "replay" for r in rows)
