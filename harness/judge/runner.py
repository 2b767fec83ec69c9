"""The gate runner: judge one candidate change with a milestone's gates, in order, first failure stops.

What is judged is never the agent's live worktree but a throw-away checkout of the judge's base commit, with the
milestone's hidden material copied in and the candidate's diff applied. So the loop, `temper gate --patch` and
the agent's `run_gates` tool go through exactly the same code, and nothing the agent left outside its diff
(ignored files, bytecode, a doctored index) can reach a test or a job.

The agent's `run_gates` is a PUBLIC judging (`public=True`, never an attempt): the same pipeline without the held-out
material (harness/judge/gates/pytest.py runs a gate's public tests and skips one whose tests are all held out) and on
the public draw (harness/judge/draws.py PUBLIC_SEED), so that dry runs, which are unlimited, tell the agent nothing
about the held-out tests or the secret draws it is judged on.

One judging, as `GateRunner.judge` reads:
1. draw: a secret seed, and from it the configurations the jobs and hidden tests run (harness/judge/draws.py);
   the verdict records the draw, and `temper gate --judge-seed / --draw` replays it;
2. admit (harness/judge/admit.py): apply the patch, hold it to the diff policy, overlay the hidden material,
   compile the bytecode; the admitted tree's manifest is taken;
3. the gates (harness/judge/gates/, one module per kind, looked up by kind): after each, the checkout's manifest
   and what sandboxed processes wrote through its overlay are checked, and a file that changed while candidate
   code ran rejects the attempt;
4. the verdict: the first failed gate, the flags the gates raised, the draw.

Candidate processes run in the sandbox (harness/jobs/sandbox.py) as a user's run would (docs/HARNESS.md, "A judged
run is a user's run"), with `settings.child_env()`: no API keys.
"""

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.jobs import overlay_changes, probe
from harness.judge.admit import admit
from harness.judge.draws import DrawError, draw_values, public_draw, secret_seed
from harness.judge.gates import RUNS
from harness.judge.gates.pytest import collect_ids
from harness.judge.hardware import check_data, check_requires
from harness.judge.judging import (LOG_TAIL_LINES, Context, GateError, Judging, candidate_env, judge_caches, read_text,
                                   removed_after)
from harness.judge.manifests import tree_manifest
from harness.judge.policy import changed_files
from harness.progress import Progress
from harness.records import RunRecord
from harness.settings import data_dir
from harness.spec import Milestone, PytestGate
from harness.verdict import GateResult, Verdict

__all__ = ["GateRunner", "GateError", "verdict_text", "LOG_TAIL_LINES"]

_SHOWN_VIOLATIONS = 3  # on the progress line of a failed gate
_MAX_VIOLATIONS = 200
_JOB_ID = re.compile(r"[a-z0-9][a-z0-9_-]*")


