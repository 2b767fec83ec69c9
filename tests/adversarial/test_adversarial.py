"""The adversarial suite: every cheat of cases.py (milestone demo-tiny) and training.py (the training
milestones) is REJECTED by `temper gate MILESTONE --patch` with a reason that names it, and its honest twin
is ACCEPTED by the same milestone.

The judge runs as a real process (`python -m harness gate ...`, PYTHONPATH = the checkout under test)
on a home repository that is a committed copy of this checkout (tracked and untracked, not ignored,
files). Each distinct patch is judged once per session (verdicts cached by the patch's hash: most
twins are the same honest change).

Sandboxing: the suite passes `--unsandboxed` only while the checkout under test has no sandbox
(harness/jobs/sandbox.py absent). The final suite runs sandboxed: once the sandbox is on main, the
flag is dropped and a machine where the sandbox cannot start makes the judge refuse (exit 2), which
fails these tests loudly instead of judging unprotected.

Cost: a rejection before any candidate code runs takes ~10 s (the judge collects the base's tests
first); an accepted demo-tiny patch runs the acceptance tests and a 20-step CPU training job (1-3 min
on 2 cores). The default set is the fast classes; `-m slow` runs the rest and every honest twin.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.settings import data_dir
from tests.adversarial.cases import CASES, GPU_TWINS, HONEST, TWIN_MILESTONES, Case, build_patch, git
from tests.adversarial.training import TRAINING_CASES, TRAINING_TWINS
from tests.adversarial.v3_inprocess import INPROCESS_CASES, PROBE as INPROCESS_PROBE
from tests.adversarial.v3_printed import PRINTED_CASES
from tests.adversarial.v3_recognition import V3_RECOGNITION_CASES
from tests.adversarial.v3_guards import GUARD_CASES_V3
from tests.adversarial.v3_configs import V3_CONFIG_CASES
from tests.judge.op_milestones import write_milestones

__all__: list[str] = []

# One judging can outlast pyproject's per-test timeout (600 s) on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[2]
UNSANDBOXED = not (REPO / "harness" / "jobs" / "sandbox.py").is_file()
TIMEOUT_S = 1500
ALL_CASES = CASES + TRAINING_CASES + INPROCESS_CASES + PRINTED_CASES + V3_RECOGNITION_CASES + GUARD_CASES_V3 + V3_CONFIG_CASES
TWIN_EDITS = {**HONEST, **TRAINING_TWINS}
# perf with a goal every honest engine meets: perf's own jobs and checks, so that the GPU cheats' honest twin
# can be accepted while perf's MFU bar is an open goal (main measures 42.9 % of 45 %).
PROBES = {"perf-probe": ("perf", "value = 0.45", "value = 0.0"), INPROCESS_PROBE[0]: INPROCESS_PROBE[1]}


@dataclass(frozen=True)
class Judged:
    rc: int
    accepted: bool
    text: str  # reason, failed gate's summary, violations, log tail (or stdout + stderr when no JSON)
    raw: str
    left_behind: tuple[str, ...] = ()  # what the judging left in its own TMPDIR (removed after the call)


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed copy of the checkout under test: what `temper gate` judges against (TEMPER_HOME)."""
    root = tmp_path_factory.mktemp("adversarial") / "home"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True)
    for rel in filter(None, listed.stdout.decode("utf-8", "surrogateescape").split("\0")):
        source = REPO / rel
        if rel.startswith("runs/") or not (source.is_file() or source.is_symlink()):
            continue
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    for probe, (source, old, new) in PROBES.items():
        text = (root / "milestones" / f"{source}.toml").read_text(encoding="utf-8")
        assert old in text, f"milestones/{source}.toml changed: {old!r} is gone"
        (root / "milestones" / f"{probe}.toml").write_text(text.replace(f'id = "{source}"', f'id = "{probe}"').replace(old, new),
                                                          encoding="utf-8")
    write_milestones(root)  # the op milestones the op cases are judged against (CPU- and GPU-sized)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return root


class Judge:
    """`temper gate` on a patch, once per distinct patch text."""

    def __init__(self, home: Path, workdir: Path):
        self.home, self.workdir = home, workdir
        self.cache: dict[str, Judged] = {}
        self.patches: dict[tuple, str] = {}

    def patch_for(self, key: tuple, edit, **kw) -> str:  # noqa: ANN001
        if key not in self.patches:
            self.patches[key] = build_patch(self.home, self.workdir / "clones", edit, **kw)
        return self.patches[key]

    def __call__(self, patch: str, milestone: str = "demo-tiny") -> Judged:
        digest = hashlib.sha256((milestone + "\0" + patch).encode("utf-8", "surrogateescape")).hexdigest()
        if digest in self.cache:
            return self.cache[digest]
        path = self.workdir / f"{digest[:16]}.patch"
        path.write_bytes(patch.encode("utf-8", "surrogateescape"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "TEMPER_RUNS_DIR", "PYTEST_ADDOPTS")
               and not k.startswith("TEMPER_JUDGE")}
        # The judge keeps what PYTHONPATH already holds after the checkout (kernel and harness wheels unpacked outside
        # site-packages, as on the device machine).
        env.update(TEMPER_HOME=str(self.home), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
                   NO_COLOR="1", TEMPER_DATA=str(data_dir(REPO)))
        # Each judging gets a TMPDIR of its own, emptied after it: a leak is seen, and never fills the disk.
        tmp = self.workdir / "tmp" / digest[:16]
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmp)
        argv = [sys.executable, "-m", "harness", "gate", milestone, "--patch", str(path), "--json"]
        if UNSANDBOXED:
            argv.append("--unsandboxed")
        try:
            proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
            left_behind = tuple(sorted(p.name for p in tmp.iterdir()))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        raw = proc.stdout + "\n" + proc.stderr
        try:
            verdict = json.loads(proc.stdout)
        except ValueError:
            verdict = None
        if verdict is None:
            judged = Judged(rc=proc.returncode, accepted=False, text=raw, raw=raw, left_behind=left_behind)
        else:
            parts = [verdict.get("reason", "")]
            for gate in verdict.get("gates", []):
                if not gate.get("passed") and not gate.get("skipped"):
                    parts += [gate.get("summary", ""), *gate.get("violations", []), *gate.get("failing_tests", []),
                              gate.get("log_tail", "")]
            judged = Judged(rc=proc.returncode, accepted=bool(verdict.get("accepted")) and proc.returncode == 0,
                            text="\n".join(parts), raw=raw, left_behind=left_behind)
        self.cache[digest] = judged
        return judged


