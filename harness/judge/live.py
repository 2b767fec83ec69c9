"""What a person sees while the judge waits: a line per test file of a pytest gate, a line per training step.

Display only. Both views read the lines as they reach the judge's own pipe (the job's `on_line`, called by the
pump that writes the judge's log), the same bytes the verdict is later read from, and nothing a candidate process
writes anywhere else:
- the pytest view counts only the judge plugin's signed reports (harness/judge/pytest_report.py), classified by the
  same rule as the verdict (`outcome_of`), and leaves the judge's canary tests out;
- the training view shows the `[LOSS]` lines the metrics gate will parse (harness/judge/logparse.py).
A line either view cannot read is not shown; the verdict, which reads the whole log afterwards, names it.
"""

import json
from collections import Counter
from collections.abc import Callable, Iterable

from harness.judge.logparse import LogParseError, parse_engine_log
from harness.judge.pytest_report import outcome_of, signed_prefix

__all__ = ["TestFileProgress", "StepProgress", "count_text"]

Show = Callable[[str, int | None, int | None], None]  # (text, done, total)


class TestFileProgress:
    """Feed it every line of a pytest process's output; it shows one line per finished test file:
    `tests/engine/test_config.py: 12 passed, 1 skipped`."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, token: str, *, is_canary: Callable[[str], bool], show: Show, files: int | None = None):
        self._prefix = signed_prefix(token)
        self._is_canary = is_canary
        self._show = show
        self._files = files  # how many test files to expect (the base's), when known
        self._done = 0
        self._file = ""
        self._counts: Counter[str] = Counter()
        self._phases: dict[str, dict[str, dict]] = {}

    def __call__(self, line: str) -> None:
        if not line.startswith(self._prefix):
            return
        try:
            payload = json.loads(line[len(self._prefix):])
        except ValueError:
            return
        if "finished" in payload:
            self._end_file()
            return
        node, when = str(payload.get("id", "")), str(payload.get("when", ""))
        if self._is_canary(node):
            return
        path = node.partition("::")[0]
        if path != self._file:
            self._end_file()
            self._file = path
        phases = self._phases.setdefault(node, {})
        phases[when] = payload
        if when in ("teardown", "collect"):  # a test's last report (a module that did not collect has only this one)
            self._counts[outcome_of(node, self._phases.pop(node)).status] += 1

    def _end_file(self) -> None:
        if not self._file:
            return
        for node, phases in self._phases.items():  # a test that never reported its teardown (the process stopped)
            self._counts[outcome_of(node, phases).status] += 1
        self._done += 1
        self._show(f"{self._file}: {count_text(self._counts.elements())}", self._done, self._files)
        self._file, self._counts, self._phases = "", Counter(), {}


_ORDER = {"passed": 0, "failed": 1, "error": 2, "skipped": 3}


def count_text(statuses: Iterable[str]) -> str:
    """`12 passed, 1 skipped`: test statuses counted in pytest's order ('no tests' for none)."""
    counts = Counter(statuses)
    return ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: _ORDER.get(s, len(_ORDER)))) or "no tests"


class StepProgress:
    """Feed it every line of a training job's output; it shows each `[LOSS]` step:
    `a2-train step 5/20 loss 3.2110 0.25 s/step`."""

    def __init__(self, job: str, *, show: Show, steps: int | None = None):
        self._job = job
        self._show = show
        self._steps = steps

    def __call__(self, line: str) -> None:
        if "[LOSS]" not in line:
            return
        try:
            records = parse_engine_log(line)
        except LogParseError:
            return
        for r in records:
            of = f"/{self._steps}" if self._steps else ""
            loss = f" loss {r.loss:.4f}" if r.loss is not None else ""
            pace = f" {r.time_s:.3g} s/step" if r.time_s is not None else ""
            self._show(f"{self._job} step {r.step}{of}{loss}{pace}", r.step, self._steps)
