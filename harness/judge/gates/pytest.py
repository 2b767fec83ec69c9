"""The pytest gate (MODEL = PytestGate): the milestone's tests, run so that the pass/fail never comes from candidate code.

A sandboxed pytest with the judge's own ini (`-c`, markers from the base's pyproject), plugin autoload off, rootdir
and confcutdir fixed, no cache provider. The acceptance tests run behind the import barrier (harness/judge/barrier.py),
outcomes come signed on the judge's pipe (harness/judge/pytest_report.py) and the judge's canaries must come out as
written (harness/judge/canary.py). Every test ID the base collects must run; the candidate's new test files run
in a pytest process of their own and never count toward min_collected.

A public judging (the agent's dry run) runs the gate's public tests only: selectors that name held-out material are
left out (and min_collected, which counts them, with them), and a gate whose tests are all held out is skipped.
"""

import importlib.util
import os
import re
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.jobs import JobSpec, launch
from harness.judge.barrier import BARRIER_OPTION as BARRIER, write_barrier
from harness.judge.baseconfig import base_file
from harness.judge.canary import canary_problems, write_canaries
from harness.judge.admit import hidden_files, place_held_out
from harness.judge.judging import JUDGE_ROOT, Context, GateError, Judging, candidate_env, neutral, read_text, tail
from harness.judge.live import TestFileProgress, count_text
from harness.judge.manifests import tree_manifest
from harness.judge.pytest_report import CANARIES, OPTION, PREFIX, parse_reports
from harness.records import scrub_file, scrub_text, write_atomic
from harness.settings import child_env
from harness.spec import PytestGate
from harness.verdict import GateResult
from harness.workspace import Workspace

__all__ = ["MODEL", "run", "collect_base_ids", "collect_ids", "judge_ini"]

MODEL = PytestGate
_COLLECTED_ID = re.compile(r"^(\S+\.py::\S.*)$")


def run(gate: PytestGate, judging: Judging) -> GateResult:
    held: list[str] = []
    if judging.public:
        public, held = _public_selectors(gate, judging)
        if not public:
            return GateResult(name=gate.name, kind=gate.kind, passed=True, skipped=True,
                              summary=f"not run: its tests are held out ({', '.join(held)}); held-out tests run only "
                                      "when you submit")
        gate = gate.model_copy(update={"selectors": public})
    base_ids = collect_base_ids(gate, judging)
    files = len({node.partition("::")[0] for node in base_ids}) or None
    result, cases, problems = _pytest_run(gate.name, list(gate.selectors), list(gate.args), judging,
                                          gate.timeout_s, ignore=judging.policy.new_tests, files=files)
    log_tail = _pytest_tail(result.read_log())
    if result.state == "timeout":
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                          summary=f"pytest did not finish within {gate.timeout_s:g} s (killed)")
    if problems:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, violations=tuple(problems),
                          summary=f"the test run cannot be trusted: {problems[0]}")
    assert cases is not None
    failing = [(node, message) for node, status, message in cases if status in ("failed", "error")]
    passed = sum(1 for _, status, _ in cases if status == "passed")
    metrics = {"collected": float(len(cases)), "passed": float(passed), "failed": float(len(failing))}
    if failing:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, metrics=metrics,
                          failing_tests=tuple(node for node, _ in failing),
                          violations=tuple(f"{node}: {message}" for node, message in failing if message),
                          summary=f"{len(failing)} of {len(cases)} tests failed")
    missing = sorted(base_ids - {node for node, _, _ in cases})
    if missing:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, metrics=metrics,
                          violations=tuple(f"not run: {node}" for node in missing),
                          summary=f"test ids missing: {len(missing)} test(s) the base collects did not run "
                                  f"(first: {missing[0]})")
    if len(cases) < gate.min_collected and not held:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, metrics=metrics,
                          summary=f"only {len(cases)} tests collected; the milestone needs at least {gate.min_collected}")
    if passed == 0:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail, metrics=metrics,
                          summary=f"none of the {len(cases)} tests ran (all skipped)")
    skipped = len(cases) - passed
    summary = f"{passed} passed" + (f", {skipped} skipped" if skipped else "") + (
        f"; held out, not run: {', '.join(held)} (held-out tests run only when you submit; the gate's >= "
        f"{gate.min_collected} counts them)" if held else f" (needs >= {gate.min_collected})")
    if judging.policy.new_tests and not judging.new_tests_ran:
        judging.new_tests_ran = True
        new = _new_tests(gate, judging)
        if new is not None:
            return new
        summary += f"; the candidate's {len(judging.policy.new_tests)} new test file(s) pass on their own"
    return GateResult(name=gate.name, kind=gate.kind, passed=True, metrics=metrics, summary=summary)


