"""The pytest gate reads outcomes from its own plugin on the judge's pipe, signed with a per-run token, and runs
canary tests beside the acceptance tests (harness/judge/pytest_report.py, harness/judge/canary.py).

Before, the judge read a junit file the tested process wrote, and its exit code: engine code imported by the
tests could rewrite the file at exit and leave with status 0, or patch pytest's report class so failures read
as passes, or raise a skip from inside the engine. Each of those made a broken engine pass the gate; each is
judged here through `temper gate` on the loop tests' mini project (the real engine, one pytest gate).
"""

import json
from pathlib import Path

import pytest

from harness.judge.canary import canary_problems, write_canaries
from harness.judge.pytest_report import PREFIX, parse_reports
from tests.adversarial.cases import ALTER_REPORTS, REWRITE_REPORT_AT_EXIT
from tests.loop.loop_helpers import git, home, project_template, temper  # noqa: F401 -- fixtures

__all__: list[str] = []

TOKEN = "0123456789abcdef0123456789abcdef"


def _line(payload: dict, token: str = TOKEN) -> str:
    return f"{PREFIX} {token}] {json.dumps(payload)}"


def test_reports_are_read_only_with_the_token_and_only_once() -> None:
    ok = [_line({"id": "t.py::a", "when": w, "outcome": o}) for w, o in (("setup", "passed"), ("call", "failed"),
                                                                          ("teardown", "passed"))]
    ok += [_line({"id": "t.py::b", "when": "setup", "outcome": "skipped", "path": "/x/engine/a.py", "line": 3}),
           _line({"id": "t.py::b", "when": "teardown", "outcome": "passed"}), _line({"finished": 1})]
    reports = parse_reports("noise\n" + "\n".join(ok) + "\n", TOKEN)
    assert not reports.problems and reports.finished == 1
    assert reports.tests["t.py::a"].status == "failed" and reports.tests["t.py::b"].status == "skipped"
    assert reports.tests["t.py::b"].path == "/x/engine/a.py"
    forged = parse_reports("\n".join([_line({"finished": 0}, token="f" * 32), *ok]), TOKEN)
    assert any("without its token" in p for p in forged.problems)
    glued = parse_reports("progress " + _line({"finished": 0}) + "\n" + "\n".join(ok), TOKEN)
    assert any("without its token" in p for p in glued.problems)
    twice = parse_reports("\n".join([ok[1].replace("failed", "passed"), *ok]), TOKEN)
    assert any("reported its call twice" in p for p in twice.problems)
    uncollected = parse_reports(_line({"id": "t.py", "when": "collect", "outcome": "failed", "message": "ImportError"}), TOKEN)
    assert uncollected.tests["t.py"].status == "error" and uncollected.tests["t.py"].phase == "collect"


def test_canaries_must_come_out_as_written(tmp_path: Path) -> None:
    from harness.judge.pytest_report import TestOutcome

    canaries = write_canaries(tmp_path)
    names = list(canaries.expected)
    honest = {f"::{n}": TestOutcome(f"::{n}", canaries.expected[n]) for n in names}
    assert canary_problems(canaries, honest) == []
    altered = {**honest, f"::{names[1]}": TestOutcome(f"::{names[1]}", "passed")}
    assert "came out passed, it must be failed" in canary_problems(canaries, altered)[0]
    assert len(canary_problems(canaries, {})) == 3


BROKEN = ('LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")', 'LR_SCHEDULES = ("cosine", "wsd", "linear")')
GOOD = ('LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")',
        'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", "inverse_sqrt")')


