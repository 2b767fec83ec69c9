"""The gate runner: judge one candidate change with a milestone's gates, in order, first failure stops.

What is judged is never the agent's live worktree but a clean, throw-away checkout of the judge's base
commit with the candidate's diff applied (`Workspace.scratch`). So the loop, `temper gate --patch`
and the agent's `run_gates` tool go through exactly the same code, and nothing the agent left
outside its diff (ignored files, bytecode, a doctored index) can reach a test or a job. The live
worktree is hashed too (`live_tree`), so a protected file changed behind git's back still fails.

Every Python process a gate starts imports the checkout's code first (PYTHONPATH) and keeps bytecode
outside it (PYTHONPYCACHEPREFIX), and gets `settings.child_env()`: no API keys.

Logs: job gates under `runs/<id>/jobs/<a<attempt>-<gate>>/` (the engine's --run-dir is that folder),
pytest and test-collection output under `runs/<id>/attempts/<n>/gates/`; dry runs (the agent's
`run_gates` tool) use `dry<k>-` job folders and `runs/<id>/dry/<k>/`. All are scrubbed of secrets.
"""

import re
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.gates.metrics import JobOutcome, judge_metrics
from harness.gates.protected import base_manifest, count_tests, disk_manifest, manifest_changes, python_env
from harness.jobs import JobSpec, launch
from harness.records import RunRecord, scrub_file, scrub_text, write_atomic
from harness.settings import child_env
from harness.spec import GuardsGate, JobGate, MetricsGate, Milestone, ProtectedGate, PytestGate, render_argv
from harness.verdict import GateResult, Verdict
from harness.workspace import Workspace, WorkspaceError

__all__ = ["GateRunner", "GateError", "verdict_text", "new_suppressions", "LOG_TAIL_LINES"]

LOG_TAIL_LINES = 60
_MAX_VIOLATIONS = 200
_SUPPRESSION = re.compile(r"#\s*guard:\s*allow\b")
_JOB_ID = re.compile(r"[a-z0-9][a-z0-9_-]*")


class GateError(ValueError):
    """The candidate cannot be judged at all (its patch does not apply to the base)."""


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace") if path.is_file() else ""


@dataclass
class _Judging:
    """State of one judging: where it happens and what earlier gates left for later ones."""

    attempt: int
    label: str  # "a3" or "dry2": prefix of job folders
    tree: Path
    live_tree: Path | None
    diff: str
    log_dir: Path
    env_overrides: dict[str, str]
    jobs: dict[str, JobOutcome]
    flags: list[str]


