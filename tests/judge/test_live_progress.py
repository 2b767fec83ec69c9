"""Progress while the judge waits (harness/judge/live.py, harness/progress.py): a line per test file of a pytest
gate and a line per training step, read from the lines that reach the judge's pipe, never from anything else.

Real processes through the harness's launcher: a pytest with the judge's plugin and canaries, a job printing the
engine's wire format. The views are display only; what they must not do is show what the judge would not count
(an unsigned report line a test prints, the judge's canaries, a malformed [LOSS] line).
"""

import io
import secrets
import sys
import threading
from pathlib import Path

from harness.jobs import JobSpec, launch
from harness.judge.canary import write_canaries
from harness.judge.live import StepProgress, TestFileProgress
from harness.judge.pytest_report import OPTION, PREFIX, parse_reports
from harness.progress import Progress

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]


def _collector() -> tuple[list[tuple[str, int | None, int | None]], object]:
    shown: list[tuple[str, int | None, int | None]] = []
    lock = threading.Lock()

    def show(text: str, done: int | None, total: int | None) -> None:
        with lock:
            shown.append((text, done, total))
    return shown, show


def test_a_line_per_test_file_from_the_signed_reports_only(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import pytest\n\ndef test_one():\n    pass\n\ndef test_two():\n    assert 1 == 2\n\n"
        "def test_three():\n    pytest.skip('not here')\n")
    # A test that prints a report line of its own (no token): neither the verdict nor the view may count it.
    (tests / "test_b.py").write_text(
        f"def test_forges():\n    print('\\n{PREFIX} ' + '0' * 32 + '] {{\"finished\": 0}}', flush=True)\n")
    (tmp_path / "canaries").mkdir()
    canaries = write_canaries(tmp_path / "canaries")
    token = secrets.token_hex(16)
    (tmp_path / "token").write_text(token)
    shown, show = _collector()
    view = TestFileProgress(token, is_canary=canaries.is_canary, show=show, files=2)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.judge.pytest_report",
            f"{OPTION}={tmp_path / 'token'}", "-q", "-s", f"--rootdir={tmp_path}", "tests", str(canaries.path)]
    spec = JobSpec(name="pytest-live", argv=argv, cwd=tmp_path, log_path=tmp_path / "log", timeout_s=240,
                   env={"PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, on_line=view)
    result = launch(spec).wait(poll_s=0.1)
    log = result.read_log()
    assert result.exit_code == 1, log  # test_two and the failing canary fail
    assert shown == [("tests/test_a.py: 1 passed, 1 failed, 1 skipped", 1, 2), ("tests/test_b.py: 1 passed", 2, 2)]
    # The view agrees with the judge's own reading of the same log (which names the forged line as a problem).
    reports = parse_reports(log, token)
    assert any("without its token" in p for p in reports.problems)
    judged = {node: t.status for node, t in reports.tests.items() if not canaries.is_canary(node)}
    assert judged == {"tests/test_a.py::test_one": "passed", "tests/test_a.py::test_two": "failed",
                      "tests/test_a.py::test_three": "skipped", "tests/test_b.py::test_forges": "passed"}


def test_a_line_per_training_step_from_the_wire_lines(tmp_path: Path) -> None:
    good = [f"[LOSS] step={s} global_loss={5.0 - s / 10:.9e} grad_norm={1.0:.9e} lr={3e-4:.6e} tokens=256 "
            f"time_s={0.125:.6f} mfu={0.0:.4f}" for s in (1, 2, 3)]
    lines = ["[RUN] temper engine ...", good[0], "[LOSS] step=2 global_loss=4.8", good[1], "junk [LOSS] step=9", good[2]]
    shown, show = _collector()
    spec = JobSpec(name="train-live", argv=[sys.executable, "-c", f"print({chr(10).join(lines)!r})"], cwd=tmp_path,
                   log_path=tmp_path / "log", timeout_s=120, on_line=StepProgress("a2-train", show=show, steps=3))
    assert launch(spec).wait(poll_s=0.1).exit_code == 0
    assert shown == [("a2-train step 1/3 loss 4.9000 0.125 s/step", 1, 3), ("a2-train step 2/3 loss 4.8000 0.125 s/step", 2, 3),
                     ("a2-train step 3/3 loss 4.7000 0.125 s/step", 3, 3)]


def test_live_lines_are_plain_lines_off_a_terminal_and_one_redrawn_line_on_one() -> None:
    plain = io.StringIO()
    progress = Progress(plain, tty=False)
    progress.live("step", "a2-train step 1/20", 1, 20)
    progress.live("step", "a2-train step 2/20", 2, 20)
    progress("gate", "train pass: job exited 0")
    lines = plain.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["step     a2-train step 1/20", "step     a2-train step 2/20",
                                                          "gate     train pass: job exited 0"]
    assert "\r" not in plain.getvalue() and "\033[" not in plain.getvalue()

    terminal = io.StringIO()
    progress = Progress(terminal, tty=True, color=False)
    progress.live("step", "a2-train step 5/20", 5, 20)
    progress.live("step", "a2-train step 10/20", 10, 20)
    progress("gate", "train pass: job exited 0")
    out = terminal.getvalue()
    assert out.count("\n") == 1 and out.endswith("gate     train pass: job exited 0\n")  # the bar gave way to the event
    redraws = out.split("\r\033[K")
    assert redraws[1].endswith("a2-train step 5/20 [######..................] 5/20")
    assert redraws[2].endswith("a2-train step 10/20 [############............] 10/20")