def _judge(home: Path, tmp_path: Path, edits: dict[str, tuple[str, str] | str | list]) -> dict:
    clone = tmp_path / f"clone-{len(list(tmp_path.glob('clone-*')))}"
    git(tmp_path, "clone", "-q", str(home), str(clone))
    for rel, edit in edits.items():
        path = clone / rel
        for one in edit if isinstance(edit, list) else [edit]:
            text = path.read_text() if path.exists() else ""
            path.write_text(text.replace(*one) if isinstance(one, tuple) else text + one)
    git(clone, "add", "-A")
    patch = clone.with_suffix(".patch")
    patch.write_text(git(clone, "diff", "--cached"))
    proc = temper(home, "gate", "loop-tiny", "--patch", str(patch), "--json", timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _pytest_gate(verdict: dict) -> str:
    gate = next(g for g in verdict["gates"] if g["kind"] == "pytest")
    return gate["summary"] + "\n" + "\n".join(gate["violations"])


@pytest.mark.slow
def test_a_test_process_that_alters_its_outcomes_is_not_believed(home: Path, tmp_path: Path) -> None:
    """The mini project's engine drops `constant` (its test fails) and adds one trick; only the guards gate could
    see some of them (it is left out of loop-tiny's pytest-only judgement here on purpose: this is the runtime
    layer)."""
    milestone = home / "milestones" / "loop-tiny.toml"
    milestone.write_text(milestone.read_text().replace('[[gates]]\nkind = "guards"\npaths = ["engine"]\n\n', ""))
    git(home, "commit", "-qam", "pytest only")
    broken = {"engine/config.py": BROKEN}
    assert not _judge(home, tmp_path, broken)["accepted"]  # the failing test alone

    # The tricks run at engine import, and the judge's test process never imports the engine (the import barrier):
    # they never reach the process that decides, and the failing test fails.
    for trick in (ALTER_REPORTS, REWRITE_REPORT_AT_EXIT):
        verdict = _judge(home, tmp_path, {**broken, "engine/__init__.py": trick})
        gate = _pytest_gate(verdict)
        assert not verdict["accepted"] and "tests failed" in gate and "came out passed" not in gate, gate

    # A test that imports the engine in the judge's process is refused at collection (the barrier names the way out).
    test = home / "tests" / "test_names.py"
    test.write_text(test.read_text() + "\n\nfrom engine import config as engine_config  # at collection, in the judge's process\n\n\n"
                    "def test_checked():\n    assert getattr(engine_config, 'LR_SCHEDULES_CHECKED', True)\n")
    git(home, "commit", "-qam", "a test that imports the engine in the judge's process")
    proc = temper(home, "gate", "loop-tiny", "--json", timeout=600)
    assert proc.returncode == 2 and "do not collect" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow  # ~55 s on 2 cores; canaries that do not come out as written: test_canaries_must_come_out_as_written
def test_the_canaries_run_whatever_the_gate_selects(home: Path, tmp_path: Path) -> None:
    """A gate that selects its tests (`-k`, `-m`, as the op milestones do with `-k gemm_fc1`) deselected the judge's
    canaries too, and then rejected every patch, the honest one included, as a run that "cannot be trusted". Found
    judging op-gemm_fc1 on main on an H200. The canaries must run under any selection, and still catch a process
    that alters its outcomes."""
    milestone = home / "milestones" / "loop-tiny.toml"
    spec = milestone.read_text().replace('[[gates]]\nkind = "guards"\npaths = ["engine"]\n\n', "")  # the runtime layer
    milestone.write_text(spec.replace(
        'selectors = ["tests/test_names.py"]\nmin_collected = 2\n',
        'selectors = ["tests/test_names.py"]\nargs = ["-k", "schedule", "-m", "not slow"]\nmin_collected = 2\n'))
    git(home, "commit", "-qam", "the pytest gate selects by name and marker")
    verdict = _judge(home, tmp_path, {"engine/config.py": GOOD})
    assert verdict["accepted"], _pytest_gate(verdict)
    # The engine's report hook never reaches the judge's test process (the import barrier): the broken test fails.
    verdict = _judge(home, tmp_path, {"engine/config.py": BROKEN, "engine/__init__.py": ALTER_REPORTS})
    gate = _pytest_gate(verdict)
    assert not verdict["accepted"] and "tests failed" in gate and "came out passed" not in gate, gate