class GateRunner:
    """Runs `milestone.gates` for a run record. `base` is the judge's base commit (setup applied)."""

    def __init__(self, *, milestone: Milestone, repo: Path, base: str, record: RunRecord,
                 progress: Callable[[str, str], None] | None = None, base_test_count: tuple[int, int] | None = None):
        self.milestone = milestone
        self.repo = Path(repo)
        self.base = base
        self.record = record
        self.progress = progress or (lambda kind, text: None)
        self.base_test_count = base_test_count  # (collected, errors) at the base, once known
        self.logs: dict[str, Path] = {}  # job id -> log, for the agent's read_log tool
        dry = record.dir / "dry"
        self._dry_runs = max((int(p.name) for p in dry.iterdir() if p.name.isdigit()), default=0) if dry.is_dir() else 0
        self._presets: dict[str, Any] | None = None

    # ------------------------------------------------------------------ public

    def judge(self, diff: str, *, attempt: int, live_tree: Path | None = None) -> Verdict:
        """All gates on base + `diff`. attempt 0 is a dry run (recorded as jobs only, never as an attempt)."""
        if attempt == 0:
            self._dry_runs += 1
            label, log_dir = f"dry{self._dry_runs}", self.record.dir / "dry" / str(self._dry_runs)
        else:
            label, log_dir = f"a{attempt}", self.record.attempt_dir(attempt) / "gates"
        log_dir.mkdir(parents=True, exist_ok=True)
        with Workspace.scratch(self.repo, self.base) as scratch:
            tree = scratch.worktree
            judging = _Judging(attempt=attempt, label=label, tree=tree, live_tree=live_tree, diff=diff, log_dir=log_dir,
                               env_overrides=python_env(tree, tree.parent / "pycache"), jobs={}, flags=[])
            patch = tree.parent / "candidate.patch"
            patch.write_text(diff, encoding="utf-8", errors="surrogateescape")
            check = subprocess.run(["git", "-C", str(tree), "apply", "--check", "--whitespace=nowarn", str(patch)],
                                   capture_output=True, text=True) if diff.strip() else None
            if check is not None and check.returncode != 0:
                raise GateError(f"the patch does not apply to {self.base[:12]}: {check.stderr.strip()}")
            protected = next((g for g in self.milestone.gates if isinstance(g, ProtectedGate)), None)
            if protected is not None and protected.count_tests and self.base_test_count is None:
                self._count_base_tests(protected, judging)  # on the base tree, before the candidate lands
            if diff.strip():
                try:
                    scratch.apply_patch_file(patch)
                except WorkspaceError as err:
                    raise GateError(str(err)) from None
            results = self._run_all(judging)
        failed = next((g for g in results if not g.passed and not g.skipped), None)
        reason = f"gate {failed.name} failed: {failed.summary}" if failed else ""
        return Verdict(attempt=attempt, accepted=failed is None, gates=tuple(results), reason=reason,
                       flags=tuple(dict.fromkeys(judging.flags)))

    def read_log(self, job_id: str, tail: int = 200, grep: str = "") -> str:
        """Last `tail` lines (matching `grep`) of a job or pytest log of this run."""
        from harness.tools import ToolError

        path = self.logs.get(job_id)
        if path is None and _JOB_ID.fullmatch(job_id) and (self.record.dir / "jobs" / job_id / "log").is_file():
            path = self.record.dir / "jobs" / job_id / "log"
        if path is None:
            known = ", ".join(sorted(self.logs)) or "none yet (run_gates or submit first)"
            raise ToolError(f"no job {job_id!r}; known job ids: {known}")
        lines = _read(path).splitlines()
        if grep:
            try:
                pattern = re.compile(grep)
            except re.error as err:
                raise ToolError(f"grep {grep!r} is not a regular expression: {err}") from None
            lines = [line for line in lines if pattern.search(line)]
        shown = lines[-max(tail, 1):]
        return f"[{path.name} of {job_id}: last {len(shown)} of {len(lines)} lines]\n" + "\n".join(shown)

    # ------------------------------------------------------------------ the walk

    def _run_all(self, judging: _Judging) -> list[GateResult]:
        results: list[GateResult] = []
        failed: GateResult | None = None
        for gate in self.milestone.gates:
            if failed is not None:
                results.append(GateResult(name=gate.name, kind=gate.kind, passed=False, skipped=True,
                                          summary=f"not run: gate {failed.name} failed first"))
                continue
            if judging.attempt:
                self.record.gate_started(judging.attempt, gate.name, gate.kind)
            self.progress("gate", f"{gate.name} ({gate.kind}) ...")
            started = time.monotonic()
            result = self._run_one(gate, judging)
            result = replace(result, duration_s=round(time.monotonic() - started, 3),
                             violations=tuple(result.violations[:_MAX_VIOLATIONS]))
            if judging.attempt:
                self.record.gate_result(judging.attempt, result)
            self.progress("gate", f"{gate.name} {'pass' if result.passed else 'FAIL'}: {result.summary} ({result.duration_s:.1f} s)")
            results.append(result)
            if not result.passed:
                failed = result
        return results

    def _run_one(self, gate: Any, judging: _Judging) -> GateResult:
        if isinstance(gate, ProtectedGate):
            return self._protected(gate, judging)
        if isinstance(gate, GuardsGate):
            return self._guards(gate, judging)
        if isinstance(gate, PytestGate):
            return self._pytest(gate, judging)
        if isinstance(gate, JobGate):
            return self._job(gate, judging)
        if isinstance(gate, MetricsGate):
            return self._metrics(gate, judging)
        raise TypeError(f"unknown gate kind {gate.kind!r}")

    # ------------------------------------------------------------------ protected

    def _count_base_tests(self, gate: ProtectedGate, judging: _Judging) -> None:
        self.progress("gate", f"counting the base's tests in {' '.join(gate.count_selectors)} ...")
        try:
            count = count_tests(judging.tree, gate.count_selectors, child_env(judging.env_overrides))
        except subprocess.TimeoutExpired:
            raise GateError(f"collecting the base's tests in {' '.join(gate.count_selectors)} timed out") from None
        write_atomic(judging.log_dir / "base-collect.log", scrub_text(count.output))
        self.base_test_count = (count.collected, count.errors)
        self.record.note("base test count", collected=count.collected, errors=count.errors,
                         selectors=list(gate.count_selectors))

    def _protected(self, gate: ProtectedGate, judging: _Judging) -> GateResult:
        is_protected = self.milestone.is_protected
        base = base_manifest(self.repo, self.base, is_protected)
        violations = manifest_changes(base, disk_manifest(judging.tree, is_protected))
        if judging.live_tree is not None:
            seen = set(violations)
            violations += [f"{v} (in your worktree, hidden from git: ignored, excluded or marked unchanged)"
                           for v in manifest_changes(base, disk_manifest(judging.live_tree, is_protected)) if v not in seen]
        if violations:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations),
                              summary=f"{len(violations)} protected file(s) differ from the base commit {self.base[:12]}")
        summary = f"{len(base)} protected files unchanged"
        if gate.count_tests:
            try:
                count = count_tests(judging.tree, gate.count_selectors, child_env(judging.env_overrides))
            except subprocess.TimeoutExpired:
                return GateResult(name=gate.name, kind=gate.kind, passed=False,
                                  summary=f"collecting the tests in {' '.join(gate.count_selectors)} timed out")
            write_atomic(judging.log_dir / f"{gate.name}-collect.log", scrub_text(count.output))
            base_collected, base_errors = self.base_test_count or (0, 0)
            metrics = {"tests_collected": float(count.collected), "tests_collected_base": float(base_collected)}
            if count.collected < base_collected or count.errors > base_errors:
                return GateResult(name=gate.name, kind=gate.kind, passed=False, metrics=metrics, log_tail=_tail(count.output),
                                  violations=(f"pytest collects {count.collected} tests with {count.errors} error(s) in "
                                              f"{' '.join(gate.count_selectors)}; the base collects {base_collected} with {base_errors}",),
                                  summary=f"the test count dropped ({count.collected} < {base_collected}) or collection broke")
            summary += f"; {count.collected} tests collected (base {base_collected})"
            return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)
        return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)

    # ------------------------------------------------------------------ guards

    def _guards(self, gate: GuardsGate, judging: _Judging) -> GateResult:
        from guards.config import GuardsConfigError, load_config
        from guards.runner import check_paths

        try:
            config = load_config(judging.tree / "guards.toml")
        except GuardsConfigError as err:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, summary="guards.toml is unusable", violations=(str(err),))
        paths = [judging.tree / p for p in gate.paths]
        missing = [p for p, full in zip(gate.paths, paths, strict=True) if not full.exists()]
        violations = [f"{p}: no such file or folder" for p in missing]
        result = check_paths([p for p in paths if p.exists()], config, list(gate.rules), cwd=judging.tree)
        violations += [f.to_text() for f in result.findings]
        violations += new_suppressions(gate.paths, judging.diff)
        if violations:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations),
                              summary=f"{len(violations)} finding(s) in {' '.join(gate.paths)}")
        return GateResult(name=gate.name, kind=gate.kind, passed=True,
                          summary=f"0 findings in {result.files} files ({', '.join(gate.rules)})")

    # ------------------------------------------------------------------ pytest

    def _pytest(self, gate: PytestGate, judging: _Judging) -> GateResult:
        xml = judging.log_dir / f"{gate.name}.junit.xml"
        log = judging.log_dir / f"{gate.name}.log"
        xml.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest", *gate.selectors, *gate.args, "-q", "-rfE", "-p", "no:cacheprovider",
                f"--junitxml={xml}"]
        spec = JobSpec(name=f"{judging.label}-{gate.name}", argv=argv, cwd=judging.tree, log_path=log,
                       timeout_s=gate.timeout_s, env=judging.env_overrides, kill_grace_s=5.0)
        self.logs[spec.name] = log
        result = launch(spec).wait(poll_s=0.2)
        scrub_file(log)
        output = result.read_log()
        tail = _tail(output)
        if result.state == "timeout":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"pytest did not finish within {gate.timeout_s:g} s (killed)")
        cases = _junit_cases(xml, judging.tree) if xml.is_file() else None
        if cases is None:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"pytest exited {result.exit_code} without a report (see the log tail)")
        failing = [(node, message) for node, status, message in cases if status in ("failed", "error")]
        passed = sum(1 for _, status, _ in cases if status == "passed")
        metrics = {"collected": float(len(cases)), "passed": float(passed), "failed": float(len(failing))}
        if failing:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              failing_tests=tuple(node for node, _ in failing),
                              violations=tuple(f"{node}: {message}" for node, message in failing if message),
                              summary=f"{len(failing)} of {len(cases)} tests failed")
        if len(cases) < gate.min_collected:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              summary=f"only {len(cases)} tests collected; the milestone needs at least {gate.min_collected}")
        if passed == 0:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              summary=f"none of the {len(cases)} tests ran (all skipped)")
        if result.exit_code != 0:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              summary=f"pytest exited {result.exit_code}")
        skipped = len(cases) - passed
        return GateResult(name=gate.name, kind=gate.kind, passed=True,
                          summary=f"{passed} passed" + (f", {skipped} skipped" if skipped else "") + f" (needs >= {gate.min_collected})")

    # ------------------------------------------------------------------ jobs

    def _job(self, gate: JobGate, judging: _Judging) -> GateResult:
        job_id = f"{judging.label}-{gate.name}"
        stale = self.record.dir / "jobs" / job_id
        if stale.is_dir():  # left by a judging a crash cut short: its files must not mix with this run's
            shutil.rmtree(stale)
        job_dir = self.record.job_dir(job_id)
        argv = render_argv(gate.argv, job_dir=job_dir, worktree=judging.tree,
                           job_dirs={name: o.job_dir for name, o in judging.jobs.items()})
        several = gate.nproc > 1 or gate.nodes > 1
        spec = JobSpec(
            name=job_id, argv=["-m", "engine", *argv] if several else [sys.executable, "-m", "engine", *argv],
            torchrun=several, launcher=gate.launcher, nproc=gate.nproc, nodes=gate.nodes, timeout_s=gate.timeout_s,
            env={**gate.env, **judging.env_overrides}, cwd=judging.tree, log_path=job_dir / gate.log,
            gpus_per_node=gate.gpus, partition=gate.partition, kill_grace_s=10.0,
        )
        self.logs[job_id] = spec.log_path
        job = launch(spec)
        self.record.job_started(job_id, list(spec.argv), attempt=judging.attempt, launcher=gate.launcher,
                                job_id=job.job_id, log=spec.log_path)
        self.progress("job", f"{job_id} started ({gate.launcher}, {gate.task}): python -m engine {' '.join(argv)}")
        result = job.wait(poll_s=0.5)
        self.record.job_finished(job_id, attempt=judging.attempt, exit_code=result.exit_code,
                                 duration_s=round(result.elapsed_s, 3), timed_out=result.state == "timeout", summary=result.detail)
        judging.jobs[gate.name] = JobOutcome(gate=gate, job_id=job_id, job_dir=job_dir, result=result)
        tail = _tail(result.read_log())
        if result.state == "timeout":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"job {job_id} did not finish within {gate.timeout_s:g} s and was killed")
        if result.exit_code != gate.expect_exit or result.state == "cancelled":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"job {job_id} exited {result.exit_code} (expected {gate.expect_exit})"
                                      + (f": {result.detail}" if result.detail else ""))
        return GateResult(name=gate.name, kind=gate.kind, passed=True,
                          summary=f"job {job_id} exited {result.exit_code} after {result.elapsed_s:.1f} s")

    # ------------------------------------------------------------------ metrics

    def _metrics(self, gate: MetricsGate, judging: _Judging) -> GateResult:
        violations, metrics, flags = judge_metrics(gate, judging.jobs, tree=judging.tree, presets=self._base_presets())
        judging.flags += flags
        tails = [_tail(o.result.read_log(), 20) for o in judging.jobs.values()] if violations else []
        if violations:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations), metrics=metrics,
                              log_tail="\n".join(tails), summary=f"{len(violations)} of {len(gate.rules)} rule(s) fail")
        return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=metrics,
                          summary=f"{len(gate.rules)} rule(s) hold")

    def _base_presets(self) -> dict[str, Any] | None:
        """engine/model_spec.toml as the base commit has it (the agent cannot move the goalposts)."""
        if self._presets is None:
            proc = subprocess.run(["git", "-C", str(self.repo), "show", f"{self.base}:engine/model_spec.toml"],
                                  capture_output=True)
            self._presets = tomllib.loads(proc.stdout.decode("utf-8")) if proc.returncode == 0 else {}
        return self._presets or None