@pytest.fixture(scope="session")
def judge(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Judge:
    return Judge(home, tmp_path_factory.mktemp("judging"))


def _marks(case: Case) -> list:
    return [*([pytest.mark.slow] if case.slow else []), *([pytest.mark.gpu] if case.gpu else [])]


def _setup(home: Path, milestone: str) -> str | None:
    """The milestone's setup patch (a path inside a clone of the home), which its judged base has committed."""
    spec = home / "milestones" / f"{milestone}.toml"
    return tomllib.loads(spec.read_text(encoding="utf-8")).get("setup")


def _needs_data(milestone: str) -> None:
    if milestone == "long-horizon" and not data_dir(REPO).is_dir():
        pytest.skip(f"{data_dir(REPO)} is absent: set TEMPER_DATA to the shared data folder")


# Cheapest first: refusals before candidate code, then the cases that run the acceptance tests or the job.
_ORDER = sorted(ALL_CASES, key=lambda c: c.runs_code)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c)) for c in _ORDER])
def test_cheat_is_rejected_naming_it(case: Case, judge: Judge) -> None:
    _needs_data(case.milestone)
    patch = judge.patch_for(("cheat", case.id), case.cheat, diff_args=case.diff_args, dialect=case.dialect,
                            setup=_setup(judge.home, case.milestone))
    verdict = judge(patch, case.milestone)
    assert verdict.rc != 3, f"the judge says this machine cannot judge {case.milestone}: {verdict.raw[-2000:]}"
    assert not verdict.accepted, f"{case.id} ({case.cls}) was ACCEPTED: {case.note or case.cls}\n{verdict.raw[-4000:]}"
    assert verdict.rc in (1, 2), f"unexpected exit {verdict.rc}: {verdict.raw[-3000:]}"
    assert re.search(case.reason, verdict.text, re.IGNORECASE | re.DOTALL), (
        f"{case.id} ({case.cls}) was rejected, but not for its cheat (expected /{case.reason}/):\n{verdict.text[-4000:]}")


# One twin test per distinct honest change and milestone (the twin of many cases); the cheat's own twin id is in
# the case. The twins of cases.py are judged by their TWIN_MILESTONES (demo-tiny unless named): demo-tiny's GPU
# case (under-reported-time-s, judged on perf) has its twin judged on demo-tiny.
TWINS = sorted({(c.twin, TWIN_MILESTONES.get(c.twin, "demo-tiny") if c.twin in HONEST else c.milestone) for c in ALL_CASES})
_GPU_MILESTONES = {c.milestone for c in ALL_CASES if c.gpu and c.twin not in HONEST}


def _twin_marks(twin: str, milestone: str) -> list:
    # Every twin runs the acceptance tests and the jobs (honest@demo-tiny: ~210 s on 2 cores), so all are slow. An honest
    # change is accepted end to end by default in tests/loop/test_demo.py (a recorded agent's repair, judged on drawn
    # configurations with exact steps) and tests/loop/test_loop_gates.py (`temper gate` on patches).
    return [pytest.mark.slow, *([pytest.mark.gpu] if twin in GPU_TWINS or milestone in _GPU_MILESTONES else [])]


@pytest.mark.parametrize("twin,milestone", [pytest.param(t, m, id=f"{t}@{m}", marks=_twin_marks(t, m)) for t, m in TWINS])
def test_honest_twin_is_accepted(twin: str, milestone: str, judge: Judge) -> None:
    _needs_data(milestone)
    patch = judge.patch_for(("twin", twin, milestone), TWIN_EDITS[twin], setup=_setup(judge.home, milestone))
    verdict = judge(patch, milestone)
    assert verdict.rc != 3, verdict.raw[-2000:]
    assert verdict.accepted and verdict.rc == 0, f"honest twin {twin!r} was REJECTED by {milestone}:\n{verdict.text[-4000:]}"
    # The judge removes every temp folder it made (checkouts, the checkpoints it keeps to verify steps).
    assert not verdict.left_behind, f"judging {twin!r} on {milestone} left temp folders behind: {verdict.left_behind}"


def test_every_class_has_a_fast_case_or_needs_candidate_code() -> None:
    """The default set covers every class refused before candidate code runs (see README.md)."""
    fast_classes = {c.cls.split(":")[0] for c in ALL_CASES if not c.slow}
    assert {"outside-editable", "binary", "symlink", "protected-rename", "tests", "guards"} <= fast_classes
    assert len(CASES) >= 30
    assert {t for t, _ in TWINS} <= set(TWIN_EDITS)
    assert len({c.id for c in ALL_CASES}) == len(ALL_CASES), "duplicate case ids"
    assert all(c.slow for c in TRAINING_CASES), "a training case runs jobs: slow"
