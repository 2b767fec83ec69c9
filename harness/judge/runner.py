"""The gate runner: judge one candidate change with a milestone's gates, in order, first failure stops.

What is judged is never the agent's live worktree but a throw-away checkout of the judge's base commit,
in a neutral random temp folder, with the milestone's hidden material copied in and the candidate's
diff applied. So the loop, `temper gate --patch` and the agent's `run_gates` tool go through exactly
the same code, and nothing the agent left outside its diff (ignored files, bytecode, a doctored index)
can reach a test or a job.

The order of one judging:
1. the patch is read by git's parser and checked against the diff policy (harness/judge/policy.py)
   together with what applying it did on disk: anything outside the editable globs rejects it before
   any candidate code runs (the `protected` gate reports it);
2. the checkout's full manifest is taken; after every gate it is taken again, and a file that changed
   while candidate code ran (a test rewriting a test, a job planting a conftest) rejects the attempt;
3. candidate processes (pytest, jobs) run in the sandbox (harness/jobs/sandbox.py): the checkout seen writable
   as a user's is, through an overlay whose changes the judge reads after the gate (any rejects), its
   judge-compiled bytecode read-only, only their own neutral folder really writable, no network, the judge's
   records out of sight;
4. pytest runs with a judge-owned ini (`-c`), plugin autoload off, rootdir and confcutdir fixed, no
   cache provider; the collected test IDs must include every test ID of the base; new test files of
   the candidate run in a pytest process of their own and never count toward min_collected;
5. jobs print through a pipe the judge owns into the judge's records (`runs/<id>/jobs/<job>/log` with
   line arrival times); `{job_dir}` is a neutral folder the job may write, whose contents are claims.

Every Python process a gate starts imports the checkout's code first (its working folder, PYTHONPATH for
pytest), loads only bytecode the judge compiled (harness/judge/bytecode.py; unsandboxed: none, it goes elsewhere),
and gets `settings.child_env()`: no API keys. Sandboxed, it runs as a user's run would (docs/HARNESS.md, "A judged
run is a user's run"): Python's defaults, a writable checkout and home, no cache or temp variables of the judge's.
Each judging draws a secret seed and from it the configurations its jobs and hidden tests run
(harness/judge/draws.py: `{seed}` and the milestone's [draw] values in job argv, TEMPER_JUDGE_SEED and the
TEMPER_JUDGE_DRAW file for tests), so acceptance inputs cannot be special-cased; the verdict records the draw, and
`temper gate --judge-seed / --draw` replays it.
"""

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.jobs import JobSpec, Sandbox, launch, overlay_changes, probe
from harness.judge.barrier import BARRIER_OPTION as BARRIER, write_barrier
from harness.judge.bytecode import PrecompileError, precompile
from harness.judge.baseconfig import ConfigUnknown, base_file, expected_config, flag_values, load_base
from harness.judge.draws import DRAW_FILE_ENV, Draw, DrawError, corpus_tokens, draw_values, write_corpus
from harness.judge.hardware import check_data, check_requires, wait_watching_gpus
from harness.judge.keeper import CheckpointKeeper, draw_pairs
from harness.judge.live import StepProgress, TestFileProgress, count_text
from harness.judge.metrics import JobOutcome, judge_metrics
from harness.judge.policy import PatchView, PolicyResult, changed_files, check_policy, read_patch
from harness.judge.protected import base_manifest, disk_manifest, manifest_changes, python_env, tree_manifest
from harness.judge.saveplan import SavePlan, plan_replay, plan_saves
from harness.progress import Progress
from harness.records import RunRecord, scrub_file, scrub_text, write_atomic
from harness.settings import child_env, data_dir, torch_caches_while
from harness.spec import OP_TASKS, GuardsGate, JobGate, glob_match, MetricsGate, Milestone, ProtectedGate, PytestGate, referenced_jobs, render_argv
from harness.verdict import GateResult, Verdict
from harness.workspace import Workspace, WorkspaceError

__all__ = ["GateRunner", "GateError", "verdict_text", "LOG_TAIL_LINES"]

LOG_TAIL_LINES = 60
_JUDGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this judge's `harness` package
_SHOWN_VIOLATIONS = 3  # on the progress line of a failed gate
_MAX_VIOLATIONS = 200
_JOB_ID = re.compile(r"[a-z0-9][a-z0-9_-]*")
_COLLECTED_ID = re.compile(r"^(\S+\.py::\S.*)$")


class GateError(ValueError):
    """The candidate cannot be judged at all (its patch does not apply to the base, no sandbox)."""


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _pytest_tail(text: str) -> str:
    """The tail of a pytest log as a reader wants it: without the judge's report lines."""
    from harness.judge.pytest_report import PREFIX

    return _tail("\n".join(line for line in text.splitlines() if line and not line.startswith(PREFIX)))


def _append_counts(log: Path, cases: list[tuple[str, str, str]], canaries: int) -> None:
    """End a pytest log with the judge's own count of the tests it judges: pytest's summary line above also
    counts the judge's canary tests, one of which fails by design, and a reader must not take that for theirs."""
    with log.open("a", encoding="utf-8") as f:
        f.write(f"[judge] the tests judged: {count_text(s for _, s, _ in cases)} (pytest's counts above include the judge's {canaries} canary tests, "
                "one of which fails by design)\n")


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace") if path.is_file() else ""


def _neutral(parent: Path) -> Path:
    """A fresh folder with a random name: nothing in a path tells candidate code it is being judged."""
    path = parent / secrets.token_hex(6)
    path.mkdir(parents=True)
    return path


@dataclass
class _Judging:
    """State of one judging: where it happens and what earlier gates left for later ones."""

    attempt: int
    label: str  # "a3" or "dry2": prefix of job folders in the records
    tree: Path
    holder: Path  # the neutral temp folder around the checkout: job folders, the judge's pytest ini
    live_tree: Path | None
    diff: str
    log_dir: Path
    env_overrides: dict[str, str]
    policy: PolicyResult
    expected: dict[str, str]  # the checkout's manifest once the patch is applied; must not move after
    seed: int
    device: str
    draw: Draw
    jobs: dict[str, JobOutcome] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    new_tests_ran: bool = False
    saves: dict[str, tuple[SavePlan, CheckpointKeeper | None]] = field(default_factory=dict)  # train job -> its saves
    batches: dict[tuple[str, ...], Any] = field(default_factory=dict)  # base `engine batches` argv -> its answer
    corpora: dict[int, Path] = field(default_factory=dict)  # training tokens -> the judge-cut corpus of that size
    scratch: list[Path] = field(default_factory=list)  # the judge's own temp folders, removed after the judging
    pycache: tuple[Path, ...] = ()  # the judge-compiled bytecode folders of the checkout (read-only in the sandbox)
    overlays: list[Path] = field(default_factory=list)  # what sandboxed processes wrote to the checkout, not yet checked


