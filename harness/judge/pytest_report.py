"""The judge's pytest plugin: every test report goes to the judge's own pipe, signed with a secret of the judging.

The pytest a gate runs imports candidate code (the engine, its new test files), so anything that process writes
is within the candidate's reach: a junit file it can rewrite at exit (then `os._exit(0)`), an exit code it can
choose. What the judge reads instead is this plugin's lines on the job's stdout, the pipe the judge owns:

    -p harness.judge.pytest_report --judge-token-file=PATH --judge-canaries=CANARY_FILE [--judge-barrier=FILE]

At import, before pytest loads any conftest or test module (so before any candidate code), the plugin reads the
token from PATH and deletes the file, and takes its own copy of stdout. Each test phase's report then goes out as
one line, `[PYTEST <token>] {json}`, in one write(2): whole on the pipe, and unforgeable without the token, which
from then on lives only in this module (reaching it means reading the process's memory, which the engine's
`isolation` guard forbids). The judge (`parse_reports`) refuses lines that mention the prefix without the token,
a phase reported twice, and a session without its end.

With `--judge-barrier` (every acceptance run) the plugin also puts the judge's import barrier in place before any
conftest or test module loads (harness/judge/barrier.py): no candidate module is ever imported into this process,
so nothing can alter a report object before it is made; tests run candidate code in a child that hands back data
(harness/judge/candidate.py). The canaries below stay as a second layer, and the only layer for the candidate's
own new test files, which import the engine in a pytest process of their own (their passes count for nothing). The canaries run whatever a milestone's pytest arguments select (`-k gemm_fc1`,
`-m "not slow"`): the plugin puts back any canary that a selection took out of the collected items.
"""

import json
import os
import sys
from dataclasses import dataclass, field

import pytest

from harness.judge.barrier import BARRIER_OPTION as BARRIER, install_from_file

__all__ = ["OPTION", "CANARIES", "PREFIX", "TestOutcome", "Reports", "parse_reports", "signed_prefix", "outcome_of", "pytest_addoption",
           "pytest_collection_modifyitems", "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_collectreport",
           "pytest_sessionfinish"]

OPTION = "--judge-token-file"
CANARIES = "--judge-canaries"
PREFIX = "[PYTEST"
_STATE: dict[str, object] = {}
_RAISED: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (node id, phase) -> frames a skip was raised through


def _take_token() -> None:
    """Read and delete the token file named on the command line; keep a copy of stdout. Runs at import."""
    barrier = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(BARRIER + "=")), None)
    if barrier is not None:
        install_from_file(barrier)
    path = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(OPTION + "=")), None)
    if path is None:
        return  # imported by the judge itself (parse_reports), or to collect the base's tests
    with open(path, encoding="utf-8") as fh:
        _STATE["token"] = fh.read().strip()
    os.unlink(path)
    _STATE["fd"] = os.dup(1)
    canaries = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(CANARIES + "=")), None)
    if canaries is not None:
        _STATE["canaries"] = os.path.realpath(canaries)


def _emit(payload: dict[str, object]) -> None:
    line = f"\n{signed_prefix(str(_STATE['token']))}{json.dumps(payload, separators=(',', ':'))}\n"
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(int(_STATE["fd"]), line.encode("utf-8", "replace"))  # type: ignore[call-overload]


def pytest_addoption(parser) -> None:  # noqa: ANN001 -- pytest's Parser
    parser.addoption(OPTION, default="", help="the judge's token file (read and deleted at start)")
    parser.addoption(CANARIES, default="", help="the judge's canary test file: its tests run whatever -k / -m select")
    parser.addoption(BARRIER, default="", help="the judge's import barrier (harness/judge/barrier.py), set at start")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_collection_modifyitems(session, config, items):  # noqa: ANN001, ANN201 -- pytest's Session, Config, items
    """Outermost around every selection (-k, -m, a conftest's own): the canaries that were collected stay."""
    path = _STATE.get("canaries")
    canaries = [item for item in items if path and os.path.realpath(str(item.path)) == path]
    yield
    kept = {id(item) for item in items}
    items.extend(item for item in canaries if id(item) not in kept)