def collect_base_ids(gate: PytestGate, judging: Judging) -> frozenset[str]:
    """Test IDs `gate` collects on the base (+ hidden material, unless the judging is public), in a checkout of its
    own that no candidate touches: every one must run in the judged checkout. Collected when the gate first runs (a
    patch refused by an earlier gate costs no collection), once per runner and kind of judging."""
    ctx = judging.ctx
    key = f"{gate.name} (public)" if judging.public else gate.name
    if key in ctx.base_ids:
        return ctx.base_ids[key]
    log = judging.log_dir / f"{gate.name}-base-collect.log"
    with Workspace.scratch(ctx.repo, ctx.base) as scratch:
        tree = scratch.worktree
        place_held_out(ctx.milestone, ctx.home, tree, public=judging.public)
        ctx.progress("gate", f"collecting the base's tests for {gate.name} ...")
        proc, ids = collect_ids(ctx, tree, tree.parent, gate)
    write_atomic(log, scrub_text(proc.stdout + proc.stderr))
    if proc.returncode not in (0, 5):
        raise GateError(f"the base's tests for gate {gate.name} do not collect (pytest exit {proc.returncode}); see {log}")
    ctx.base_ids[key] = ids
    ctx.record.note("base test ids", gate=gate.name, count=len(ids), public=judging.public)
    return ids


def _public_selectors(gate: PytestGate, judging: Judging) -> tuple[list[str], list[str]]:
    """(public, held out) of `gate`'s selectors: held out, a selector naming a file of the milestone's hidden material or
    a folder only that material brings (no file of the base lies in it); a folder of the base keeps its public tests."""
    hidden = hidden_files(judging.milestone, judging.ctx.home)
    base = [rel for rel in judging.expected if rel not in judging.policy.changed]
    public: list[str] = []
    held: list[str] = []
    for selector in gate.selectors:
        path = selector.partition("::")[0].rstrip("/")
        inside = path + "/"
        brought = path in hidden or (any(h.startswith(inside) for h in hidden) and not any(r.startswith(inside) for r in base))
        (held if brought else public).append(selector)
    return public, held


def collect_ids(ctx: Context, tree: Path, holder: Path, gate: PytestGate, *, barrier: bool = True,
                is_candidate: Callable[[str], bool] | None = None) -> tuple[subprocess.CompletedProcess, frozenset[str]]:
    """`pytest --collect-only` of `gate` in checkout `tree` as the judged run collects it (the judge's ini and
    plugins, files in `holder`): the process and the test IDs it listed. With `barrier`, behind the import barrier
    (every file the milestone may edit refused, or every file `is_candidate` names), so acceptance tests that import
    candidate code fail here, before any candidate is judged."""
    env = candidate_env(tree, holder, 0, base=True)  # only a checkout of the base (or a trusted copy) is collected
    env["PYTHONPATH"] += os.pathsep + str(JUDGE_ROOT)
    fence = []
    if barrier:
        refused = is_candidate or ctx.milestone.is_editable
        file = write_barrier(neutral(holder) / "barrier.json", tree, tree_manifest(tree), refused)
        fence = ["-p", "harness.judge.pytest_report", f"{BARRIER}={file}"]
    argv = [*_pytest_argv(ctx, tree, holder), *fence, "--collect-only", "-q", *gate.selectors, *gate.args]
    proc = subprocess.run(argv, cwd=tree, env=child_env(env), capture_output=True, text=True, timeout=gate.timeout_s,
                          stdin=subprocess.DEVNULL)
    return proc, frozenset(m.group(1) for line in proc.stdout.splitlines() if (m := _COLLECTED_ID.match(line.strip())))


def judge_ini(repo: Path, base: str) -> str:
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


def _pytest_argv(ctx: Context, tree: Path, holder: Path) -> list[str]:
    """pytest as the judge configures it: its own ini (from the base's markers), no plugin but the
    ones it names, rootdir and conftest search fixed to the checkout, no cache."""
    if ctx.pytest_ini is None:
        ctx.pytest_ini = judge_ini(ctx.repo, ctx.base)
    ini = holder / f"{secrets.token_hex(6)}.ini"
    if not ini.exists():
        ini.write_text(ctx.pytest_ini, encoding="utf-8")
    plugins = ["-p", "pytest_timeout"] if _has_module("pytest_timeout") else []
    return [sys.executable, "-m", "pytest", "-c", str(ini), f"--rootdir={tree}", f"--confcutdir={tree}",
            "-p", "no:cacheprovider", *plugins, "--strict-markers"]