class GateRunner:
    """Runs `milestone.gates` for a run record. `base` is the judge's base commit (setup applied).

    `home` is where the milestone's hidden material lives (default: `repo`). `unsandboxed=True` lets
    candidate code run without the OS sandbox (local experiments only: every verdict then carries the
    flag "unsandboxed"); otherwise a machine where the sandbox cannot start refuses to judge.
    """

    def __init__(self, *, milestone: Milestone, repo: Path, base: str, record: RunRecord,
                 progress: Progress | None = None, home: Path | None = None,
                 unsandboxed: bool = False, judge_seed: int | None = None, draw: dict[str, Any] | None = None):
        self.ctx = Context(milestone=milestone, repo=Path(repo), base=base, home=Path(home or repo), record=record,
                           progress=progress or Progress(quiet=True), unsandboxed=unsandboxed)
        self.milestone, self.record, self.progress = milestone, record, self.ctx.progress
        # Replay (`temper gate --judge-seed / --draw`): the secret of a recorded judging, values of a recorded draw.
        self.judge_seed = judge_seed
        self.draw_override = dict(draw or {})
        self.logs = self.ctx.logs  # job id -> log, for the agent's read_log tool
        self.base_ids = self.ctx.base_ids  # pytest gate -> test IDs the base collects
        dry = record.dir / "dry"
        self._dry_runs = max((int(p.name) for p in dry.iterdir() if p.name.isdigit()), default=0) if dry.is_dir() else 0
        self._sandbox_problem: str | None = None  # "" once the sandbox probe passed

    def judge(self, diff: str, *, attempt: int, live_tree: Path | None = None, public: bool = False) -> Verdict:
        """All gates on base + `diff`. attempt 0 is a dry run (recorded as jobs only, never as an attempt); `public`
        (a dry run only: the agent's run_gates) leaves the held-out material out and draws from PUBLIC_SEED.

        Raises NeedsHardware when this machine lacks what the milestone requires (hardware, shared data), GateError when the
        candidate cannot be judged at all (the patch does not apply, no sandbox can start)."""
        if public and attempt:
            raise ValueError("a public judging (the agent's dry run) is never an attempt")
        ctx = self.ctx
        device = check_requires(self.milestone.requires)
        check_data(self.milestone, data_dir(ctx.home))
        sandbox_flags = self._check_sandbox()
        if attempt == 0:
            self._dry_runs += 1
            label, log_dir = f"dry{self._dry_runs}", self.record.dir / "dry" / str(self._dry_runs)
        else:
            label, log_dir = f"a{attempt}", self.record.attempt_dir(attempt) / "gates"
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            draw = public_draw(self.milestone.draw) if public else draw_values(
                self.milestone.draw, secret_seed() if self.judge_seed is None else self.judge_seed, self.draw_override)
        except DrawError as err:
            raise GateError(str(err)) from None
        seed = draw.secret
        self.progress("gate", f"drawn: {draw.describe()}")
        self.record.note("draw", **draw.as_json())
        with admit(self.milestone, repo=ctx.repo, base=ctx.base, home=ctx.home, diff=diff,
                   compile_bytecode=not sandbox_flags, public=public) as admitted:
            env = candidate_env(admitted.tree, admitted.holder, seed, draw, sandboxed=not sandbox_flags)
            judging = Judging(ctx=ctx, attempt=attempt, label=label, tree=admitted.tree, holder=admitted.holder,
                              live_tree=live_tree, diff=diff, log_dir=log_dir, env_overrides=env, policy=admitted.policy,
                              expected=admitted.expected, seed=seed, device=device, draw=draw, flags=list(sandbox_flags),
                              pycache=admitted.pycache, public=public)
            judging.scratch.append(Path(tempfile.mkdtemp(dir=admitted.holder.parent)))
            with removed_after(judging.scratch), judge_caches(judging.scratch[-1]):  # (the list is read at the end)
                results = self._run_all(judging)
        failed = next((g for g in results if not g.passed and not g.skipped), None)
        held = [g.name for g in results if g.skipped]  # (without a failure: held out of a public judging)
        reason = (f"gate {failed.name} failed: {failed.summary}" if failed else
                  f"every gate passed ({', '.join(g.name for g in results if not g.skipped)})"
                  + (f"; not run: {', '.join(held)} (held-out tests run only when you submit)" if held else ""))
        return Verdict(attempt=attempt, accepted=failed is None, gates=tuple(results), reason=reason,
                       flags=tuple(dict.fromkeys(judging.flags)), seed=seed, draw=draw.as_json())

    def read_log(self, job_id: str, tail: int = 200, grep: str = "") -> str:
        """Last `tail` lines (matching `grep`) of a job or pytest log of this run. ValueError names a job id or a
        pattern it cannot use (the agent's read_log tool passes it on as a tool error)."""
        path = self.logs.get(job_id)
        if path is None and _JOB_ID.fullmatch(job_id) and (self.record.dir / "jobs" / job_id / "log").is_file():
            path = self.record.dir / "jobs" / job_id / "log"
        if path is None:
            known = ", ".join(sorted(self.logs)) or "none yet (run_gates or submit first)"
            raise ValueError(f"no job {job_id!r}; known job ids: {known}")
        lines = read_text(path).splitlines()
        if grep:
            try:
                pattern = re.compile(grep)
            except re.error as err:
                raise ValueError(f"grep {grep!r} is not a regular expression: {err}") from None
            lines = [line for line in lines if pattern.search(line)]
        shown = lines[-max(tail, 1):]
        return f"[{path.name} of {job_id}: last {len(shown)} of {len(lines)} lines]\n" + "\n".join(shown)

    def collect_ids(self, tree: Path, holder: Path, gate: PytestGate, *, barrier: bool = True,
                    is_candidate: Callable[[str], bool] | None = None) -> tuple[subprocess.CompletedProcess, frozenset[str]]:
        """`pytest --collect-only` of `gate` as the judged run collects it (harness/judge/gates/pytest.py)."""
        return collect_ids(self.ctx, tree, holder, gate, barrier=barrier, is_candidate=is_candidate)

    def _check_sandbox(self) -> list[str]:
        """[] when candidate code will run sandboxed; ["unsandboxed: ..."] when the user allowed running
        without; GateError (the judge refuses) when no sandbox can start and the user did not."""
        if self.ctx.unsandboxed:
            return ["unsandboxed: candidate code ran with the judge's rights (--unsandboxed)"]
        if self._sandbox_problem is None:
            self._sandbox_problem = probe() or ""
        if self._sandbox_problem:
            raise GateError(f"the judge refuses to run candidate code without its sandbox: {self._sandbox_problem}")
        return []

    def _run_all(self, judging: Judging) -> list[GateResult]:
        """The gates in order; after the first failure the rest are recorded as skipped."""
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
            result = self._unmoved(gate, RUNS[gate.kind](gate, judging), judging)
            result = replace(result, duration_s=round(time.monotonic() - started, 3),
                             violations=tuple(result.violations[:_MAX_VIOLATIONS]))
            if judging.attempt:
                self.record.gate_result(judging.attempt, result)
            shown = () if result.passed else result.violations[:_SHOWN_VIOLATIONS]  # what failed, not only how many
            more = len(result.violations) - len(shown)
            mark = "skip" if result.skipped else "pass" if result.passed else "FAIL"
            self.progress("gate", f"{gate.name} {mark}: {result.summary} ({result.duration_s:.1f} s)"
                          + "".join(f"\n  {v}" for v in shown) + (f"\n  ... and {more} more (the verdict lists them)" if more else ""))
            results.append(result)
            if not result.passed:
                failed = result
        return results

    def _unmoved(self, gate: Any, result: GateResult, judging: Judging) -> GateResult:
        """`result`, or a failure when a file of the judged checkout changed while the gate ran: on disk (the manifest
        taken at admission) or through the overlay sandboxed processes see the checkout by."""
        moved = changed_files(judging.expected, tree_manifest(judging.tree))
        moved.update({p: k for changes in judging.overlays for p, k in overlay_changes(changes).items() if p not in moved})
        judging.overlays.clear()
        if not moved:
            return result
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=result.log_tail,
                          violations=tuple(f"{path}: {kind} while gate {gate.name} ran" + (
                              " (a protected file)" if self.milestone.is_protected(path) else "")
                              for path, kind in moved.items()),
                          summary=f"{len(moved)} file(s) of the judged checkout changed during gate {gate.name}: "
                                  "candidate code must not rewrite tests, references or itself while judged")


def verdict_text(verdict: Verdict) -> str:
    """A plain summary of a verdict (the `run_gates` tool's answer and `temper gate`'s output)."""
    public = bool(verdict.draw and verdict.draw.get("public"))  # a dry run's: a result, not a verdict
    lines = [(("PASSED" if verdict.accepted else "FAILED") if public else
              ("ACCEPTED" if verdict.accepted else "REJECTED")) + f": {verdict.reason}"]
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
    values = json.dumps((verdict.draw or {}).get("values", {}), sort_keys=True, separators=(",", ":"))
    if public:
        lines.append(f"  the public draw (seed {verdict.seed}, the same at every dry run; what you submit is judged on a "
                     f"secret draw that differs): {values}")
    elif verdict.draw:
        lines.append(f"  drawn (judge seed {verdict.seed}; replay: --judge-seed {verdict.seed}, or --draw '{values}'): {values}")
    return "\n".join(lines)