def new_suppressions(paths: list[str], diff: str) -> list[str]:
    """Violations for each `# guard: allow` a diff adds to a .py file under `paths`: a red line the
    candidate lifted for itself is a reviewer's decision, not the agent's."""
    out, path, line_no = [], "", 0
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else ""
        elif line.startswith("@@"):
            match = re.search(r"\+(\d+)", line)
            line_no = int(match.group(1)) - 1 if match else 0
        elif line.startswith("+"):
            line_no += 1
            in_scope = any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)
            if in_scope and path.endswith(".py") and _SUPPRESSION.search(line):
                out.append(f"{path}:{line_no}: adds a guard suppression ({line[1:].strip()[:120]}); "
                           "suppressions are a reviewer's decision, fix the code instead")
        elif not line.startswith("-"):
            line_no += 1
    return out


def _node_id(classname: str, name: str, tree: Path) -> str:
    """pytest's junit `classname` (dotted module[.Class]) + `name` back to a node id `path.py::[Class::]name`."""
    parts = classname.split(".") if classname else []
    for k in range(len(parts), 0, -1):
        candidate = "/".join(parts[:k]) + ".py"
        if (tree / candidate).is_file():
            return "::".join([candidate, *parts[k:], name])
    return "::".join([*filter(None, [classname]), name])