def _where_and_message(report) -> tuple[str, int, str]:  # noqa: ANN001 -- pytest's TestReport
    """(path, line, first message line) of a report's longrepr: a skip's location, a failure's crash site."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[0]), int(longrepr[1] or 0), str(longrepr[2]).strip().splitlines()[0] if longrepr[2] else ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        message = (crash.message or "").strip().splitlines()
        return str(crash.path), int(crash.lineno or 0), message[0] if message else ""
    text = str(longrepr or "").strip().splitlines()
    return "", 0, text[0] if text else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201 -- pytest's Item and CallInfo
    """Every frame the phase's exception went through, taken before any plugin converts it (pytest turns a
    `unittest.SkipTest` into a skip raised from its own code): a skip that came out of candidate code is named."""
    frames = []
    tb = call.excinfo.tb if call.excinfo is not None else None
    while tb is not None and len(frames) < 64:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    outcome = yield
    report = outcome.get_result()
    if frames and report.skipped:
        _RAISED[(report.nodeid, report.when)] = frames


def pytest_runtest_logreport(report) -> None:  # noqa: ANN001 -- pytest's TestReport
    if "token" not in _STATE:
        return
    path, line, message = _where_and_message(report) if report.outcome != "passed" else ("", 0, "")
    _emit({"id": report.nodeid, "when": report.when, "outcome": report.outcome, "path": path, "line": line,
           "message": message[:300], "xfail": bool(getattr(report, "wasxfail", "")),
           "through": _RAISED.pop((report.nodeid, report.when), [])})


def pytest_collectreport(report) -> None:  # noqa: ANN001 -- pytest's CollectReport
    """A module that fails to collect (an import error): reported as an error of its node, like junit did."""
    if "token" not in _STATE or not report.failed:
        return
    path, line, message = _where_and_message(report)
    _emit({"id": report.nodeid or "(collection)", "when": "collect", "outcome": "failed", "path": path, "line": line,
           "message": message[:300], "xfail": False, "through": []})


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001 -- pytest's Session
    if "token" in _STATE:
        _emit({"finished": int(exitstatus)})


_take_token()


# ---------------------------------------------------------------- the judge's side


@dataclass(frozen=True)
class TestOutcome:
    """One test by its phases: passed | failed | error | skipped, and where a skip or failure was raised."""

    node: str
    status: str
    message: str = ""
    path: str = ""  # absolute, as pytest reports it ("" for a pass)
    line: int = 0
    through: tuple[tuple[str, int], ...] = ()  # a skip: every frame its exception went through (absolute paths)
    phase: str = ""  # the phase that decided it: collect | setup | call | teardown


@dataclass(frozen=True)
class Reports:
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    finished: int | None = None  # pytest's exit status, from its session end
    problems: tuple[str, ...] = ()  # forged or repeated lines: the run's results cannot be trusted


def signed_prefix(token: str) -> str:
    """How every line the plugin writes with this token starts."""
    return f"{PREFIX} {token}] "


def parse_reports(text: str, token: str) -> Reports:
    """The plugin's lines in a log taken from the judge's pipe; anything else mentioning the prefix is forged."""
    mine = signed_prefix(token)
    phases: dict[str, dict[str, dict]] = {}
    problems: list[str] = []
    finished = None
    for number, line in enumerate(text.splitlines(), start=1):
        if PREFIX not in line:
            continue
        if not line.startswith(mine):
            problems.append(f"log line {number} imitates the judge's test reports without its token: {line[:160]!r}")
            continue
        try:
            payload = json.loads(line[len(mine):])
        except ValueError:
            problems.append(f"log line {number}: a test report that is not JSON")
            continue
        if "finished" in payload:
            if finished is not None:
                problems.append(f"log line {number}: a second end of the session")
            finished = int(payload["finished"])
            continue
        node, when = str(payload["id"]), str(payload["when"])
        if when in phases.setdefault(node, {}):
            problems.append(f"log line {number}: {node} reported its {when} twice")
        phases[node][when] = payload
    tests = {node: outcome_of(node, reported) for node, reported in phases.items()}
    return Reports(tests=tests, finished=finished, problems=tuple(problems))


def outcome_of(node: str, phases: dict[str, dict]) -> TestOutcome:
    """One test's status from its reported phases (payloads by `when`): the first phase that failed or skipped decides."""
    for when in ("collect", "setup", "call", "teardown"):
        p = phases.get(when)
        if p is None:
            continue
        where = (p.get("message", ""), p.get("path", ""), int(p.get("line", 0)))
        if p["outcome"] == "failed":
            return TestOutcome(node, "failed" if when == "call" else "error", *where, phase=when)
        if p["outcome"] == "skipped":
            through = tuple((str(f), int(n)) for f, n in p.get("through", []))
            return TestOutcome(node, "skipped", *where, through=through, phase=when)
    if phases.get("call", {}).get("outcome") == "passed":
        return TestOutcome(node, "passed", phase="call")
    return TestOutcome(node, "error", "the test never reported its call (the process stopped in it?)")
