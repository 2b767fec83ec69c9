"""The gates: `temper gate` as a real process, the gate runner in-process on a real git repository, and
the metrics gate on job folders written by hand.

References are independent of the judge: verdicts follow from what each patch obviously does, FLOP
counts are written out by hand from the model shape (see the arithmetic in the test), reference
differences are computed by hand from the numbers in the files.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.judge import GateError, GateRunner, judge_metrics, verdict_text
from harness.judge.admit import admit
from harness.judge.draws import PUBLIC_SEED
from harness.judge.judging import JobOutcome
from harness.jobs import JobResult
from harness.records import RunRecord
from harness.spec import JobGate, MetricsGate, load_milestone
from tests.loop.loop_helpers import REPO, events, git, temper, temper_env, tree_fingerprint

__all__: list[str] = []


def unified_diff(home: Path, tmp_path: Path, edit) -> Path:  # noqa: ANN001 -- edit(tree) changes files
    """A `git diff` of `edit` applied to a clone of `home`: the kind of patch a person hands to `temper gate`."""
    clone = tmp_path / f"edit-{len(list(tmp_path.iterdir()))}"
    git(tmp_path, "clone", "-q", str(home), str(clone))
    edit(clone)
    git(clone, "add", "-A")
    patch = clone.with_suffix(".patch")
    patch.write_text(git(clone, "diff", "--cached"))
    return patch


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


OLD = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")'
NEW = 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", "inverse_sqrt")'


def test_temper_gate_judges_patches_and_the_checkout_without_touching_it(home: Path, tmp_path: Path) -> None:
    """A patch is judged (--json: the verdict and where its records are), refusals name what cannot be judged, and
    without --patch the checkout's own uncommitted change is judged in a scratch copy; the checkout is never touched.
    The checkout's change is one the guards reject (it reads the environment), so that a second judging costs no
    acceptance tests: what it proves is that the change judged is the checkout's (the finding is in it)."""
    good = unified_diff(home, tmp_path, lambda t: replace_in(t / "engine/config.py", OLD, NEW))
    before = tree_fingerprint(home)

    proc = temper(home, "gate", "loop-tiny", "--patch", str(good), "--json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["accepted"] and [g["name"] for g in verdict["gates"]] == ["protected", "guards", "pytest"]
    assert all(g["passed"] for g in verdict["gates"])
    # what `temper gate` prints after "ACCEPTED: " (harness.judge.verdict_text), never empty
    assert verdict["reason"] == "every gate passed (protected, guards, pytest)", verdict["reason"]
    assert (Path(verdict["run_dir"]) / "report.html").is_file()
    assert "gate     pytest pass" in proc.stderr  # --json keeps stdout for the verdict; progress stays on stderr

    proc = temper(home, "gate", "loop-tiny", "--patch", str(tmp_path / "missing.patch"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    stale = tmp_path / "stale.patch"
    stale.write_text(good.read_text().replace('"linear")', '"linear", "nope")'))
    proc = temper(home, "gate", "loop-tiny", "--patch", str(stale))
    assert proc.returncode == 2 and "cannot be judged" in proc.stderr and "does not apply" in proc.stderr
    proc = temper(home, "gate", "no-such-milestone")
    assert proc.returncode == 2 and "no milestone 'no-such-milestone'; known: loop-tiny" in proc.stderr
    assert tree_fingerprint(home) == before

    # No --patch: the checkout's own uncommitted change is judged, in a scratch copy.
    replace_in(home / "engine/config.py", OLD, 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", os.environ.get("S", "inverse_sqrt"))')
    replace_in(home / "engine/config.py", "import tomllib\n", "import os\nimport tomllib\n")
    before = tree_fingerprint(home)
    proc = temper(home, "gate", "loop-tiny")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REJECTED: gate guards failed" in proc.stdout and "ssot" in proc.stdout and "[skip] pytest" in proc.stdout
    # The progress line of the failed gate says what it found, not only how many.
    shown = proc.stderr.split("guards FAIL: ", 1)[1].splitlines()
    assert shown[0].startswith("1 finding in engine") and "engine/config.py" in shown[1] and "ssot" in shown[1], proc.stderr
    assert tree_fingerprint(home) == before


def test_a_gate_ended_by_sigterm_removes_its_scratch_worktree(home: Path, tmp_path: Path) -> None:
    """SIGTERM (a timeout, the user's kill) while `temper gate` holds a scratch worktree of the user's repository: the
    same cleanup as Ctrl-C runs, so no worktree stays registered in the repository and no temp folder is left."""
    good = unified_diff(home, tmp_path, lambda t: replace_in(t / "engine/config.py", OLD, NEW))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "gate", "loop-tiny", "--patch", str(good)], cwd=REPO,
                            env=temper_env(home, TMPDIR=str(tmp)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while True:  # until a scratch worktree (a second one, under our TMPDIR) is registered and on disk
            held = [line[len("worktree "):] for line in git(home, "worktree", "list", "--porcelain").splitlines()
                    if line.startswith("worktree ") and line[len("worktree "):].startswith(str(tmp))]
            if any(Path(p).is_dir() for p in held):
                break
            assert proc.poll() is None, f"the gate ended before it held a scratch worktree: {proc.communicate()}"
            assert time.monotonic() < deadline, "no scratch worktree within 240 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert git(home, "worktree", "list", "--porcelain").count("worktree ") == 1, git(home, "worktree", "list")
    assert sorted(p.name for p in tmp.iterdir()) == [], "the gate left temp folders behind"
    assert proc.returncode == 143 and "temper gate: terminated (SIGTERM)" in err, (proc.returncode, out, err)


@pytest.fixture
def runner(home: Path, tmp_path: Path) -> GateRunner:
    milestone = load_milestone(home / "milestones/loop-tiny.toml", root=home)
    record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    return GateRunner(milestone=milestone, repo=home, base=git(home, "rev-parse", "HEAD").strip(), record=record)


@pytest.mark.slow  # ~42 s; a new suppression is refused by default in tests/adversarial (allow-plain) and tests/guards
def test_runner_catches_new_suppressions_and_a_broken_collection(runner: GateRunner, home: Path, tmp_path: Path) -> None:
    # A `# guard: allow` the candidate adds lifts a red line for itself: rejected, though the guard is then silent.
    suppressed = unified_diff(home, tmp_path, lambda t: replace_in(
        t / "engine/config.py", OLD,
        'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear", __import__("os").environ.get("S", "inverse_sqrt"))'
        "  # guard: allow ssot -- experiment"))
    verdict = runner.judge(suppressed.read_text(), attempt=1)
    guards = verdict.gates[1]
    assert verdict.failed_gate is guards
    assert len(guards.violations) == 1 and "engine/config.py:" in guards.violations[0] and "guard suppression" in guards.violations[0]

    # An engine that no longer imports breaks collection: the pytest gate fails on the error (the base's two
    # test ids, collected once before the candidate landed, are not there either).
    broken = unified_diff(home, tmp_path, lambda t: replace_in(t / "engine/config.py", OLD, NEW + "\nraise ImportError('boom')"))
    verdict = runner.judge(broken.read_text(), attempt=2)
    assert verdict.failed_gate is verdict.gates[2] and verdict.gates[0].passed
    assert any("ImportError" in v or "boom" in v for v in verdict.gates[2].violations + (verdict.gates[2].log_tail,))
    assert runner.base_ids["pytest"] == {"tests/test_names.py::test_inverse_sqrt_is_a_schedule",
                                         "tests/test_names.py::test_the_old_schedules_stay"}

    # Failing tests come back as node ids with their assertion.
    missing = unified_diff(home, tmp_path, lambda t: replace_in(t / "engine/config.py", OLD, OLD.replace('"wsd", ', "")))
    verdict = runner.judge(missing.read_text(), attempt=3)
    pytest_gate = verdict.gates[2]
    assert verdict.failed_gate is pytest_gate and pytest_gate.summary == "2 of 2 tests failed"
    assert set(pytest_gate.failing_tests) == {"tests/test_names.py::test_inverse_sqrt_is_a_schedule",
                                              "tests/test_names.py::test_the_old_schedules_stay"}

    # Dry runs (the agent's run_gates tool: public, and loop-tiny holds nothing back) judge the same way and record no attempt.
    verdict = runner.judge(unified_diff(home, tmp_path, lambda t: replace_in(t / "engine/config.py", OLD, NEW)).read_text(),
                           attempt=0, public=True)
    assert verdict.accepted
    assert {e["attempt"] for e in events(runner.record.dir) if e["type"] == "gate_result"} == {1, 2, 3}


# loop-tiny with held-out material: a gate of held-out tests only, and one mixing a held-out file with public ones.
HELD_MILESTONE = """
id = "loop-held"
title = "Held-out tests"
goal = "x"
editable = ["engine/**"]
protected = ["engine/model_spec.toml"]
hidden = "milestones/loop-held/hidden"
[[gates]]
kind = "protected"
[[gates]]
kind = "pytest"
name = "held"
selectors = ["tests/held"]
min_collected = 1
timeout_s = 120
[[gates]]
kind = "pytest"
name = "mixed"
selectors = ["tests/test_tree.py", "tests/held/test_held.py"]
min_collected = 2
timeout_s = 120
[draw]
seed = "large"
[budget]
max_turns = 1
max_tokens = 1
max_wall_s = 60
max_attempts = 1
"""
# A public test that fails wherever held-out material is in the checkout it runs in.
TREE_PROBE = """\
from pathlib import Path


def test_the_checkout_holds_no_held_out_material():
    root = Path(__file__).resolve().parents[1]
    assert not (root / "tests/held").exists() and not (root / "milestones/loop-held/hidden").exists()
"""


@pytest.fixture
def held_runner(home: Path, tmp_path: Path) -> GateRunner:
    """A runner of loop-held, its hidden folder committed as the repository's are (the judge's checkout holds it)."""
    (home / "milestones/loop-held.toml").write_text(HELD_MILESTONE)
    held = home / "milestones/loop-held/hidden/tests/held/test_held.py"
    held.parent.mkdir(parents=True)
    held.write_text('def test_held_out():\n    assert False, "HELD-OUT RAN"\n')
    (home / "tests/test_tree.py").write_text(TREE_PROBE)
    git(home, "add", "-A")
    git(home, "commit", "-q", "-m", "a milestone with held-out tests")
    milestone = load_milestone(home / "milestones/loop-held.toml", root=home)
    record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    return GateRunner(milestone=milestone, repo=home, base=git(home, "rev-parse", "HEAD").strip(), record=record)


def test_a_dry_run_judges_the_public_gates_on_the_public_draw(held_runner: GateRunner, home: Path, tmp_path: Path) -> None:
    """The agent's run_gates (a public judging) never sees held-out material nor a secret draw: its checkout and the
    base's collection hold no held-out file (a judging's checkout holds the overlaid one), a gate of held-out tests is
    skipped and says so, a mixed gate runs its public tests (min_collected, which counts the held-out ones, waived),
    and every dry run draws the same public configuration, never a judging's."""
    runner, milestone = held_runner, held_runner.milestone
    for public, held in ((True, False), (False, True)):
        with admit(milestone, repo=home, base=runner.ctx.base, home=home, diff="", compile_bytecode=False,
                   public=public) as admitted:
            assert (admitted.tree / "tests/held/test_held.py").is_file() == held
            assert not (admitted.tree / "milestones/loop-held/hidden").exists() if public else \
                (admitted.tree / "milestones/loop-held/hidden/tests/held/test_held.py").is_file()
    with pytest.raises(ValueError, match="never an attempt"):
        runner.judge("", attempt=1, public=True)

    dry = runner.judge("", attempt=0, public=True)
    held_gate, mixed = dry.gates[1], dry.gates[2]
    assert held_gate.skipped and held_gate.summary == ("not run: its tests are held out (tests/held); held-out tests run "
                                                       "only when you submit")
    # (its test fails wherever a held-out file is in the checkout it runs in)
    assert mixed.passed and not mixed.skipped and mixed.metrics == {"collected": 1.0, "passed": 1.0, "failed": 0.0}
    assert "held out, not run: tests/held/test_held.py" in mixed.summary
    assert runner.base_ids["mixed (public)"] == {"tests/test_tree.py::test_the_checkout_holds_no_held_out_material"}
    assert dry.accepted and dry.seed == PUBLIC_SEED and dry.draw["public"]
    text = verdict_text(dry)
    assert text.startswith("PASSED: every gate passed (protected, mixed); not run: held (held-out tests run only when you submit)")
    assert f"the public draw (seed {PUBLIC_SEED}, the same at every dry run; what you submit is judged on a secret draw that differs)" in text

    # Another dry run and a judged attempt, both stopped at once by a protected file: the same public draw, then a
    # secret one (its seed from 2**32 .. 2**63 - 1: the public one's with probability < 1e-18).
    protected = unified_diff(home, tmp_path, lambda t: (t / "engine/model_spec.toml").write_text("x\n")).read_text()
    again = runner.judge(protected, attempt=0, public=True)
    assert again.failed_gate is again.gates[0] and again.draw == dry.draw
    assert not any(e["type"] == "gate_result" for e in events(runner.record.dir))  # dry runs record no attempt
    judged = runner.judge(protected, attempt=1)
    assert not judged.draw["public"] and judged.seed != PUBLIC_SEED and judged.draw["values"] != dry.draw["values"]
    assert "drawn (judge seed" in verdict_text(judged) and "public draw" not in verdict_text(judged)


@pytest.mark.slow  # ~35 s on 2 loaded cores (a pytest gate's collection and run); the default run checks the overlay
# in the judged checkout (test_a_dry_run_judges_the_public_gates_on_the_public_draw) and runs the hidden tests of
# demo-tiny (tests/adversarial)
def test_a_submission_runs_the_held_out_tests(held_runner: GateRunner) -> None:
    judged = held_runner.judge("", attempt=1)
    assert held_runner.base_ids["held"] == {"tests/held/test_held.py::test_held_out"}
    assert judged.failed_gate is judged.gates[1] and judged.gates[1].violations == (
        "tests/held/test_held.py::test_held_out: AssertionError: HELD-OUT RAN",)


def one_job_milestone(home: Path, mid: str, title: str, *, timeout_s: int, argv: str, verify: bool = True) -> None:
    """milestones/<mid>.toml: the protected gate, then one train job with `argv` (TOML array items)."""
    (home / f"milestones/{mid}.toml").write_text(f"""
id = "{mid}"
title = "{title}"
goal = "x"
editable = ["engine/**"]
[[gates]]
kind = "protected"
[[gates]]
kind = "job"
name = "train"
task = "train"
timeout_s = {timeout_s}
verify = {str(verify).lower()}
argv = [{argv}]
[budget]
max_turns = 1
max_tokens = 1
max_wall_s = 60
max_attempts = 1
""")


def test_a_hanging_job_is_killed_at_its_timeout(home: Path, tmp_path: Path) -> None:
    one_job_milestone(home, "hang", "A job that cannot finish in time", timeout_s=3, argv=(
        '"pretrain", "--preset", "tiny", "--device", "cpu", "--num-steps", "100000", "--eval-samples", "0", '
        '"--no-save-final", "--run-dir", "{job_dir}"'))
    milestone = load_milestone(home / "milestones/hang.toml", root=home)
    record = RunRecord.create(milestone_id="hang", spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    runner = GateRunner(milestone=milestone, repo=home, base=git(home, "rev-parse", "HEAD").strip(), record=record)
    verdict = runner.judge("", attempt=1)
    job = verdict.gates[1]
    assert not job.passed and "did not finish within 3 s and was killed" in job.summary
    finished = [e for e in events(record.dir) if e["type"] == "job_finished"]
    assert len(finished) == 1 and finished[0]["timed_out"] and finished[0]["job"] == "a1-train"
    started = next(e for e in events(record.dir) if e["type"] == "job_started")
    pid = int(started["job_id"].removeprefix("local-"))
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    assert (record.dir / "jobs/a1-train/log").is_file()


PEEK = '''
def _peek_at_other_runs() -> None:  # a job that looks for other runs' files beside its own folder
    import sys
    from pathlib import Path

    if "--run-dir" in sys.argv:
        own = Path(sys.argv[sys.argv.index("--run-dir") + 1])
        seen = [str(p) for p in own.parent.rglob("metrics.jsonl") if own not in p.parents]
        print(f"[PEEK] {len(seen)} {seen}", flush=True)


_peek_at_other_runs()
'''


@pytest.mark.slow  # ~28 s on 2 cores; the sandbox's job-folder isolation is also checked by test_a_candidate_job_cannot_write_outside_its_own_folder
def test_a_job_sees_only_the_earlier_job_folders_it_names(home: Path, tmp_path: Path) -> None:
    """Two runs of one seed must not be able to replay each other's files: the second job sees the first's
    folder only when its argv names it ({job_dir:first})."""
    train = ('"pretrain", "--preset", "tiny", "--device", "cpu", "--seq-length", "32", "--micro-batch-size", "1", '
             '"--num-steps", "2", "--warmup-steps", "1", "--eval-samples", "0", "--no-save-final", "--run-dir", "{job_dir}"')
    jobs = "".join(f"""
[[gates]]
kind = "job"
name = "{name}"
task = "train"
timeout_s = 300
verify = false
argv = [{train}{extra}]
""" for name, extra in (("first", ""), ("second", ""), ("third", ', "--save-dir", "{job_dir:first}/unused"')))
    (home / "milestones/peek.toml").write_text(f"""
id = "peek"
title = "x"
goal = "x"
editable = ["engine/**"]
[[gates]]
kind = "protected"
{jobs}
[budget]
max_turns = 1
max_tokens = 1
max_wall_s = 60
max_attempts = 1
""")
    git(home, "add", "-A")
    git(home, "commit", "-q", "-m", "peek")
    patch = unified_diff(home, tmp_path, lambda t: (t / "engine/__main__.py").write_text(
        PEEK + (t / "engine/__main__.py").read_text()))
    milestone = load_milestone(home / "milestones/peek.toml", root=home)
    record = RunRecord.create(milestone_id="peek", spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=tmp_path / "runs")
    runner = GateRunner(milestone=milestone, repo=home, base=git(home, "rev-parse", "HEAD").strip(), record=record)
    runner.judge(patch.read_text(), attempt=1)
    peeks = {job: next(line for line in (record.dir / f"jobs/a1-{job}/log").read_text().splitlines()
                       if line.startswith("[PEEK]")) for job in ("first", "second", "third")}
    assert peeks["first"].startswith("[PEEK] 0 ") and peeks["second"].startswith("[PEEK] 0 "), peeks
    assert peeks["third"].startswith("[PEEK] 1 "), peeks  # it named the first job's folder


# ---------------------------------------------------------------- metrics from hand-written job folders

TINY = {"vocab_size": 258, "hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32,
        "ffn_hidden_size": 384, "seq_length": 256}
# Training FLOPs per token of TINY, by hand (Megatron count, see harness/judge/claims/measured_mfu.py's docstring):
# per layer QKV 128*(4+2*2)*32 = 32768, O 4*32*128 = 16384, FC1 128*2*384 = 98304, FC2 384*128 = 49152
# -> 196608; x 4 layers = 786432; LM head 128*258 = 33024; matmul params 819456; x 6 = 4916736;
# attention 6*4*4*32*256 = 786432. Total 5703168.
TINY_FLOPS_PER_TOKEN = 5_703_168


def job_folder(tmp_path: Path, name: str, log_lines: list[str], config: dict | None, *, gpus: int = 1,
               argv: tuple[str, ...] = ("pretrain", "--preset", "tiny", "--global-batch-size", "32", "--run-dir", "{job_dir}"),
               line_s: float = 0.5) -> JobOutcome:
    """A finished job as the judge keeps it: its log with the judge's arrival times (one line every
    `line_s` seconds after a startup line at 0 s) and the job's own folder with its config.json claim."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "log").write_text("startup noise\n" + "\n".join(log_lines) + "\n")
    (folder / "log.times").write_text("".join(f"{line_s * i:.6f}\n" for i in range(len(log_lines) + 1)))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    gate = JobGate(kind="job", name=name, task="train", timeout_s=60, argv=list(argv), gpus=gpus, nproc=max(gpus, 1))
    result = JobResult(name=name, state="completed", exit_code=0, log_path=folder / "log", elapsed_s=1.0,
                       job_id=f"local-{name}", launcher="local", line_times_path=folder / "log.times")
    return JobOutcome(gate=gate, job_id=name, job_dir=folder, result=result, argv=tuple(argv))


# Measured numbers carry all ten printed digits (harness/judge/claims/digits.py refuses round ones): the fixtures' round
# values are printed nudged by ~1e-9, as a measurement would print.
MEASURED = 1 - 1.234567e-9


def loss_line(step: int, loss: float, *, tokens: int = 8192, time_s: float = 0.5, mfu: float = 0.9, grad: float = 1.0) -> str:
    loss, grad = loss * MEASURED, grad * MEASURED
    return (f"[LOSS] step={step} global_loss={loss:.9e} grad_norm={grad:.9e} lr={1e-3:.6e} tokens={tokens} "
            f"time_s={time_s:.6f} mfu={mfu:.4f}")


def rules(*items: dict) -> MetricsGate:
    return MetricsGate(kind="metrics", name="metrics", rules=[{"job": "train", **r} for r in items])


def test_metrics_are_recomputed_never_read_from_the_engine(tmp_path: Path) -> None:
    config = {**TINY, "preset": "tiny", "global_batch_size": 32}
    lines = [loss_line(s, 5.0 - 0.5 * s) for s in range(1, 6)] + ["[EVAL] step=5 val_loss=2.500000000e+00 val_bpb=3.606738 tokens=4096"]
    job = job_folder(tmp_path, "train", lines, config)
    expected_mfu = TINY_FLOPS_PER_TOKEN * 8192 / (0.5 * 1 * 989e12)
    gate = rules({"metric": "steps", "op": "==", "value": 5}, {"metric": "final_loss", "op": "<=", "value": 2.5},
                 {"metric": "min_loss", "op": "<", "value": 2.6}, {"metric": "val_bpb", "op": "<=", "value": 3.7},
                 {"metric": "mfu", "op": ">=", "value": 0.5})
    violations, metrics, flags = judge_metrics(gate, {"train": job}, tree=tmp_path, presets={"tiny": TINY})
    # The engine claimed 90 % MFU; the judge counts 0.0094 % (its own clock: one line per 0.5 s, as claimed):
    # only the MFU rule fails, with the judge's number.
    assert metrics["train.mfu"] == pytest.approx(expected_mfu, rel=1e-9)  # same arithmetic; times printed to 1e-6 s
    assert metrics["train.mfu_engine_claim"] == 0.9
    assert violations == [f"mfu of train = {expected_mfu:.6g}, needs >= 0.5"]
    assert metrics["train.steps"] == 5 and metrics["train.final_loss"] == pytest.approx(2.5, rel=1e-8) and metrics["train.val_bpb"] == 3.606738
    assert flags == []


def test_a_smaller_model_than_asked_fails_whatever_its_numbers(tmp_path: Path) -> None:
    config = {**TINY, "hidden_size": 64, "preset": "tiny", "global_batch_size": 32}
    job = job_folder(tmp_path, "train", [loss_line(1, 1.0)], config)
    violations, _, _ = judge_metrics(rules({"metric": "final_loss", "op": "<=", "value": 5}), {"train": job},
                                     tree=tmp_path, presets={"tiny": TINY})
    assert violations == ["job train: config.json has hidden_size = 64, the milestone's job asks for 128"]
    # A flag in the job's own argv is what it asked for: --hidden-size 64 makes the same folder pass.
    job = job_folder(tmp_path, "train2", [loss_line(1, 1.0)], config,
                     argv=("pretrain", "--preset", "tiny", "--hidden-size", "64", "--global-batch-size", "32", "--run-dir", "{job_dir}"))
    gate = MetricsGate(kind="metrics", name="m", rules=[{"job": "train2", "metric": "final_loss", "op": "<=", "value": 5}])
    assert judge_metrics(gate, {"train2": job}, tree=tmp_path, presets={"tiny": TINY})[0] == []
    # No config.json at all: the judge cannot tell what was trained.
    job = job_folder(tmp_path, "train3", [loss_line(1, 1.0)], None)
    gate = MetricsGate(kind="metrics", name="m", rules=[{"job": "train3", "metric": "final_loss", "op": "<=", "value": 5}])
    assert "no readable config.json" in judge_metrics(gate, {"train3": job}, tree=tmp_path, presets={"tiny": TINY})[0][0]


def test_reference_trajectories_nan_and_malformed_lines(tmp_path: Path) -> None:
    config = {**TINY, "preset": "tiny", "global_batch_size": 32}
    (tmp_path / "ref.jsonl").write_text('{"_meta": {"tool": "hand"}}\n' + "".join(
        json.dumps({"step": s, "global_loss": v}) + "\n" for s, v in ((1, 4.0), (2, 3.0), (3, 2.0))))
    job = job_folder(tmp_path, "train", [loss_line(1, 4.1), loss_line(2, 3.0), loss_line(3, 1.9)], config)
    gate = rules({"metric": "loss_rel_diff", "ref": "ref.jsonl", "op": "<=", "value": 0.04},
                 {"metric": "loss_max_abs_diff", "ref": "ref.jsonl", "op": "<=", "value": 0.1, "to_step": 2})
    violations, metrics, _ = judge_metrics(gate, {"train": job}, tree=tmp_path, presets={"tiny": TINY})
    # by hand: |4.1-4|/4 = 0.025, 0, |1.9-2|/2 = 0.05 -> 0.05 > 0.04; steps 1..2: max |diff| = 0.1 (4.1 vs 4.0)
    assert metrics["train.loss_rel_diff"] == pytest.approx(0.05, rel=1e-7)  # 1e-7: the ~1e-9 nudge of MEASURED
    assert metrics["train.loss_max_abs_diff"] == pytest.approx(0.1, rel=1e-7)
    assert len(violations) == 1 and violations[0].startswith("loss_rel_diff of train = 0.05, needs <= 0.04")

    nan = job_folder(tmp_path, "nan", [loss_line(1, math.nan)], config)
    gate = MetricsGate(kind="metrics", name="m", rules=[{"job": "nan", "metric": "final_loss", "op": "<=", "value": 1e9}])
    assert judge_metrics(gate, {"nan": nan}, tree=tmp_path, presets={"tiny": TINY})[0] == ["final_loss of nan = nan, needs <= 1e+09"]

    torn = job_folder(tmp_path, "torn", [loss_line(1, 1.0)[:-3]], config)  # mfu=0.9 printed as "0."
    gate = MetricsGate(kind="metrics", name="m", rules=[{"job": "torn", "metric": "final_loss", "op": "<=", "value": 5}])
    [problem] = judge_metrics(gate, {"torn": torn}, tree=tmp_path, presets={"tiny": TINY})[0]
    assert "malformed [LOSS] lines" in problem and "mfu=" in problem


def test_step_times_off_the_judges_clock_are_rejected(tmp_path: Path) -> None:
    """Lines arrive 2 s apart (the judge's clock) but claim 0.5 s steps: MFU would be inflated 4x. A claim
    within 5 % of the clock passes; 6 % off fails step_time_s and tokens_per_s too, with both numbers."""
    config = {**TINY, "preset": "tiny", "global_batch_size": 32}
    job = job_folder(tmp_path, "train", [loss_line(s, 3.0) for s in range(1, 7)], config, line_s=2.0)
    violations, metrics, flags = judge_metrics(rules({"metric": "mfu", "op": ">=", "value": 0.0}), {"train": job},
                                               tree=tmp_path, presets={"tiny": TINY})
    assert len(flags) == 1 and "below the judge's clock" in flags[0]
    assert len(violations) == 1 and "implausible" in violations[0]
    assert "train.mfu" not in metrics and metrics["train.mfu_by_time_s"] > 0
    close = job_folder(tmp_path, "close", [loss_line(s, 3.0, time_s=0.52) for s in range(1, 7)], config)
    off = job_folder(tmp_path, "off", [loss_line(s, 3.0, time_s=0.47) for s in range(1, 7)], config)
    for name, job, ok in (("close", close, True), ("off", off, False)):
        gate = MetricsGate(kind="metrics", name="m", rules=[{"job": name, "metric": m, "op": ">", "value": 0}
                                                             for m in ("step_time_s", "tokens_per_s")])
        violations, metrics, _ = judge_metrics(gate, {name: job}, tree=tmp_path, presets={"tiny": TINY})
        if ok:
            assert violations == [] and metrics[f"{name}.step_time_s"] == pytest.approx(0.5, rel=1e-6)
        else:
            assert len(violations) == 2 and all("judge's clock measured 0.500000 s" in v and "0.470000" in v for v in violations)


def test_gate_subprocesses_never_see_api_keys(runner: GateRunner, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes the gates start get settings.child_env(): a new test of the candidate's that dumps its
    environment shows the gate's own variables but no API key, and nothing under the run has it."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-GATESECRET0123456789abcdef")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-GATESECRET-2")
    def dump_env(tree: Path) -> None:  # the honest change plus a new test of the candidate's that shows its env
        replace_in(tree / "engine/config.py", OLD, NEW)
        (tree / "tests/test_envdump.py").write_text(
            "import os\n\ndef test_dump():\n    assert not os.environ, '\\n'.join(sorted(os.environ))\n")

    dump = unified_diff(home, tmp_path, dump_env)
    verdict = runner.judge(dump.read_text(), attempt=1)
    # The sandbox keeps the test from writing anywhere the test could read; its failure message carries the
    # names of its environment into the judge's log instead.
    pytest_gate = verdict.gates[2]
    assert not verdict.accepted and "new test file(s) fail on their own" in pytest_gate.summary
    seen = (runner.record.attempt_dir(1) / "gates" / "pytest-new-tests.log").read_text()
    assert "PYTHONPATH" in seen and "TEMPER_JUDGE_SEED" in seen  # the dump happened
    assert "ANTHROPIC_API_KEY" not in seen and "MY_SERVICE_TOKEN" not in seen
    found = subprocess.run(["grep", "-r", "GATESECRET", str(runner.record.dir)], capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == ""


def test_no_sandbox_no_judging_unless_asked_and_then_the_verdict_says_so(home: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sandbox cannot start the judge refuses, naming --unsandboxed; asked to, it judges and every verdict
    says so (here a patch refused at once; an accepted verdict that says so, through `temper run --unsandboxed`:
    tests/loop/test_loop_backends.py::test_cli_agent_gets_the_prompt_then_the_feedback_and_is_gated)."""
    milestone = load_milestone(home / "milestones/loop-tiny.toml", root=home)
    base = git(home, "rev-parse", "HEAD").strip()

    def runner(unsandboxed: bool) -> GateRunner:
        record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none"},
                                  base_commit=base, branch="", worktree="", runs_root=tmp_path / "runs")
        return GateRunner(milestone=milestone, repo=home, base=base, record=record, unsandboxed=unsandboxed)

    # What the sandbox probe answers on a machine where bwrap cannot start (a real answer of probe()).
    monkeypatch.setattr("harness.judge.runner.probe", lambda: "sandbox unavailable: bwrap failed (No permissions); "
                                                             "or judge unsandboxed on purpose (--unsandboxed)")
    with pytest.raises(GateError, match="refuses to run candidate code without its sandbox.*--unsandboxed"):
        runner(False).judge("", attempt=1)
    protected = unified_diff(home, tmp_path, lambda t: (t / "engine/model_spec.toml").write_text("x\n")).read_text()
    verdict = runner(True).judge(protected, attempt=1)
    assert not verdict.accepted and verdict.failed_gate is verdict.gates[0]
    assert any(f.startswith("unsandboxed") for f in verdict.flags)


@pytest.mark.slow  # ~85 s on 2 cores; the replay plan (plan_replay) and its bit-for-bit check: tests/judge/test_exactstep.py
def test_a_run_verified_on_its_final_step_is_replayed_to_a_secret_step(home: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On GPU the judge keeps only the final pair of checkpoints (saveplan.plan_saves), so it replays the job untimed to
    a secret step (saveplan.plan_replay). Here the GPU plan runs on CPU (plan_saves called with device="cuda"): an
    honest engine passes; one that reuses the last gradient on every other step except the last two, which the final
    pair verifies, is caught at the replay's secret step; one that does so only in the timed run (it has --save-last, the replay does
    not) prints other numbers than its replay, and so does one that works fully only on the steps the replay names
    (--save-at k - 1, k, k + 1)."""
    from harness.judge.claims.saveplan import plan_saves
    from harness.judge.gates import job as job_gate
    from tests.adversarial.training import (stale_gradient_off_the_final_pair, stale_gradient_unless_saved,
                                            stale_gradient_when_timed)

    monkeypatch.setattr(job_gate, "plan_saves", lambda *a, **kw: plan_saves(*a, **{**kw, "device": "cuda"}))
    one_job_milestone(home, "replayed", "A run the judge verifies as on a GPU", timeout_s=300, argv=(
        '"pretrain", "--preset", "tiny", "--device", "cpu", "--seed", "{seed}", "--num-steps", "6", "--warmup-steps", "1", '
        '"--seq-length", "32", "--micro-batch-size", "2", "--eval-samples", "0", "--run-dir", "{job_dir}"'))
    git(home, "add", "-A")
    git(home, "commit", "-qm", "replayed milestone")
    milestone = load_milestone(home / "milestones/replayed.toml", root=home)
    base = git(home, "rev-parse", "HEAD").strip()

    def judge(patch: str, attempt: int):  # noqa: ANN202
        record = RunRecord.create(milestone_id="replayed", spec_hash=milestone.spec_hash, agent={"spec": "none"},
                                  base_commit=base, branch="", worktree="", runs_root=tmp_path / "runs")
        return GateRunner(milestone=milestone, repo=home, base=base, record=record).judge(patch, attempt=attempt).gates[1]

    honest = judge("", 1)
    assert honest.passed, honest.summary + str(honest.violations)
    assert 2 <= honest.metrics["replay_step"] <= 4 and honest.metrics["replay_exact_steps"] >= 1

    # Steps 2 and 4 of 6 reuse the last gradient: the secret step k (2..4) and k + 1, k + 2 are verified, so step 4 is.
    skips = unified_diff(home, tmp_path, stale_gradient_off_the_final_pair)
    caught = judge(skips.read_text(), 2)
    assert not caught.passed and any("replay" in v and "exact step" in v for v in caught.violations), caught.violations

    timed_only = unified_diff(home, tmp_path, stale_gradient_when_timed)
    caught = judge(timed_only.read_text(), 3)
    assert not caught.passed and any("the judge's replay of the same argv" in v for v in caught.violations), caught.violations

    # Honest on k - 1..k + 1 in the replay: the timed run reused a gradient on k or k + 1 (every other step), so the
    # replay's loss at k + 1 or k + 2 is not the one the timed run printed.
    unless_saved = unified_diff(home, tmp_path, stale_gradient_unless_saved)
    caught = judge(unless_saved.read_text(), 4)
    assert not caught.passed and any("the judge's replay of the same argv" in v and "--save-at" in v
                                     for v in caught.violations), caught.violations


def test_a_candidate_job_cannot_write_outside_its_own_folder(home: Path, tmp_path: Path) -> None:
    """Inside the sandbox a job writes its {job_dir} and nothing else: not the judge's records, not the home's
    milestones; the judged checkout is seen writable, as a user's is, but the write never reaches it and rejects the
    attempt (a file written while a gate ran)."""
    records = tmp_path / "runs"
    # Outside /tmp, which is private inside the sandbox (a write there never reaches the host either).
    probe_file = Path("/var/tmp") / f"temper-sandbox-{tmp_path.name}-{os.getpid()}.txt"
    one_job_milestone(home, "writes", "A job that tries to write everywhere", timeout_s=120, verify=False, argv=(
        '"pretrain", "--preset", "tiny", "--device", "cpu", "--num-steps", "1", "--warmup-steps", "0", '
        '"--seq-length", "32", "--micro-batch-size", "2", "--eval-samples", "0", "--no-save-final", "--run-dir", "{job_dir}"'))
    git(home, "add", "-A")
    git(home, "commit", "-qm", "writes milestone")
    milestone = load_milestone(home / "milestones/writes.toml", root=home)
    record = RunRecord.create(milestone_id="writes", spec_hash=milestone.spec_hash, agent={"spec": "none"},
                              base_commit="0" * 40, branch="", worktree="", runs_root=records)
    targets = {"checkout": "planted_by_job.py", "records": str(record.dir / "planted"), "home": str(home / "milestones/x"),
               "outside": str(probe_file)}
    attempt = "\n".join(
        f"try:\n    open({t!r}, 'a').write('x')\n    print('WROTE {k}')\nexcept OSError:\n    print('DENIED {k}')"
        for k, t in targets.items())
    patch = unified_diff(home, tmp_path, lambda t: (t / "engine/__main__.py").write_text(
        attempt + "\n" + (t / "engine/__main__.py").read_text()))
    base = git(home, "rev-parse", "HEAD").strip()
    verdict = GateRunner(milestone=milestone, repo=home, base=base, record=record).judge(patch.read_text(), attempt=1)
    log = (record.dir / "jobs/a1-train/log").read_text()
    assert all(f"DENIED {k}" in log for k in targets if k != "checkout") and "WROTE checkout" in log, log[:2000]
    written = probe_file.exists()
    probe_file.unlink(missing_ok=True)
    assert not written and not (record.dir / "planted").exists() and not (home / "milestones/x").exists()
    assert "[LOSS]" in log  # the job itself ran and wrote its own folder
    train = verdict.gates[1]
    assert not train.passed and "planted_by_job.py: written while gate train ran" in train.violations, train.violations