def _junit_cases(xml: Path, tree: Path) -> list[tuple[str, str, str]] | None:
    """(node id, passed | failed | error | skipped, first message line) per test case; None if unreadable."""
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError:
        return None
    cases = []
    for case in root.iter("testcase"):
        node = _node_id(case.get("classname", ""), case.get("name", "?"), tree)
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed" if child.tag == "failure" else "error"
                text = child.get("message") or (child.text or "")
                message = text.strip().splitlines()[0][:300] if text.strip() else ""
                break
            if child.tag == "skipped":
                status = "skipped"
        cases.append((node, status, message))
    return cases


def verdict_text(verdict: Verdict) -> str:
    """A plain summary of a verdict (the `run_gates` tool's answer and `temper gate`'s output)."""
    lines = [("ACCEPTED" if verdict.accepted else "REJECTED") + f": {verdict.reason}"]
    for gate in verdict.gates:
        mark = "skip" if gate.skipped else "pass" if gate.passed else "FAIL"
        lines.append(f"  [{mark}] {gate.name} ({gate.kind}): {gate.summary}")
        if not gate.passed and not gate.skipped:
            lines += [f"      - {v}" for v in gate.violations[:10]]
            if len(gate.violations) > 10:
                lines.append(f"      ... and {len(gate.violations) - 10} more")
            lines += [f"      failing: {t}" for t in gate.failing_tests[:10] if not any(v.startswith(t) for v in gate.violations[:10])]
            if gate.log_tail:
                lines.append("      log tail:")
                lines += ["        " + line for line in gate.log_tail.splitlines()[-25:]]
    lines += [f"  flag: {f}" for f in verdict.flags]
    return "\n".join(lines)
