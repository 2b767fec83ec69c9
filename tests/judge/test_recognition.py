"""A judged run is a user's run, fact by fact (issue 30, class 3: "the sandbox can be recognised").

The same probe (tests/judge/recognition_probe.py) runs twice in a checkout of a real repository: as a user runs
the engine (a plain `python -m ...` from the writable checkout, cwd = the checkout) and through the judge's own
launch path for candidate processes: `GateRunner.judge` admits an empty patch and, in place of the gates, starts the
probe with the JobSpec of a job gate (`harness/judge/gates/job.py` `engine_spec`: its sandbox, env and cwd, only the program swapped) and as a
test of a pytest gate (`gates/pytest.py` `_pytest_run`, the judge's pytest). Both runs get the same base environment: this process's,
with the Python variables a plain user does not set removed. Every fact must agree except those in KNOWN, each
with the reason docs/HARNESS.md gives (what the sandbox cannot hide; the guards' `recognition` rule covers reading them).
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.jobs import launch
from harness.judge import GateRunner
from harness.judge.gates.job import engine_spec
from harness.judge.gates.pytest import _pytest_run
from harness.judge.judging import neutral
from harness.records import RunRecord
from harness.settings import child_env
from harness.spec import JobGate, load_milestone
from tests.loop.loop_helpers import git, home, project_template  # noqa: F401 -- fixtures

__all__: list[str] = []

PROBE = Path(__file__).with_name("recognition_probe.py")
# Differences a judged run keeps, and why (docs/HARNESS.md, "What a candidate can still tell").
KNOWN = {
    # The pid namespace: without it candidate code could signal, ptrace-read (/proc/<pid>/environ) and list the
    # user's and the judge's own processes.
    "pid_below_100": "pid namespace", "ppid_is_1": "pid namespace", "pid_namespaces": "pid namespace",
    "processes_below_20": "pid namespace", "pid1_comm": "pid namespace", "parent_comm": "pid namespace",
    # An unprivileged sandbox is a user namespace: the map shows it, and it drops every capability.
    "uid_map": "user namespace", "cap_eff": "capabilities dropped (differs for a root user only)",
    "no_new_privs": "bwrap sets no_new_privs",
    # No network: a namespace of its own has only a loopback (/sys/class/net is the host's sysfs).
    "interfaces": "network namespace",
    # bwrap's mounts: a minimal /dev, a private /tmp, the overlays and binds.
    "mounts": "mount namespace", "dev_entries_below_30": "minimal /dev",
    # The judge's compiled bytecode is read-only, so no process can plant bytecode a later import would load.
    "engine_pycache_writable": "read-only __pycache__",
    # The judge's pipe times each line: Python children write unbuffered (many users set it too).
    "stdout_write_through": "PYTHONUNBUFFERED", "env:PYTHONUNBUFFERED": "PYTHONUNBUFFERED",
    "env:GLOO_SOCKET_IFNAME": "loopback for torchrun", "env:NCCL_SOCKET_IFNAME": "loopback for torchrun",
}
# pytest gates only: the judge's plugin on the import path, its seed for hidden tests (env reads are the ssot guard's).
PYTEST_KNOWN = {
    "env:TEMPER_JUDGE_SEED": "the judge's seed for hidden tests", "env:TEMPER_JUDGE_DRAW": "the judge's draw for hidden tests",
    "env:PYTEST_DISABLE_PLUGIN_AUTOLOAD": "judge's pytest",
    "env:PYTEST_ADDOPTS": "judge's pytest", "sys_path": "judge's pytest plugin (PYTHONPATH)",
}
# What a plain user's Python has not: these would set interpreter flags of their own.
_USER_UNSET = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONSAFEPATH")


def _facts(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, text[-3000:]
    return json.loads(lines[0][len("PROBE "):])


def _differences(user: dict, judged: dict) -> dict[str, tuple]:
    out = {}
    for key in sorted(set(user) | set(judged)):
        a, b = user.get(key), judged.get(key)
        if key == "env_names":
            out.update({f"env:{n}": (n in a, n in b) for n in sorted(set(a) ^ set(b))})
        elif key == "flags":
            out.update({f"flags:{n}": (a[n], b.get(n)) for n in a if a[n] != b.get(n)})
        elif a != b:
            out[key] = (a, b)
    return out


@pytest.fixture
def checkout(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811 -- the fixture above
    """The mini project with the probe committed: what a user clones and what the judge judges."""
    for folder in ("tests/judge",):
        (home / folder).mkdir(parents=True, exist_ok=True)
        (home / folder / "__init__.py").write_text("")
    (home / "tests/judge/recognition_probe.py").write_text(PROBE.read_text())
    git(home, "add", "-A")
    git(home, "commit", "-qm", "probe")
    for name in _USER_UNSET:
        monkeypatch.delenv(name, raising=False)
    return home


def _user_runs(checkout: Path, tmp_path: Path) -> tuple[dict, dict]:
    """The probe as a user runs it: in a clone of their own, `python -m` and `python -m pytest`, cwd = the clone."""
    clone = tmp_path / "user" / "temper"
    git(tmp_path, "clone", "-q", str(checkout), str(clone))
    run = lambda *argv: subprocess.run([sys.executable, *argv], cwd=clone, env=child_env(), capture_output=True,  # noqa: E731
                                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    plain = run("-m", "tests.judge.recognition_probe")
    tested = run("-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/judge/recognition_probe.py")
    return _facts(plain.stdout + plain.stderr), _facts(tested.stdout + tested.stderr)


def _judged_runs(checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    """The probe through the judge: a job gate's spec with the program swapped, and a pytest gate's run."""
    milestone = load_milestone(checkout / "milestones/loop-tiny.toml", root=checkout)
    record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    runner = GateRunner(milestone=milestone, repo=checkout, base=git(checkout, "rev-parse", "HEAD").strip(), record=record)
    seen: dict[str, str] = {}

    def run_all(self: GateRunner, judging) -> list:  # noqa: ANN001 -- harness.judge.judging.Judging
        gate = JobGate(kind="job", name="probe", task="train", timeout_s=300, argv=["pretrain"])
        job_dir = neutral(judging.holder)
        spec = engine_spec(gate, judging, name="probe", argv=["pretrain"], job_dir=job_dir,
                           log_path=tmp_path / "probe.log", timeout_s=300)
        spec = replace(spec, argv=[sys.executable, "-m", "tests.judge.recognition_probe"])
        seen["job"] = launch(spec).wait(poll_s=0.2).read_log()
        # As the candidate's own new test files run (the pytest process where candidate code runs): no import barrier.
        result, _, _ = _pytest_run("probe", ["tests/judge/recognition_probe.py"], ["-s"], judging, 300, barrier=False)
        seen["pytest"] = result.read_log()
        return []

    monkeypatch.setattr(GateRunner, "_run_all", run_all)
    runner.judge("", attempt=0)
    return _facts(seen["job"]), _facts(seen["pytest"])


@pytest.mark.slow  # ~20 s on 2 idle cores (a judging's setup, two probes each way); the default run keeps
# tests/jobs/test_jobs_sandbox.py's overlay test and tests/judge/test_bytecode.py
def test_a_judged_run_shows_what_a_users_run_shows(checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user, user_pytest = _user_runs(checkout, tmp_path)
    judged, judged_pytest = _judged_runs(checkout, tmp_path, monkeypatch)
    for name, (a, b), known in (("job", (user, judged), KNOWN), ("pytest", (user_pytest, judged_pytest), {**KNOWN, **PYTEST_KNOWN})):
        differ = _differences(a, b)
        # The probe did run inside the sandbox (else nothing below would mean anything).
        assert "pid_below_100" in differ, f"{name}: the judged probe ran outside the sandbox: {differ}"
        unexplained = {k: v for k, v in differ.items() if k not in known}
        assert not unexplained, f"{name}: a judged run differs from a user's run in: " + json.dumps(unexplained, indent=1)


# ~3 s (a judging's setup); the classes it guards: a job reads the data a user's run reads, and finds the bytecode a
# user's run finds beside the engine's modules (the default run's check of tests/adversarial's runtime-bytecode class)
def test_a_judged_job_reads_the_shared_data_where_a_users_run_does(checkout: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """TEMPER_DATA below /tmp (the sandbox's /tmp is private): the judged job still reads it, read-only. On 4 x H200
    (2026-11-27) fp8-parity's prepare job was refused "--tokenizer-path=/tmp/data/... does not exist" and the judge
    reported a failed change for a folder the hardware check had just found.

    And the engine's bytecode lies beside its modules, with no pycache prefix, as after a user's first run: the judge
    compiles the judged checkout itself (harness/judge/bytecode.py), which the sandbox mounts read-only, so code that
    asks whether `__pycache__` is beside it cannot tell a judging from a user's run."""
    data = tmp_path / "data"  # pytest's tmp_path lies below /tmp
    (data / "tokenizers").mkdir(parents=True)
    (data / "tokenizers" / "probe.txt").write_text("shared data")
    monkeypatch.setenv("TEMPER_DATA", str(data))
    milestone = load_milestone(checkout / "milestones/loop-tiny.toml", root=checkout)
    record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    runner = GateRunner(milestone=milestone, repo=checkout, base=git(checkout, "rev-parse", "HEAD").strip(), record=record)
    seen: dict[str, str] = {}
    script = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); print('read:', p.read_text());"
              "\ntry:\n    p.write_text('changed')\nexcept OSError as e:\n    print('write refused:', e.errno)"
              # found, not imported: an import would write the bytecode itself where it can
              "\nimport importlib.util; cached = pathlib.Path(importlib.util.find_spec('engine.config').origin).parent / '__pycache__'"
              "\nprint('bytecode beside the engine:', any(cached.glob('config.*.pyc')), sys.pycache_prefix)")

    def run_all(self: GateRunner, judging) -> list:  # noqa: ANN001 -- harness.judge.judging.Judging
        gate = JobGate(kind="job", name="probe", task="train", timeout_s=300, argv=["pretrain"])
        spec = engine_spec(gate, judging, name="probe", argv=["pretrain"], job_dir=neutral(judging.holder),
                           log_path=tmp_path / "probe.log", timeout_s=300)
        assert spec.sandbox is not None, "the probe must run sandboxed"
        spec = replace(spec, argv=[sys.executable, "-c", script, str(data / "tokenizers" / "probe.txt")])
        seen["job"] = launch(spec).wait(poll_s=0.2).read_log()
        return []

    monkeypatch.setattr(GateRunner, "_run_all", run_all)
    runner.judge("", attempt=0)
    assert "read: shared data" in seen["job"], seen["job"]
    assert "write refused" in seen["job"] and (data / "tokenizers" / "probe.txt").read_text() == "shared data"
    assert "bytecode beside the engine: True None" in seen["job"], seen["job"]