class GateRunner:
    """Runs `milestone.gates` for a run record. `base` is the judge's base commit (setup applied).

    `home` is where the milestone's hidden material lives (default: `repo`). `unsandboxed=True` lets
    candidate code run without the OS sandbox (local experiments only: every verdict then carries the
    flag "unsandboxed"); otherwise a machine where the sandbox cannot start refuses to judge.
    """

    def __init__(self, *, milestone: Milestone, repo: Path, base: str, record: RunRecord,
                 progress: Progress | None = None, home: Path | None = None,
                 unsandboxed: bool = False, judge_seed: int | None = None, draw: dict[str, Any] | None = None):
        self.milestone = milestone
        self.repo = Path(repo)
        self.home = Path(home or repo)
        self.base = base
        self.record = record
        self.progress = progress or Progress(quiet=True)
        self.unsandboxed = unsandboxed
        # Replay (`temper gate --judge-seed / --draw`): the secret of a recorded judging, values of a recorded draw.
        self.judge_seed = judge_seed
        self.draw_override = dict(draw or {})
        self.logs: dict[str, Path] = {}  # job id -> log, for the agent's read_log tool
        self.base_ids: dict[str, frozenset[str]] = {}  # pytest gate -> test IDs the base collects
        dry = record.dir / "dry"
        self._dry_runs = max((int(p.name) for p in dry.iterdir() if p.name.isdigit()), default=0) if dry.is_dir() else 0
        self._pytest_ini: str | None = None
        self._sandbox_problem: str | None = None  # "" once the sandbox probe passed
        self._base_config: tuple[dict[str, Any], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ public

    def judge(self, diff: str, *, attempt: int, live_tree: Path | None = None) -> Verdict:
        """All gates on base + `diff`. attempt 0 is a dry run (recorded as jobs only, never as an attempt).

        Raises NeedsHardware when this machine lacks what the milestone requires (hardware, shared data), GateError when the
        candidate cannot be judged at all (the patch does not apply, no sandbox can start)."""
        device = check_requires(self.milestone.requires)
        check_data(self.milestone, data_dir(self.home))
        sandbox_flags = self._check_sandbox()
        if attempt == 0:
            self._dry_runs += 1
            label, log_dir = f"dry{self._dry_runs}", self.record.dir / "dry" / str(self._dry_runs)
        else:
            label, log_dir = f"a{attempt}", self.record.attempt_dir(attempt) / "gates"
        log_dir.mkdir(parents=True, exist_ok=True)
        seed = self.judge_seed if self.judge_seed is not None else secrets.randbelow(2**31 - 2) + 1
        try:
            draw = draw_values(self.milestone.draw, seed, self.draw_override)
        except DrawError as err:
            raise GateError(str(err)) from None
        self.progress("gate", f"drawn: {draw.describe()}")
        self.record.note("draw", **draw.as_json())
        self._collect_base_ids(log_dir)
        with Workspace.scratch(self.repo, self.base) as scratch:
            tree = scratch.worktree
            holder = tree.parent
            env = self._pytest_env(tree, holder, seed, draw, sandboxed=not sandbox_flags)
            patch = holder / f"{secrets.token_hex(6)}.patch"
            patch.write_text(diff, encoding="utf-8", errors="surrogateescape")
            view = PatchView(paths=(), binary=(), modes=())
            before = tree_manifest(tree)
            if diff.strip():
                check = subprocess.run(["git", "-C", str(tree), "apply", "--check", "--whitespace=nowarn", str(patch)],
                                       capture_output=True, text=True)
                if check.returncode != 0:
                    raise GateError(f"the patch does not apply to {self.base[:12]}: {check.stderr.strip()}")
                try:
                    view = read_patch(tree, patch)
                    scratch.apply_patch_file(patch)
                except (ValueError, WorkspaceError) as err:
                    raise GateError(f"the patch cannot be applied: {err}") from None
            # The policy sees the candidate's changes to the base alone; the held-out material goes in after
            # (over anything the patch put at its paths, which the policy has already named).
            policy = check_policy(self.milestone, view, changed_files(before, tree_manifest(tree)), tree,
                                  held_out=frozenset(self._hidden_files()))
            pycache: tuple[Path, ...] = ()
            if not policy.violations:  # (a refused patch runs nothing, and may have planted links on those paths)
                self._overlay_hidden(tree)
                if not sandbox_flags:
                    try:
                        pycache = precompile(tree)
                    except PrecompileError as err:
                        raise GateError(f"the judge cannot compile the checkout: {err}") from None
            judging = _Judging(attempt=attempt, label=label, tree=tree, holder=holder, live_tree=live_tree, diff=diff,
                               log_dir=log_dir, env_overrides=env, policy=policy, expected=tree_manifest(tree),
                               seed=seed, device=device, draw=draw, flags=list(sandbox_flags), pycache=pycache)
            judging.scratch.append(Path(tempfile.mkdtemp(dir=holder.parent)))
            with _removed_after(judging.scratch), _judge_caches(judging.scratch[-1]):  # (the list is read at the end)
                results = self._run_all(judging)
        failed = next((g for g in results if not g.passed and not g.skipped), None)
        reason = (f"gate {failed.name} failed: {failed.summary}" if failed else
                  f"every gate passed ({', '.join(g.name for g in results)})")
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
        lines = _read(path).splitlines()
        if grep:
            try:
                pattern = re.compile(grep)
            except re.error as err:
                raise ValueError(f"grep {grep!r} is not a regular expression: {err}") from None
            lines = [line for line in lines if pattern.search(line)]
        shown = lines[-max(tail, 1):]
        return f"[{path.name} of {job_id}: last {len(shown)} of {len(lines)} lines]\n" + "\n".join(shown)

    # ------------------------------------------------------------------ setup of a judging

    def _check_sandbox(self) -> list[str]:
        """[] when candidate code will run sandboxed; ["unsandboxed: ..."] when the user allowed running
        without; GateError (the judge refuses) when no sandbox can start and the user did not."""
        if self.unsandboxed:
            return ["unsandboxed: candidate code ran with the judge's rights (--unsandboxed)"]
        if self._sandbox_problem is None:
            self._sandbox_problem = probe() or ""
        if self._sandbox_problem:
            raise GateError(f"the judge refuses to run candidate code without its sandbox: {self._sandbox_problem}")
        return []

    def _hidden_files(self) -> dict[str, Path]:
        """The milestone's hidden material: {path in the judged checkout: source file}."""
        if self.milestone.hidden is None:
            return {}
        source = self.home / self.milestone.hidden
        if not source.is_dir():
            raise GateError(f"the milestone's hidden folder {source} does not exist")
        return {f.relative_to(source).as_posix(): f for f in sorted(source.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts}

    def _overlay_hidden(self, tree: Path) -> None:
        """Copy the milestone's hidden material (held-out tests, reference data) over the checkout."""
        for rel, file in self._hidden_files().items():
            target = tree / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)  # never write through whatever stood there
            shutil.copyfile(file, target)

    def _pytest_env(self, tree: Path, holder: Path, seed: int, draw: Draw | None = None, *,
                    sandboxed: bool = False) -> dict[str, str]:
        """Environment overrides of candidate processes: the checkout's code first, no pytest plugin unless the
        judge names it (-p) and nobody's PYTEST_ADDOPTS; the judge's seed and draw for tests (the draw's JSON in a
        file of the read-only holder). Bytecode: sandboxed, the judge compiled the checkout and its `__pycache__`
        folders are read-only (harness/judge/bytecode.py), so Python runs with its defaults, as a user's does;
        unsandboxed, it goes elsewhere."""
        python = python_env(tree, _neutral(holder))
        if sandboxed:
            python = {"PYTHONPATH": python["PYTHONPATH"]}
        env = {**python, "TEMPER_JUDGE_SEED": str(seed), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": ""}
        if draw is not None:
            path = _neutral(holder) / "draw.json"
            path.write_text(json.dumps(draw.values, sort_keys=True), encoding="utf-8")
            env[DRAW_FILE_ENV] = str(path)
        return env

    def _collect_base_ids(self, log_dir: Path) -> None:
        """Test IDs each pytest gate collects on the base (+ hidden material), in a checkout of its own that
        no candidate touches; once per runner."""
        gates = [g for g in self.milestone.gates if isinstance(g, PytestGate) and g.name not in self.base_ids]
        if not gates:
            return
        with Workspace.scratch(self.repo, self.base) as scratch:
            tree = scratch.worktree
            self._overlay_hidden(tree)
            for gate in gates:
                self.progress("gate", f"collecting the base's tests for {gate.name} ...")
                proc, ids = self.collect_ids(tree, tree.parent, gate)
                write_atomic(log_dir / f"{gate.name}-base-collect.log", scrub_text(proc.stdout + proc.stderr))
                if proc.returncode not in (0, 5):
                    raise GateError(f"the base's tests for gate {gate.name} do not collect (pytest exit {proc.returncode}); "
                                    f"see {log_dir / (gate.name + '-base-collect.log')}")
                self.base_ids[gate.name] = ids
                self.record.note("base test ids", gate=gate.name, count=len(ids))

    def collect_ids(self, tree: Path, holder: Path, gate: PytestGate, *, barrier: bool = True,
                    is_candidate: Callable[[str], bool] | None = None) -> tuple[subprocess.CompletedProcess, frozenset[str]]:
        """`pytest --collect-only` of `gate` in checkout `tree` as the judged run collects it (the judge's ini and
        plugins, files in `holder`): the process and the test IDs it listed. With `barrier`, behind the import barrier
        (every file the milestone may edit refused, or every file `is_candidate` names), so acceptance tests that import
        candidate code fail here, before any candidate is judged."""
        env = self._pytest_env(tree, holder, 0)
        env["PYTHONPATH"] += os.pathsep + str(_JUDGE_ROOT)
        fence = []
        if barrier:
            refused = is_candidate or self.milestone.is_editable
            file = write_barrier(_neutral(holder) / "barrier.json", tree, tree_manifest(tree), refused)
            fence = ["-p", "harness.judge.pytest_report", f"{BARRIER}={file}"]
        argv = [*self._pytest_argv(tree, holder), *fence, "--collect-only", "-q", *gate.selectors, *gate.args]
        proc = subprocess.run(argv, cwd=tree, env=child_env(env), capture_output=True, text=True, timeout=gate.timeout_s,
                              stdin=subprocess.DEVNULL)
        return proc, frozenset(m.group(1) for line in proc.stdout.splitlines() if (m := _COLLECTED_ID.match(line.strip())))

    def _pytest_argv(self, tree: Path, holder: Path) -> list[str]:
        """pytest as the judge configures it: its own ini (from the base's markers), no plugin but the
        ones it names, rootdir and conftest search fixed to the checkout, no cache."""
        if self._pytest_ini is None:
            self._pytest_ini = _judge_ini(self.repo, self.base)
        ini = holder / f"{secrets.token_hex(6)}.ini"
        if not ini.exists():
            ini.write_text(self._pytest_ini, encoding="utf-8")
        plugins = ["-p", "pytest_timeout"] if _has_module("pytest_timeout") else []
        return [sys.executable, "-m", "pytest", "-c", str(ini), f"--rootdir={tree}", f"--confcutdir={tree}",
                "-p", "no:cacheprovider", *plugins, "--strict-markers"]

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
            moved = changed_files(judging.expected, tree_manifest(judging.tree))
            moved.update({p: k for changes in judging.overlays for p, k in overlay_changes(changes).items() if p not in moved})
            judging.overlays.clear()
            if moved:
                result = GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=result.log_tail,
                                    violations=tuple(f"{path}: {kind} while gate {gate.name} ran" + (
                                        " (a protected file)" if self.milestone.is_protected(path) else "")
                                        for path, kind in moved.items()),
                                    summary=f"{len(moved)} file(s) of the judged checkout changed during gate {gate.name}: "
                                            "candidate code must not rewrite tests, references or itself while judged")
            result = replace(result, duration_s=round(time.monotonic() - started, 3),
                             violations=tuple(result.violations[:_MAX_VIOLATIONS]))
            if judging.attempt:
                self.record.gate_result(judging.attempt, result)
            shown = () if result.passed else result.violations[:_SHOWN_VIOLATIONS]  # what failed, not only how many
            more = len(result.violations) - len(shown)
            self.progress("gate", f"{gate.name} {'pass' if result.passed else 'FAIL'}: {result.summary} ({result.duration_s:.1f} s)"
                          + "".join(f"\n  {v}" for v in shown) + (f"\n  ... and {more} more (the verdict lists them)" if more else ""))
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

    def _protected(self, gate: ProtectedGate, judging: _Judging) -> GateResult:
        violations = list(judging.policy.violations)
        if judging.live_tree is not None:
            is_protected = self.milestone.is_protected
            # Held-out material is left out of the agent's worktree on purpose (Workspace: sparse checkout).
            base = {p: h for p, h in base_manifest(self.repo, self.base, is_protected).items()
                    if not glob_match("milestones/*/hidden/**", p)}
            live = {p: h for p, h in disk_manifest(judging.live_tree, is_protected).items() if p not in judging.policy.new_tests}
            violations += [f"{v} (in your worktree, hidden from git: ignored, excluded or marked unchanged)"
                           for v in manifest_changes(base, live)]
        if violations:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(dict.fromkeys(violations)),
                              summary=f"{len(violations)} change(s) outside the editable globs or to a protected file "
                                      f"(the diff policy of milestone {self.milestone.id})")
        changed = judging.policy.changed
        summary = f"{len(changed)} file(s) changed, all editable"
        if judging.policy.new_tests:
            summary += f"; {len(judging.policy.new_tests)} new test file(s): {', '.join(judging.policy.new_tests)}"
        return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)

    # ------------------------------------------------------------------ guards

    def _guards(self, gate: GuardsGate, judging: _Judging) -> GateResult:
        from guards.config import GuardsConfigError, load_config
        from guards.report import summary as guards_summary
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
        violations += self._new_suppressions(gate, judging)
        if violations:
            found = len(violations)
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations),
                              summary=f"{found} finding{'' if found == 1 else 's'} in {' '.join(gate.paths)} "
                                      f"({result.files} files checked)")
        return GateResult(name=gate.name, kind=gate.kind, passed=True,
                          summary=f"{guards_summary(0, 0, result.files)} ({', '.join(gate.rules)})")

    def _new_suppressions(self, gate: GuardsGate, judging: _Judging) -> list[str]:
        """Every `# guard: allow` the candidate's files have beyond the base's, read from the files (never
        from one diff dialect's text): a red line the candidate lifted for itself is a reviewer's decision."""
        from guards.suppression import new_suppressions

        in_scope = [p for p, kind in judging.policy.changed.items() if kind != "deleted" and p.endswith(".py")
                    and any(p == s or p.startswith(s.rstrip("/") + "/") for s in gate.paths)]
        candidate = {p: (judging.tree / p).read_bytes().decode("utf-8", "replace") for p in in_scope}
        base = {p: raw.decode("utf-8", "replace") for p in in_scope if (raw := base_file(self.repo, self.base, p)) is not None}
        return new_suppressions(base, candidate)

    # ------------------------------------------------------------------ pytest

    def _pytest_run(self, name: str, targets: list[str], args: list[str], judging: _Judging, timeout_s: float,
                    ignore: tuple[str, ...] = (), files: int | None = None,
                    barrier: bool = True) -> tuple[Any, list[tuple[str, str, str]] | None, list[str]]:
        """One sandboxed pytest process: (job result, its tests as (node id, status, message) or None when the
        run cannot be read, problems). With `barrier` (the acceptance tests) the process never imports candidate
        code (harness/judge/barrier.py): the tests run it in children that hand back data. Outcomes come from the
        judge's plugin on the judge's pipe, signed with a token only that plugin holds (harness/judge/pytest_report.py),
        never from a file the process wrote; the judge's canary tests run in the same process and must come out as
        written (harness/judge/canary.py)."""
        from harness.judge.canary import canary_problems, write_canaries
        from harness.judge.pytest_report import CANARIES, OPTION, parse_reports

        scratch = _neutral(judging.holder)
        token = secrets.token_hex(16)
        token_file = scratch / "token"
        token_file.write_text(token, encoding="utf-8")
        canaries = write_canaries(_neutral(judging.holder))
        log = judging.log_dir / f"{name}.log"
        fence = []
        if barrier:
            def is_candidate(rel: str) -> bool:
                return rel in judging.policy.changed or self.milestone.is_editable(rel)
            fence = [f"{BARRIER}={write_barrier(_neutral(judging.holder) / 'barrier.json', judging.tree, judging.expected, is_candidate)}"]
        # The tests' tmp_path root in the run's own folder: gone with the judging, never shared with another one.
        argv = [*self._pytest_argv(judging.tree, judging.holder), "-p", "harness.judge.pytest_report", *fence,
                f"{OPTION}={token_file}", f"{CANARIES}={canaries.path}", f"--basetemp={scratch / 'tmp'}", *targets, str(canaries.path), *args, "-q", "-rfE",
                *(f"--ignore={judging.tree / p}" for p in ignore)]
        # The checkout's code first; then the judge's own, for its plugin (a checkout need not hold harness/).
        path = judging.env_overrides["PYTHONPATH"] + os.pathsep + str(_JUDGE_ROOT)
        shown = TestFileProgress(token, is_canary=canaries.is_canary, files=files,
                                 show=lambda text, done, total: self.progress.live("tests", text, done, total))
        spec = JobSpec(name=f"{judging.label}-{name}", argv=argv, cwd=judging.tree, log_path=log, timeout_s=timeout_s,
                       env={**judging.env_overrides, **self._caches(scratch), "PYTHONPATH": path}, kill_grace_s=5.0,
                       on_line=shown, **self._sandbox_kwargs(judging, writable=(scratch,)))
        self.logs[spec.name] = log
        result = launch(spec).wait(poll_s=0.2)
        reports = parse_reports(_read(log), token)
        scrub_file(log)
        # A module that does not collect stops pytest before any test runs (status 2): its error is the verdict, as
        # a failing test (the canaries never ran).
        uncollected = any(t.phase == "collect" for t in reports.tests.values())
        problems = [*reports.problems, *([] if uncollected else canary_problems(canaries, reports.tests))]
        if reports.finished is None:
            problems.append("pytest never reported the end of its session on the judge's pipe (it was killed, or "
                            "exited from inside a test)")
        elif result.state != "timeout" and result.exit_code != reports.finished:
            problems.append(f"pytest ended its session with status {reports.finished} but the process exited "
                            f"{result.exit_code}: candidate code chose the exit status")
        elif reports.finished not in ((1, 2) if uncollected else (1,)) and not problems:
            # 1: some test failed, as the judge's failing canary must
            problems.append(f"pytest ended its session with status {reports.finished} (interrupted, an internal or "
                            "usage error)")
        for test in reports.tests.values():
            if test.status != "skipped":
                continue
            where = next((f"{rel}:{line}" for path, line in ((test.path, test.line), *test.through)
                          if (rel := self._candidate_code(path, judging)) is not None), None)
            if where is not None:
                problems.append(f"{test.node}: skipped from the candidate's code ({where}: {test.message}); only a test "
                                "may skip itself")
        cases = None if result.state == "timeout" else \
            [(t.node, t.status, t.message) for t in reports.tests.values() if not canaries.is_canary(t.node)]
        if cases is not None:
            _append_counts(log, cases, len(canaries.expected))
        return result, cases, problems

    def _candidate_code(self, path: str, judging: _Judging) -> str | None:
        """`path` relative to the checkout when it is code the candidate may change (an editable or changed file
        that is not a test module or conftest), else None."""
        if not path:
            return None
        try:
            rel = Path(path).resolve().relative_to(judging.tree.resolve()).as_posix()
        except (ValueError, OSError):
            return None
        if Path(rel).name.startswith("test_") or Path(rel).name == "conftest.py":
            return None
        return rel if self.milestone.is_editable(rel) or rel in judging.policy.changed else None

    def _pytest(self, gate: PytestGate, judging: _Judging) -> GateResult:
        files = len({node.partition("::")[0] for node in self.base_ids.get(gate.name, frozenset())}) or None
        result, cases, problems = self._pytest_run(gate.name, list(gate.selectors), list(gate.args), judging,
                                                   gate.timeout_s, ignore=judging.policy.new_tests, files=files)
        tail = _pytest_tail(result.read_log())
        if result.state == "timeout":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"pytest did not finish within {gate.timeout_s:g} s (killed)")
        if problems:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, violations=tuple(problems),
                              summary=f"the test run cannot be trusted: {problems[0]}")
        assert cases is not None
        failing = [(node, message) for node, status, message in cases if status in ("failed", "error")]
        passed = sum(1 for _, status, _ in cases if status == "passed")
        metrics = {"collected": float(len(cases)), "passed": float(passed), "failed": float(len(failing))}
        if failing:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              failing_tests=tuple(node for node, _ in failing),
                              violations=tuple(f"{node}: {message}" for node, message in failing if message),
                              summary=f"{len(failing)} of {len(cases)} tests failed")
        missing = sorted(self.base_ids.get(gate.name, frozenset()) - {node for node, _, _ in cases})
        if missing:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              violations=tuple(f"not run: {node}" for node in missing),
                              summary=f"test ids missing: {len(missing)} test(s) the base collects did not run "
                                      f"(first: {missing[0]})")
        if len(cases) < gate.min_collected:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              summary=f"only {len(cases)} tests collected; the milestone needs at least {gate.min_collected}")
        if passed == 0:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=metrics,
                              summary=f"none of the {len(cases)} tests ran (all skipped)")
        skipped = len(cases) - passed
        summary = f"{passed} passed" + (f", {skipped} skipped" if skipped else "") + f" (needs >= {gate.min_collected})"
        if judging.policy.new_tests and not judging.new_tests_ran:
            judging.new_tests_ran = True
            new = self._new_tests(gate, judging)
            if new is not None:
                return new
            summary += f"; the candidate's {len(judging.policy.new_tests)} new test file(s) pass on their own"
        return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=metrics, summary=summary)

    def _new_tests(self, gate: PytestGate, judging: _Judging) -> GateResult | None:
        """The candidate's own new test files, in a pytest process of their own (so nothing they do at import
        reaches the acceptance tests); a failure rejects, a pass counts toward nothing."""
        result, cases, problems = self._pytest_run(f"{gate.name}-new-tests", list(judging.policy.new_tests),
                                                   list(gate.args), judging, gate.timeout_s, barrier=False)
        tail = _pytest_tail(result.read_log())
        failing = [(node, message) for node, status, message in cases or [] if status in ("failed", "error")]
        if result.state == "timeout" or cases is None or failing or problems:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              failing_tests=tuple(node for node, _ in failing),
                              violations=tuple([*problems, *(f"{node}: {message}" for node, message in failing if message)]),
                              summary=f"the candidate's new test file(s) fail on their own: "
                                      f"{len(failing)} failing, pytest exit {result.exit_code} ({result.state})")
        return None

    def _sandbox_kwargs(self, judging: _Judging, *, writable: tuple[Path, ...], launcher: str = "local",
                        readonly: tuple[Path, ...] = (), hidden: tuple[Path, ...] = (), cwd: Path | None = None) -> dict[str, Any]:
        """JobSpec fields that put a candidate process in the sandbox: everything read-only, the judge's temp
        folder too (it lives under /tmp, which is private inside), only `writable` writable, the judge's records
        and the home's milestones (hidden material, references) out of sight, no network. The judged checkout,
        when it is the process's `cwd` (the default), is seen writable as a user's is: an overlay whose changes
        the judge reads after the gate (any rejects, as a changed file does), its judge-compiled `__pycache__`
        folders read-only; the user's home likewise, its writes discarded. None when unsandboxed, and for SLURM
        jobs (run on other hosts)."""
        if self.unsandboxed or launcher != "local":
            return {}
        hidden = tuple(p for p in (self.record.dir.parent, self.home / "milestones", *hidden) if p.exists()
                       and not judging.tree.is_relative_to(p))
        overlaid: tuple[tuple[Path, Path], ...] = ()
        if cwd is None or cwd == judging.tree:
            changes = Path(tempfile.mkdtemp(dir=judging.scratch[0]))  # out of the sandbox's sight (beside the holder)
            judging.overlays.append(changes)
            overlaid, readonly = ((judging.tree, changes),), (*readonly, *judging.pycache)
        return {"sandbox": Sandbox(writable=writable, readonly=(judging.holder, *readonly), hidden=hidden, overlaid=overlaid,
                                   home=True, gpus=judging.device == "cuda")}

    def _caches(self, folder: Path) -> dict[str, str]:
        """The cache and temp variables of a candidate process (`_cache_env`), unsandboxed only: in the sandbox its
        home is writable and /tmp private, both gone with it, so its caches go where a user's run puts them."""
        return {} if not self.unsandboxed else _cache_env(folder)

    # ------------------------------------------------------------------ jobs

    def _engine_spec(self, gate: JobGate, judging: _Judging, *, name: str, argv: list[str], job_dir: Path,
                     log_path: Path, timeout_s: float, replay: bool = False, **extra: Any) -> JobSpec:
        """`python -m engine ARGV` for `gate` (torchrun for several processes), sandboxed: `job_dir` writable, and for
        the gate's own run (not the judge's `replay` of it) the earlier jobs' folders its argv names."""
        # A job sees only the earlier jobs' folders its argv names ({job_dir:NAME}, e.g. a checkpoint to resume; writable
        # for the gate's own run, read-only for the judge's replay of it): the others are hidden, so a run cannot replay
        # another run's files as its own.
        named = referenced_jobs(gate.argv)
        earlier = tuple(o.job_dir for n, o in judging.jobs.items() if n in named)
        unnamed = tuple(o.job_dir for n, o in judging.jobs.items() if n not in named and o.job_dir.exists())
        writable, readonly = ((job_dir,), earlier) if replay else ((job_dir, *earlier), ())
        several = gate.nproc > 1 or gate.nodes > 1
        # Caches a job writes go to its own folder: nothing compiled by one candidate reaches another judging.
        return JobSpec(
            name=name, argv=["-m", "engine", *argv] if several else [sys.executable, "-m", "engine", *argv],
            torchrun=several, launcher=gate.launcher, nproc=gate.nproc, nodes=gate.nodes, timeout_s=timeout_s,
            env={**gate.env, **self._caches(job_dir), **_job_env(judging.env_overrides, path=self.unsandboxed)}, cwd=judging.tree,
            log_path=log_path,
            gpus_per_node=gate.gpus, partition=gate.partition, kill_grace_s=10.0, **extra,
            **self._sandbox_kwargs(judging, writable=writable, readonly=readonly, launcher=gate.launcher, hidden=unnamed),
        )

    def _run_engine_job(self, spec: JobSpec, gate: JobGate, judging: _Judging,
                        keeper: CheckpointKeeper | None = None) -> tuple[Any, set[str] | None]:
        """Launch, record and wait for an engine job: (its JobResult, the GPUs seen running it or None)."""
        self.logs[spec.name] = spec.log_path
        job = launch(spec)
        self.record.job_started(spec.name, list(spec.argv), attempt=judging.attempt, launcher=gate.launcher,
                                job_id=job.job_id, log=spec.log_path)
        if gate.gpus > 0 and gate.launcher == "local":
            result, gpus_seen = wait_watching_gpus(job)
        elif keeper is not None:
            result, gpus_seen = _wait_keeping(job, keeper), None
        else:
            result, gpus_seen = job.wait(poll_s=0.5), None
        scrub_file(spec.log_path)
        self.record.job_finished(spec.name, attempt=judging.attempt, exit_code=result.exit_code,
                                 duration_s=round(result.elapsed_s, 3), timed_out=result.state == "timeout", summary=result.detail)
        return result, gpus_seen

    def _job(self, gate: JobGate, judging: _Judging) -> GateResult:
        if gate.task in OP_TASKS:
            return self._op_job(gate, judging)
        gate = judging.draw.bind(gate)  # a drawn process count
        job_id = f"{judging.label}-{gate.name}"
        record_dir = self.record.dir / "jobs" / job_id
        if record_dir.is_dir():  # left by a judging a crash cut short: its files must not mix with this run's
            shutil.rmtree(record_dir)
        record_dir = self.record.job_dir(job_id)
        job_dir = _neutral(judging.holder)  # the job's own folder: writable by it, so only claims live there
        try:
            argv = self._render(gate, judging, job_dir)
        except (DrawError, ConfigUnknown, KeyError, ValueError) as err:
            return GateResult(name=gate.name, kind=gate.kind, passed=False,
                              summary=f"the judge cannot draw job {job_id}'s configuration: {err}")
        verify = self._verifies(gate)
        keeper = None
        if verify:
            plan = self._save_plan(argv, job_dir, judging)
            argv = plan.argv
            if plan.sample_pairs:  # beside the holder: the same filesystem for hard links, out of the sandbox's sight
                judging.scratch.append(Path(tempfile.mkdtemp(dir=judging.holder.parent)))
                keeper = CheckpointKeeper(plan.save_dir, judging.scratch[-1], draw_pairs(plan.num_steps, plan.sample_pairs))
            judging.saves[gate.name] = (plan, keeper)
        kill = {"kill_pattern": rf"\[LOSS\] step={gate.kill_at_step} ", "kill_signal": gate.kill_signal} \
            if gate.kill_at_step is not None else {}
        spec = self._engine_spec(gate, judging, name=job_id, argv=argv, job_dir=job_dir, log_path=record_dir / gate.log,
                                 timeout_s=gate.timeout_s, **kill,
                                 on_line=StepProgress(job_id, steps=self._planned_steps(argv) if gate.task == "train" else None,
                                                      show=lambda text, done, total: self.progress.live("step", text, done, total)))
        self.progress("job", f"{job_id} started ({gate.launcher}, {gate.task}): python -m engine {' '.join(argv)}")
        result, gpus_seen = self._run_engine_job(spec, gate, judging, keeper)
        outcome = JobOutcome(gate=gate, job_id=job_id, job_dir=job_dir, result=result, argv=tuple(argv),
                             kept=tuple(keeper.paths()) if keeper else ())
        judging.jobs[gate.name] = outcome
        tail = _tail(result.read_log())
        if result.state == "timeout":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"job {job_id} did not finish within {gate.timeout_s:g} s and was killed")
        if gate.kill_at_step is not None and not result.signal_sent:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"job {job_id} never printed step {gate.kill_at_step}, so the judge could not "
                                      f"interrupt it there ({gate.kill_signal})")
        if result.exit_code != gate.expect_exit or result.state == "cancelled":
            return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                              summary=f"job {job_id} exited {result.exit_code} (expected {gate.expect_exit})"
                                      + (f": {result.detail}" if result.detail else ""))
        summary = f"job {job_id} exited {result.exit_code} after {result.elapsed_s:.1f} s"
        if gpus_seen is not None:
            if 0 < len(gpus_seen) < gate.gpus:
                return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                                  summary=f"job {job_id} ran on {len(gpus_seen)} GPU(s) by the driver's count "
                                          f"(nvidia-smi), the milestone's job needs {gate.gpus}")
            if not gpus_seen:
                judging.flags.append(f"job {job_id}: the judge never saw its processes on a GPU (nvidia-smi)")
        if result.signal_sent:
            summary += f" ({result.signal_sent} sent by the judge at log line {result.signal_line})"
        if verify:
            problems, measured = self._verify_train(outcome, judging)
            judging.jobs[gate.name] = replace(outcome, evidence=measured)
            if problems:
                return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail, metrics=measured,
                                  violations=tuple(problems),
                                  summary=f"job {job_id}: {len(problems)} claim(s) its own weights contradict "
                                          "(checked with the judge's reference forward pass and optimizer state)")
            summary += "; claims verified against its weights" + (
                f" (judge val loss {measured['judge_val_loss']:.4f})" if "judge_val_loss" in measured else "") + (
                f"; {measured['exact_steps']:.0f} step(s) exact on their batch ({judging.saves[gate.name][0].scope} "
                f"kept for it)" if "exact_steps" in measured else "")
            return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=measured, summary=summary)
        return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)

    def _op_job(self, gate: JobGate, judging: _Judging) -> GateResult:
        """A bench or stress gate: the judge's op bench (harness/opbench.py) in a checkout of the base (role
        `reference`, the base's baseline) and in the judged checkout (role `candidate`), alternately, each
        sandboxed, then judged by harness/judge/opjudge.py from their files and the judge's clock."""
        from harness.judge.opcases import result_names, timing_case
        from harness.judge.opjudge import OpRun, judge_bench, judge_stress

        bench = gate.bench
        assert bench is not None  # the spec loader requires it for op tasks
        job_id = f"{judging.label}-{gate.name}"
        record_dir = self.record.dir / "jobs" / job_id
        if record_dir.is_dir():
            shutil.rmtree(record_dir)
        record_dir = self.record.job_dir(job_id)
        job_dir = _neutral(judging.holder)
        shape = ",".join(f"{k}={v}" for k, v in bench.shape.items())
        common = ["--op", bench.op, "--device", judging.device, "--dtype", bench.dtype, "--seed", str(judging.seed),
                  "--shape", shape, "--cases", str(bench.cases), "--case-scale", str(bench.case_scale),
                  "--reps", str(bench.reps), "--segments", str(bench.segments), "--pace-us", f"{bench.pace_ms * 1e3:g}"]
        # Each role's files live in a folder of its own outside the judged checkout's holder and are hidden from
        # the other role: a candidate that could read the reference's outputs could hand them in as its own.
        # One compiled-kernel cache per role for the gate's rounds: a version compiles once per judging.
        places = {role: Path(tempfile.mkdtemp()) for role in ("reference", "candidate")}
        kernels = {role: _neutral(place) for role, place in places.items()}
        runs: list[OpRun] = []
        started = time.monotonic()
        with _removed_after(list(places.values())), Workspace.scratch(self.repo, self.base) as base_checkout:
            trees = {"reference": base_checkout.worktree, "candidate": judging.tree}
            for round_no in range(1, bench.rounds + 1):
                for role in ("reference", "candidate"):
                    out = _neutral(places[role])
                    other = places["candidate" if role == "reference" else "reference"]
                    seconds = bench.seconds if role == "candidate" else 0.0  # the reference gives the quiet call only
                    version = "baseline" if role == "reference" else bench.version
                    name = f"{role}-{round_no}"
                    argv = [sys.executable, "-m", "harness.opbench", gate.task, *common, "--version", version,
                            "--seconds", str(seconds), "--out", str(out)]
                    result, gpus_seen = self._op_process(
                        gate, judging, name=f"{job_id}-{name}", argv=argv, tree=trees[role], log_path=record_dir / f"{name}.log",
                        writable=(out, kernels[role]), hidden=(other,), caches=kernels[role])
                    judging.jobs[gate.name] = JobOutcome(gate=gate, job_id=job_id, job_dir=job_dir, result=result,
                                                         argv=tuple(argv))
                    tail = _tail(result.read_log())
                    if result.state == "timeout" or result.exit_code != 0:
                        ended = f"did not finish within {gate.timeout_s:g} s" if result.state == "timeout" \
                            else f"exited {result.exit_code}"
                        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=tail,
                                          summary=f"job {job_id}: the {role} process (round {round_no}, {bench.op} "
                                                  f"{version}) {ended}" + (f": {result.detail}" if result.detail else ""))
                    if gpus_seen is not None and not gpus_seen:
                        judging.flags.append(f"job {job_id} {name}: the judge never saw its process on a GPU (nvidia-smi)")
                    runs.append(OpRun(role=role, round=round_no, out_dir=out, log_path=record_dir / f"{name}.log",
                                      line_times_path=result.line_times_path))
            names = result_names(timing_case(bench.op, bench.shape, judging.seed))
            if gate.task == "bench":
                problems, measured = judge_bench(op=bench.op, seed=judging.seed, cases=bench.cases, case_scale=bench.case_scale,
                                                 dtype=bench.dtype, timing_names=names, runs=runs, segments=bench.segments,
                                                 reps=bench.reps)
            else:
                problems, measured = judge_stress(timing_names=names, runs=runs, min_iterations=1 if bench.seconds > 0 else 0)
            judging.jobs[gate.name] = replace(judging.jobs[gate.name], evidence=measured)
            elapsed = time.monotonic() - started
            if problems:
                return GateResult(name=gate.name, kind=gate.kind, passed=False, metrics=measured, violations=tuple(problems),
                                  summary=f"job {job_id}: {len(problems)} problem(s) with {bench.op} {bench.version} found by "
                                          "the judge (its fp32 math, the reference process, its clock)")
            said = ", ".join(f"{k} {v:.4g}" for k, v in measured.items())
            return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=measured,
                              summary=f"job {job_id}: {bench.rounds} round(s) of reference and candidate in {elapsed:.1f} s; {said}")

    def _op_process(self, gate: JobGate, judging: _Judging, *, name: str, argv: list[str], tree: Path, log_path: Path,
                    writable: tuple[Path, ...], hidden: tuple[Path, ...], caches: Path) -> tuple[Any, set[str] | None]:
        """One sandboxed op-bench process in `tree`, recorded like any job: (its JobResult, GPUs seen or None)."""
        paths = python_env(tree, _neutral(judging.holder)) if tree != judging.tree else {"PYTHONPATH": judging.env_overrides["PYTHONPATH"]}
        paths["PYTHONPATH"] += os.pathsep + str(_JUDGE_ROOT)  # the checkout's engine first, then the judge's harness
        env = {**gate.env, **(self._caches(caches) if tree == judging.tree else _cache_env(caches)),
               **_job_env({**judging.env_overrides, **paths})}
        spec = JobSpec(name=name, argv=argv, timeout_s=gate.timeout_s, env=env, cwd=tree, log_path=log_path,
                       gpus_per_node=gate.gpus, kill_grace_s=10.0,
                       **self._sandbox_kwargs(judging, writable=writable, readonly=(tree.parent,), hidden=hidden, cwd=tree))
        self.logs[name] = log_path
        job = launch(spec)
        self.record.job_started(name, list(spec.argv), attempt=judging.attempt, launcher="local", job_id=job.job_id,
                                log=log_path)
        self.progress("job", f"{name} started: {' '.join(argv[2:5])} ...")
        result, gpus_seen = wait_watching_gpus(job) if gate.gpus else (job.wait(poll_s=0.5), None)
        scrub_file(log_path)
        self.record.job_finished(name, attempt=judging.attempt, exit_code=result.exit_code,
                                 duration_s=round(result.elapsed_s, 3), timed_out=result.state == "timeout",
                                 summary=result.detail)
        return result, gpus_seen

    def _render(self, gate: JobGate, judging: _Judging, job_dir: Path) -> list[str]:
        """The job's argv with its placeholders filled: the fixed ones, the judging's draw, and {corpus}, the judge-cut
        corpus sized for this job's batch so that its run crosses an epoch boundary (harness/judge/draws.py)."""
        def render(drawn: dict[str, str]) -> list[str]:
            return render_argv(gate.argv, job_dir=job_dir, worktree=judging.tree, seed=judging.seed, device=judging.device,
                               data=data_dir(self.home), job_dirs={name: o.job_dir for name, o in judging.jobs.items()},
                               drawn=drawn)

        drawn = judging.draw.placeholders()
        if not any("{corpus}" in arg for arg in gate.argv):
            return render(drawn)
        defaults, presets = self._base()
        expected = expected_config(render({**drawn, "corpus": ""}), defaults=defaults, presets=presets)
        assert isinstance(gate.nproc, int)  # bound to the draw by the caller
        tokens, _ = corpus_tokens(expected, gate.nproc * gate.nodes, judging.draw.values["corpus"])
        if tokens not in judging.corpora:
            from harness.judge.evidence import embedded_tokens

            split = {name: base_file(self.repo, self.base, f"engine/data/corpus/{name}.jsonl") for name in ("train", "validation")}
            if None in split.values():
                raise DrawError("the base commit lacks engine/data/corpus/{train,validation}.jsonl to cut a corpus from")
            judging.corpora[tokens] = write_corpus(_neutral(judging.holder), embedded_tokens(split["train"]).tokens,
                                                   embedded_tokens(split["validation"]).tokens, tokens=tokens,
                                                   offset=int(judging.draw.values["corpus"]["offset"]),
                                                   description="cut by the judge from the base's bundled corpus")
        return render({**drawn, "corpus": str(judging.corpora[tokens])})

    def _planned_steps(self, argv: list[str]) -> int | None:
        """The steps a train job's argv asks for, by the judge's reading of the base's config (for the progress bar)."""
        defaults, presets = self._base()
        try:
            return int(expected_config(argv, defaults=defaults, presets=presets)["num_steps"])
        except (ConfigUnknown, KeyError, ValueError):
            return None

    def _save_plan(self, argv: list[str], job_dir: Path, judging: _Judging) -> SavePlan:
        """The job's argv made to leave the checkpoints the judge verifies it from (harness/judge/saveplan.py)."""
        defaults, presets = self._base()
        try:
            expected = expected_config(argv, defaults=defaults, presets=presets)
        except ConfigUnknown:
            expected = {}
        plan = plan_saves(argv, job_dir, expected=expected, base_defaults=defaults, device=judging.device,
                          free_bytes=shutil.disk_usage(job_dir).free)
        if plan.limits:
            judging.flags.append(plan.limits)
        return plan

    def _verifies(self, gate: JobGate) -> bool:
        """Train jobs that end on their own are verified; one the judge interrupts has no final weights."""
        return gate.task == "train" and gate.verify and gate.kill_at_step is None

    def _base(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._base_config is None:
            self._base_config = load_base(self.repo, self.base)
        return self._base_config

    def _verify_train(self, outcome: JobOutcome, judging: _Judging) -> tuple[list[str], dict[str, float]]:
        """Hold a finished train job's printed claims against its own final weights (harness/judge/evidence.py):
        model size, the loss of the weights on held-out data drawn with the judging's seed, the applied lr."""
        from harness.judge.contract import check_lr_contract
        from harness.judge.digits import digit_problems
        from harness.judge.evidence import embedded_tokens, shard_tokens, verify_train_run
        from harness.judge.logparse import LogParseError, parse_engine_log, parse_eval_lines

        defaults, presets = self._base()
        try:
            expected = expected_config(outcome.argv, defaults=defaults, presets=presets)
        except ConfigUnknown as err:
            return [f"the judge cannot state what the job was asked to run: {err}"], {}
        text = outcome.result.read_log()
        try:
            steps, evals = parse_engine_log(text), parse_eval_lines(text)
        except LogParseError as err:
            return [str(err)], {}
        if rounded := digit_problems(steps, evals):  # numbers rounded below the documented format (digits.py)
            return rounded, {}
        try:
            if expected.get("data_path"):
                validation = shard_tokens(Path(str(expected["data_path"])) / "validation")
                training = shard_tokens(Path(str(expected["data_path"])) / "train")
            elif not expected.get("hf_dataset") and not expected.get("tokenizer_path"):
                split = {name: base_file(self.repo, self.base, f"engine/data/corpus/{name}.jsonl") for name in ("train", "validation")}
                if None in split.values():
                    return ["the base commit lacks engine/data/corpus/{train,validation}.jsonl to draw text from"], {}
                fields = {"text_field": str(expected.get("hf_text_field", "text")),
                          "text_template": str(expected.get("hf_text_template", ""))}
                validation = embedded_tokens(split["validation"], **fields)
                training = embedded_tokens(split["train"], **fields)
            else:
                return ["the judge can verify runs on the bundled corpus or on `engine prepare` shards (--data-path); "
                        "this job tokenizes another source on the fly"], {}
        except (OSError, ValueError, KeyError) as err:
            return [f"the judge cannot read the job's data: {err}"], {}
        plan, keeper = judging.saves[outcome.gate.name]
        self.progress("job", f"{outcome.job_id}: holding its claims against its own weights (model, held-out loss, "
                             f"applied lr) ...")
        started = time.monotonic()
        evidence = verify_train_run(plan.save_dir, expected_config=expected, printed_steps=steps, printed_evals=evals,
                                    seed=judging.seed, validation=validation, training=training, device=judging.device,
                                    # The applied lr is fitted from steps N-1 and N, which the judge asked for.
                                    require_lr_check=plan.pairs_expected, check_schedule=not outcome.gate.lr_contract)
        self.progress("job", f"{outcome.job_id}: claims read back in {time.monotonic() - started:.1f} s")
        measured = {k: float(v) for k, v in (("judge_val_loss", evidence.judge_val_loss),
                                             ("lr_estimate", evidence.lr_estimate)) if v is not None}
        if plan.scope == "none" or any(v.startswith(("config:", "model shape", "checkpoint:")) for v in evidence.violations):
            return list(evidence.violations), measured  # another model, or no weights to hold a step against
        eos_id = (training or validation).eos_id  # where --document-mask starts a document, by the judge's tokenization
        contract, held = check_lr_contract(outcome.gate.lr_contract, printed_steps=steps, expected=expected,
                                           pairs=_kept_pairs(plan, keeper), resumed="resume" in flag_values(outcome.argv))
        problems, exact = self._verify_exact(outcome, judging, expected, steps, plan, keeper, text, eos_id)
        if not problems and not evidence.violations and plan.scope == "the final step":
            problems, replayed = self._replay(outcome, judging, expected, steps, eos_id)
            exact.update(replayed)
        return [*problems, *evidence.violations, *contract], {**measured, **exact, **held}

    def _replay(self, outcome: JobOutcome, judging: _Judging, expected: dict[str, Any], steps: list[Any],
                eos_id: int) -> tuple[list[str], dict[str, float]]:
        """A job verified on its final step alone, replayed untimed up to a secret step (saveplan.plan_replay): its
        printed steps must equal the timed run's bit for bit, and the replay's steps from the secret one on must be
        exact on their batches."""
        from harness.judge.checkpoint import list_checkpoints
        from harness.judge.exactstep import step_pairs
        from harness.judge.logparse import LogParseError, parse_engine_log

        gate = outcome.gate
        job_id = f"{outcome.job_id}-replay"
        # The timed run's checkpoints have been read; unless a later job resumes from them, their disk goes to the replay.
        if not any(gate.name in referenced_jobs(g.argv) for g in self.milestone.gates if isinstance(g, JobGate)):
            shutil.rmtree(judging.saves[gate.name][0].save_dir, ignore_errors=True)
        replay_dir = _neutral(judging.holder)
        argv = self._render(gate, judging, replay_dir)
        plan = plan_replay(argv, replay_dir, expected=expected, free_bytes=shutil.disk_usage(replay_dir).free)
        if isinstance(plan, str):
            judging.flags.append(f"job {outcome.job_id}: {plan}; only its final step is verified exactly")
            return [], {}
        spec = self._engine_spec(gate, judging, name=job_id, argv=plan.argv, job_dir=replay_dir,
                                 log_path=self.record.job_dir(outcome.job_id) / "replay.log", timeout_s=2 * gate.timeout_s,
                                 replay=True, kill_pattern=rf"\[LOSS\] step={plan.stop_at} ", kill_signal="SIGKILL")
        self.progress("job", f"{job_id}: the job again, untimed, saving every step, stopped at a secret step")
        result, _ = self._run_engine_job(spec, gate, judging)
        text = result.read_log()
        if not result.signal_sent:
            ended = "did not finish in time" if result.state == "timeout" else f"exited {result.exit_code}"
            return [f"replay {job_id}: the job run again with the same argv and seed {ended} before printing step "
                    f"{plan.stop_at}: {_tail(text, 3)}"], {}
        try:
            replayed = {r.step: r for r in parse_engine_log(text)}
        except LogParseError as err:
            return [f"replay {job_id}: {err}"], {}
        timed = {r.step: r for r in steps}
        problems = []
        for step in range(1, plan.stop_at + 1):
            a, b = timed.get(step), replayed.get(step)
            if a is None or b is None:
                continue
            if (a.loss, a.grad_norm, a.lr) != (b.loss, b.grad_norm, b.lr):
                problems.append(f"step {step}: the timed run printed loss={a.loss} grad_norm={a.grad_norm} lr={a.lr}, the "
                                f"judge's replay of the same argv and seed (--deterministic, saving every step) printed "
                                f"loss={b.loss} grad_norm={b.grad_norm} lr={b.lr}")
        if plan.step not in timed or plan.step not in replayed:
            problems.append(f"replay {job_id}: step {plan.step} is missing from the "
                            f"{'timed run' if plan.step not in timed else 'replay'}'s printed lines")
        if problems:
            return problems[:8], {}
        # Only steps from the secret one on count: a replay that kept early checkpoints alone verifies nothing secret.
        late = [s for _, s in step_pairs(list_checkpoints(plan.save_dir)) if int(s.name.removeprefix("step_")) >= plan.step]
        if not late:
            return [f"replay {job_id}: it left no two consecutive checkpoints from step {plan.step - 1} on in "
                    f"{plan.save_dir} (asked: --save-every 1 --keep-last 4, stopped at step {plan.stop_at})"], {}
        save = SavePlan(argv=plan.argv, save_dir=plan.save_dir, num_steps=plan.num_steps,
                        scope=f"a replay up to secret step {plan.step}")
        replay = JobOutcome(gate=gate, job_id=job_id, job_dir=replay_dir, result=result, argv=tuple(plan.argv))
        problems, exact = self._verify_exact(replay, judging, expected, list(replayed.values()), save, None, text, eos_id)
        return [f"replay {job_id}: {p}" for p in problems], {"replay_step": float(plan.step),
                                                             "replay_exact_steps": exact.get("exact_steps", 0.0)}

    def _verify_exact(self, outcome: JobOutcome, judging: _Judging, expected: dict[str, Any], steps: list[Any],
                      plan: SavePlan, keeper: CheckpointKeeper | None, text: str,
                      eos_id: int) -> tuple[list[str], dict[str, float]]:
        """Each step the job left checkpoints N - 1 and N for, against the judge's forward and backward pass on the
        exact batch of step N as the base engine states it (harness/judge/exactstep.py, batches.py)."""
        from harness.judge.exactstep import batch_order, verify_exact_steps
        from harness.judge.logparse import LogParseError, parse_skip_lines

        pairs = _kept_pairs(plan, keeper)
        if not pairs:
            return [f"exact steps: the job left no two consecutive checkpoints in {plan.save_dir} (the judge asked for "
                    f"{plan.scope}), so no step's work can be verified"], {}
        try:  # skipped updates (--skip-spike-factor) shift which batch a step trained on
            order, problems, unknown = batch_order(parse_skip_lines(text), expected=expected)
        except LogParseError as err:
            return [str(err)], {}
        if order is None:
            if unknown:
                judging.flags.append(f"job {outcome.job_id}: {unknown}")
            return problems, {}
        world = outcome.gate.nproc * outcome.gate.nodes
        verified = [int(p.name.removeprefix("step_")) for _, p in pairs]
        wanted = {order.batch_of(s) for s in verified} | {order.skipped_batch(k) for k in order.skips if k.step in verified}
        # Every step where the job keeps them all: the same request for every job of one data setup (the resumed
        # runs of a milestone too), answered once.
        if plan.scope == "every step":
            wanted |= set(range(2, plan.num_steps + 1))
        batches = self._base_batches(outcome, judging, sorted(wanted), world, expected)
        if isinstance(batches, str):
            return [batches], {}
        if batches is None:
            judging.flags.append(f"job {outcome.job_id}: exact steps not verified: the base engine has no `batches` command "
                                 "to state what each step trains on")
            return [], {}
        started = time.monotonic()
        self.progress("job", f"{outcome.job_id}: recomputing {len(pairs)} step(s) on their exact batches "
                             f"(checkpoints {pairs[0][1].name}..{pairs[-1][1].name}) ...")

        def checked(step: int, done: int, total: int) -> None:
            elapsed = time.monotonic() - started
            self.progress.live("job", f"{outcome.job_id}: exact step {step} checked, {done}/{total} in {elapsed:.0f} s"
                                      + (f", about {elapsed / done * (total - done):.0f} s left" if done < total else ""),
                               done, total)

        exact = verify_exact_steps(pairs, expected_config=expected, printed_steps=steps, batches=batches,
                                   device=judging.device, eos_id=eos_id, order=order, on_checked=checked)
        self.progress("job", f"{outcome.job_id}: {len(exact.checked)} exact step(s) checked in "
                             f"{time.monotonic() - started:.1f} s")
        measured = {"exact_steps": float(len(exact.checked))}
        if exact.checked:
            measured["exact_grad_rel_max"] = max(c.grad_rel for c in exact.checked)
            if any(c.floor for c in exact.checked):  # bf16: the judge's own bf16 error, which widened the bounds
                measured["exact_bf16_floor_grad_max"] = max(c.floor.get("grad", 0.0) for c in exact.checked)
        return exact.violations, measured

    def _base_batches(self, outcome: JobOutcome, judging: _Judging, steps: list[int], world: int,
                      expected: dict[str, Any]) -> Any:
        """{step: StepBatch} from `engine batches` of the base commit without the milestone's setup patch, run
        sandboxed (harness/judge/batches.py); None when that engine has no such command; a str: why it failed."""
        from harness.judge.batches import FILE, MISSING_COMMAND, BatchesError, batches_argv, read_batches

        args = batches_argv(outcome.argv, steps=steps, world_size=world, out=Path("OUT"))
        if tuple(args) in judging.batches:
            return judging.batches[tuple(args)]
        name = f"{outcome.job_id}-batches"
        log = self.record.job_dir(outcome.job_id) / "batches.log"
        with Workspace.scratch(self.repo, self.base) as checkout:
            tree = checkout.worktree
            if self.milestone.setup is not None:  # a setup may plant the data-order defect the milestone repairs
                setup = str((self.home / self.milestone.setup).resolve())
                if subprocess.run(["git", "-C", str(tree), "apply", "-R", "--check", setup], capture_output=True).returncode == 0:
                    subprocess.run(["git", "-C", str(tree), "apply", "-R", setup], capture_output=True, check=True)
            out = _neutral(judging.holder)
            argv = [sys.executable, "-m", "engine", *batches_argv(outcome.argv, steps=steps, world_size=world, out=out)]
            paths = python_env(tree, _neutral(judging.holder))
            env = {**_cache_env(out), **_job_env({**judging.env_overrides, **paths})}
            spec = JobSpec(name=name, argv=argv, timeout_s=600, env=env, cwd=tree, log_path=log, kill_grace_s=5.0,
                           **self._sandbox_kwargs(judging, writable=(out,), readonly=(tree.parent,), cwd=tree))
            self.progress("job", f"{name}: the base engine states the batches of steps {steps[0]}..{steps[-1]}")
            result = launch(spec).wait(poll_s=0.2)
            text = result.read_log()
            if result.exit_code == 2 and MISSING_COMMAND in text:
                answer: Any = None
            elif result.exit_code != 0:
                answer = (f"exact steps: the base engine could not state the batches of job {outcome.job_id} (exit "
                          f"{result.exit_code}): {_tail(text, 3)}")
            else:
                try:
                    answer = read_batches(out / FILE, seq_length=int(expected["seq_length"]),
                                          vocab_size=int(expected["vocab_size"]))
                except BatchesError as err:
                    answer = f"exact steps: {err}"
        judging.batches[tuple(args)] = answer
        return answer

    # ------------------------------------------------------------------ metrics

    def _metrics(self, gate: MetricsGate, judging: _Judging) -> GateResult:
        defaults, presets = self._base()
        violations, metrics, flags = judge_metrics(gate, judging.jobs, tree=judging.tree, presets=presets or None,
                                                   defaults=defaults)
        judging.flags += flags
        tails = [_tail(o.result.read_log(), 20) for o in judging.jobs.values()] if violations else []
        if violations:
            return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations), metrics=metrics,
                              log_tail="\n".join(tails), summary=f"{len(violations)} of {len(gate.rules)} rule(s) fail")
        return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=metrics,
                          summary=f"{len(gate.rules)} rule(s) hold")