def _pytest_run(name: str, targets: list[str], args: list[str], judging: Judging, timeout_s: float,
                ignore: tuple[str, ...] = (), files: int | None = None,
                barrier: bool = True) -> tuple[Any, list[tuple[str, str, str]] | None, list[str]]:
    """One sandboxed pytest process: (job result, its tests as (node id, status, message) or None when the
    run cannot be read, problems). With `barrier` (the acceptance tests) the process never imports candidate
    code (harness/judge/barrier.py): the tests run it in children that hand back data. Outcomes come from the
    judge's plugin on the judge's pipe, signed with a token only that plugin holds (harness/judge/pytest_report.py),
    never from a file the process wrote; the judge's canary tests run in the same process and must come out as
    written (harness/judge/canary.py)."""
    ctx = judging.ctx
    scratch = neutral(judging.holder)
    token = secrets.token_hex(16)
    token_file = scratch / "token"
    token_file.write_text(token, encoding="utf-8")
    canaries = write_canaries(neutral(judging.holder))
    log = judging.log_dir / f"{name}.log"
    fence = []
    if barrier:
        def is_candidate(rel: str) -> bool:
            return rel in judging.policy.changed or ctx.milestone.is_editable(rel)
        fence = [f"{BARRIER}={write_barrier(neutral(judging.holder) / 'barrier.json', judging.tree, judging.expected, is_candidate)}"]
    # The tests' tmp_path root in the run's own folder: gone with the judging, never shared with another one.
    argv = [*_pytest_argv(ctx, judging.tree, judging.holder), "-p", "harness.judge.pytest_report", *fence,
            f"{OPTION}={token_file}", f"{CANARIES}={canaries.path}", f"--basetemp={scratch / 'tmp'}", *targets, str(canaries.path), *args, "-q", "-rfE",
            *(f"--ignore={judging.tree / p}" for p in ignore)]
    # The checkout's code first; then the judge's own, for its plugin (a checkout need not hold harness/).
    path = judging.env_overrides["PYTHONPATH"] + os.pathsep + str(JUDGE_ROOT)
    shown = TestFileProgress(token, is_canary=canaries.is_canary, files=files,
                             show=lambda text, done, total: ctx.progress.live("tests", text, done, total))
    spec = JobSpec(name=f"{judging.label}-{name}", argv=argv, cwd=judging.tree, log_path=log, timeout_s=timeout_s,
                   env={**judging.env_overrides, **judging.caches(scratch), "PYTHONPATH": path}, kill_grace_s=5.0,
                   on_line=shown, **judging.sandbox(writable=(scratch,)))
    ctx.logs[spec.name] = log
    result = launch(spec).wait(poll_s=0.2)
    reports = parse_reports(read_text(log), token)
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
                      if (rel := _candidate_code(path, judging)) is not None), None)
        if where is not None:
            problems.append(f"{test.node}: skipped from the candidate's code ({where}: {test.message}); only a test "
                            "may skip itself")
    cases = None if result.state == "timeout" else \
        [(t.node, t.status, t.message) for t in reports.tests.values() if not canaries.is_canary(t.node)]
    if cases is not None:
        _append_counts(log, cases, len(canaries.expected))
    return result, cases, problems


def _candidate_code(path: str, judging: Judging) -> str | None:
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
    return rel if judging.milestone.is_editable(rel) or rel in judging.policy.changed else None


def _new_tests(gate: PytestGate, judging: Judging) -> GateResult | None:
    """The candidate's own new test files, in a pytest process of their own (so nothing they do at import
    reaches the acceptance tests); a failure rejects, a pass counts toward nothing."""
    result, cases, problems = _pytest_run(f"{gate.name}-new-tests", list(judging.policy.new_tests),
                                          list(gate.args), judging, gate.timeout_s, barrier=False)
    log_tail = _pytest_tail(result.read_log())
    failing = [(node, message) for node, status, message in cases or [] if status in ("failed", "error")]
    if result.state == "timeout" or cases is None or failing or problems:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, log_tail=log_tail,
                          failing_tests=tuple(node for node, _ in failing),
                          violations=tuple([*problems, *(f"{node}: {message}" for node, message in failing if message)]),
                          summary=f"the candidate's new test file(s) fail on their own: "
                                  f"{len(failing)} failing, pytest exit {result.exit_code} ({result.state})")
    return None


def _pytest_tail(text: str) -> str:
    """The tail of a pytest log as a reader wants it: without the judge's report lines."""
    return tail("\n".join(line for line in text.splitlines() if line and not line.startswith(PREFIX)))


def _append_counts(log: Path, cases: list[tuple[str, str, str]], canaries: int) -> None:
    """End a pytest log with the judge's own count of the tests it judges: pytest's summary line above also
    counts the judge's canary tests, one of which fails by design, and a reader must not take that for theirs."""
    with log.open("a", encoding="utf-8") as f:
        f.write(f"[judge] the tests judged: {count_text(s for _, s, _ in cases)} (pytest's counts above include the judge's {canaries} canary tests, "
                "one of which fails by design)\n")


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