@contextlib.contextmanager
def _removed_after(folders: list[Path]) -> Iterator[None]:
    """Remove `folders` when the block ends, however it ends. The list is read at the end, so a folder the
    block appends to it (a job's checkpoint keeper, made as the job starts) is removed too."""
    try:
        yield
    finally:
        for folder in folders:
            for parent, dirs, _ in os.walk(folder):  # overlayfs leaves its work folder unreadable (mode 000)
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.chmod(os.path.join(parent, name), 0o700)
            shutil.rmtree(folder, ignore_errors=True)


def _judge_caches(folder: Path) -> contextlib.AbstractContextManager:
    """The judge's own process keeps torch's caches in `folder` while it judges. Its reference model's activation
    recompute (torch.utils.checkpoint, on a large model) imports torch._dynamo, which makes Inductor's cache folder,
    by default the shared $TMPDIR/torchinductor_$USER: a judging leaves nothing behind, its own process included."""
    env = _cache_env(folder)
    return torch_caches_while(env["TRITON_CACHE_DIR"], env["TORCHINDUCTOR_CACHE_DIR"])


def _cache_env(folder: Path) -> dict[str, str]:
    """Where a candidate process's caches and temp files go (compiled kernels, Triton, Inductor, anything under
    XDG, TMPDIR): its own writable folder, so the sandbox's read-only home is never needed, nothing compiled
    reaches another judging, and nothing is left in the user's TMPDIR when the judge runs unsandboxed (torchrun's
    torchelastic_* log folders stay behind; Inductor's default is $TMPDIR/torchinductor_$USER). The TMPDIR folder
    is made here: tempfile falls back to /tmp when it does not exist."""
    tmp = folder / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {"XDG_CACHE_HOME": str(folder / ".cache"), "TEMPER_KERNEL_CACHE": str(folder / ".kernels"),
            "TRITON_CACHE_DIR": str(folder / ".triton"), "TORCHINDUCTOR_CACHE_DIR": str(folder / ".inductor"),
            "TMPDIR": str(tmp)}


def _job_env(overrides: dict[str, str], *, path: bool = True) -> dict[str, str]:
    """A job gets the checkout's code and no pytest or seed variables: its seed, if any, is in its argv. `path=False`:
    not the PYTHONPATH either, for a `python -m` run in the checkout, which puts it first on its path by itself, as a
    user's run does (sandboxed: no other folder of the user's can shadow it there)."""
    return {k: v for k, v in overrides.items() if not k.startswith(("PYTEST_", "TEMPER_JUDGE_")) and (path or k != "PYTHONPATH")}


def _kept_pairs(plan: SavePlan, keeper: CheckpointKeeper | None) -> list[tuple[Path, Path]]:
    """(checkpoint N - 1, checkpoint N) pairs of a job: those the judge linked as they appeared and those left."""
    from harness.judge.checkpoint import list_checkpoints
    from harness.judge.exactstep import step_pairs

    found = {p.name: p for p in (keeper.paths() if keeper else [])} | {p.name: p for p in list_checkpoints(plan.save_dir)}
    return step_pairs(sorted(found.values(), key=lambda p: p.name))


def _wait_keeping(job: Any, keeper: CheckpointKeeper) -> Any:
    """Wait for a local job while `keeper` links the checkpoints it writes (harness/judge/keeper.py)."""
    try:
        while (result := job.poll()) is None:
            keeper.poll()
            time.sleep(0.1)
    except KeyboardInterrupt:
        job.cancel()
        raise
    keeper.poll()
    return result


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _judge_ini(repo: Path, base: str) -> str:
    """The judge's pytest ini: the markers (and per-test timeout) the base commit's pyproject.toml declares,
    nothing else. The candidate's pytest configuration files are never read (-c names this one)."""
    raw = base_file(repo, base, "pyproject.toml")
    options: dict[str, Any] = {}
    if raw is not None:
        try:
            options = tomllib.loads(raw.decode("utf-8")).get("tool", {}).get("pytest", {}).get("ini_options", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            options = {}
    lines = ["[pytest]"]
    markers = [str(m) for m in options.get("markers", [])]
    if markers:
        lines += ["markers ="] + [f"    {m}" for m in markers]
    if "timeout" in options and _has_module("pytest_timeout"):
        lines.append(f"timeout = {int(options['timeout'])}")
    return "\n".join(lines) + "\n"


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
    if verdict.draw:
        values = json.dumps(verdict.draw.get("values", {}), sort_keys=True, separators=(",", ":"))
        lines.append(f"  drawn (judge seed {verdict.seed}; replay: --judge-seed {verdict.seed}, or --draw '{values}'): {values}")
    return "\n".join(lines)
