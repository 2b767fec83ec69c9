"""The milestone programme (issue 11): every bundled milestone validates and lists its hardware; every
CPU milestone is passed by the current engine (`temper gate ID` accepts) and failed by a planted
regression (a test-only fixture patch under tests/milestones/regressions/ that breaks exactly the
property the milestone defends, rejected by the gate that defends it).

demo-tiny is a growth milestone: main fails it (its acceptance tests need `inverse_sqrt`) and the demo's
solution (tests/milestones/solutions/demo-tiny.patch) passes it.

Cost on 2 idle cores: each `temper gate` takes 15-80 s (sandboxed, as a user's judging). The default (CI) selection runs
bitwise-single passed and regressed (~40 s, at SMALL_SHAPES), the spec/listing/needs checks, one GPU refusal per GPU
count and that every fixture patch still applies to HEAD; `-m slow` adds the other CPU milestones passed and regressed,
demo-tiny failed by main and solved, and the other GPU refusals.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.ops import OP_NAMES
from engine.plan import plan
from harness.settings import data_dir
from harness.spec import load_milestones

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CPU_MILESTONES = ("demo-tiny", "alignment", "bitwise-single", "resume", "bitwise-dptp", "long-horizon")
GPU_MILESTONES = {"perf": "1 x H100/H200 GPU", "production": "8 x H100/H200 GPUs",
                  "production-4gpu": "4 x H100/H200 GPUs",
                  "bitwise-dptp-nccl": "2 x H100/H200 GPUs", "fp8-parity": "1 x H100/H200 GPU",
                  **{f"op-{op}": "1 x H100/H200 GPU" for op in OP_NAMES}}  # stage 2: one milestone per hot op
# The gate that defends each milestone's property: the planted regression must fail there.
# Long-horizon's regression (labels not shifted) is caught at its train job already: the losses it prints
# are not what its weights give under the judge's own forward pass (the next-token objective). So are
# bitwise-single's (the wall clock in the data order: the first run's steps did not train on the batches the
# base engine states for them) and bitwise-dptp's (a loss normalised per DP rank: the DP 2 run's printed grad
# norm is twice the judge's on the exact batch), by the exact-step check (harness/judge/claims/exactstep.py).
DEFENDING_GATE = {"alignment": "pytest", "bitwise-single": "first", "resume": "restart-metrics",
                  "bitwise-dptp": "dp2", "long-horizon": "train"}
# GPU milestones with a planted regression, judged on the device (`-m gpu`; docs/fp8.md). fp8-parity's regression
# (E5M2's range for E4M3 operands: activations and weights saturate above amax / 128) is expected at its fp8 train job
# (a saturated forward cannot print the loss and apply the gradient the judge computes from the same weights), and
# there it was rejected on an H200 (2026-11-28: bench/results/gates/h200_fp8-parity_regression_three_save_replay.json).
GPU_DEFENDING_GATE = {"fp8-parity": "fp8"}
# The shape bitwise-single is judged at here: the smallest its [draw] table allows but two layers (each job ~4x
# cheaper than the table's largest; the start-up of the jobs, the same at any shape, is most of what is left). The
# seed, the epoch-crossing corpus and the secret steps are still drawn from a fresh secret at every judging, and
# what bitwise-single defends (one seed, one answer; the data order a function of seed and step) does not depend on
# the width, depth, sequence length or run length. The judge's draws over the whole table: tests/judge/test_draws.py;
# the same two jobs on a full draw (repair-data-order has bitwise-single's gates and [draw]): tests/loop/test_demo.py
# (`-m slow`).
SMALL_SHAPES = {"bitwise-single": {"seq": 48, "hidden": 64, "layers": 2, "steps": 8}}

def temper(*args: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` with its runs and its temp folders (TMPDIR) under tmp_path."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEMPER_RUNS_DIR": str(tmp_path / "runs"), "TMPDIR": str(tmp_path / "tmp")}
    env.pop("TEMPER_HOME", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def gate(milestone: str, patch: Path | None, tmp_path: Path) -> tuple[int, dict]:
    """`temper gate ID --patch P --json` on HEAD, sandboxed as a user's judging is; an empty patch judges HEAD itself
    (never the developer's uncommitted changes). A milestone of SMALL_SHAPES is judged at that shape (`--draw`), the
    rest of its draw from a fresh secret. (Unsandboxed, every judged Python process would compile torch from source:
    the judge keeps bytecode out of an unsandboxed checkout with PYTHONPYCACHEPREFIX, ~5 s a process.)"""
    if patch is None:
        patch = tmp_path / "empty.patch"
        patch.write_text("")
    draw = ["--draw", json.dumps(SMALL_SHAPES[milestone])] if milestone in SMALL_SHAPES else []
    proc = temper("gate", milestone, "--patch", str(patch), "--json", *draw, tmp_path=tmp_path)
    assert proc.returncode in (0, 1), f"temper gate {milestone} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    # The judge removes every temp folder it made (checkouts, the checkpoints it keeps to verify steps), however
    # the judging ended: a leak is gigabytes per judging of an 8B run.
    left = sorted(p.name for p in (tmp_path / "tmp").iterdir())
    assert not left, f"temper gate {milestone} left temp folders behind: {left}"
    return proc.returncode, json.loads(proc.stdout)


def failed_gate(verdict: dict) -> str:
    return next(g["name"] for g in verdict["gates"] if not g["passed"] and not g["skipped"])


def summary(verdict: dict) -> str:
    return "\n".join(f"{g['name']}: {'pass' if g['passed'] else 'skip' if g['skipped'] else 'FAIL'} {g['summary']} "
                     f"{list(g.get('violations', []))[:4]}" for g in verdict["gates"])


# ---------------------------------------------------------------- specs and listing


def test_every_milestone_validates_and_the_programme_is_complete():
    ids = {m.id: m for m in load_milestones(REPO / "milestones", REPO)}
    assert set(CPU_MILESTONES) | set(GPU_MILESTONES) <= set(ids)
    for mid in CPU_MILESTONES:
        assert ids[mid].requires.device in ("cpu", "any"), mid
        assert not ids[mid].missing_files(REPO), f"{mid} names missing files: {ids[mid].missing_files(REPO)}"
    for mid, defending in {**DEFENDING_GATE, **GPU_DEFENDING_GATE}.items():
        assert (HERE / "regressions" / f"{mid}.patch").is_file()
        assert defending in [g.name for g in ids[mid].gates]
    for mid in GPU_MILESTONES:
        assert ids[mid].requires.device == "cuda" and set(ids[mid].requires.gpu_types) == {"H100", "H200"}
    for op in OP_NAMES:  # stage 2: one milestone per hot op, only the op's folder editable
        stage2 = ids[f"op-{op}"]
        assert stage2.editable == [f"engine/ops/{op}/**"]
        benches = [g for g in stage2.gates if getattr(g, "task", "") in ("bench", "stress")]
        assert {g.task for g in benches} == {"bench", "stress"} and all(g.bench.op == op for g in benches)
        assert any(r.metric == "speedup" for g in stage2.gates if g.kind == "metrics" for r in g.rules)


def test_production_4gpu_runs_the_layout_the_planner_picks_for_an_80gb_card():
    """production-4gpu's argv pins `engine plan`'s fastest layout that fits an 80 GB card (engine/plan.py), so the
    job runs the same on H100s and H200s. When the planner's pick moves (its memory model or its measured MFUs),
    this fails: the milestone's argv and goal text follow the planner."""
    (m,) = [x for x in load_milestones(REPO / "milestones", REPO) if x.id == "production-4gpu"]
    (job,) = [g for g in m.gates if g.kind == "job"]
    argv = job.argv

    def flag(name: str, default: str = "") -> str:
        return argv[argv.index(name) + 1] if name in argv else default

    best = next(x for x in plan(flag("--preset"), int(job.nproc), 80.0, seq_length=int(flag("--seq-length")),
                                global_batch=int(flag("--global-batch-size"))) if x.fits)
    pinned = (int(flag("--tp", "1")), "fsdp" if "--fsdp" in argv else "zero1", int(flag("--micro-batch-size")),
              flag("--activation-checkpointing", "none"))
    assert pinned == (best.tp, best.mode, best.mbs, best.recompute), (pinned, best)
    assert job.gpus == int(job.nproc) == m.requires.gpus


def test_temper_milestones_lists_each_with_its_hardware(tmp_path):
    proc = temper("milestones", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:] if line.strip()}
    for mid in CPU_MILESTONES:
        assert mid in rows and ("CPU" in rows[mid]), rows.get(mid)
    for mid, needs in GPU_MILESTONES.items():
        assert needs in rows[mid], rows[mid]


# One refusal per GPU count runs by default (~6 s each); the listing test above shows every milestone's needs.
_REFUSAL_DEFAULT = {"perf", "bitwise-dptp-nccl", "production-4gpu", "production"}


@pytest.mark.parametrize("milestone", [pytest.param(m, marks=[] if m in _REFUSAL_DEFAULT else [pytest.mark.slow])
                                       for m in sorted(GPU_MILESTONES)])
def test_a_gpu_milestone_on_cpu_exits_3_with_needs(milestone, tmp_path):
    if subprocess.run(["sh", "-c", "command -v nvidia-smi && nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("this machine has GPUs")
    proc = temper("gate", milestone, "--unsandboxed", "--quiet", tmp_path=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "needs" in proc.stderr + proc.stdout and GPU_MILESTONES[milestone] in proc.stderr + proc.stdout


# ---------------------------------------------------------------- passed by the engine, failed by a regression


def _needs_data(milestone: str) -> None:
    if milestone in ("long-horizon", "fp8-parity") and not data_dir(REPO).is_dir():
        pytest.skip(f"{data_dir(REPO)} is absent: set TEMPER_DATA to the shared data folder")


PASS = [  # the default run keeps every regression; the passes cost ~75 s more (CI's 20-minute limit on 2 cores)
    pytest.param("alignment", marks=pytest.mark.slow),  # ~48 s; tests/milestones/test_alignment.py runs its tests directly
    pytest.param("bitwise-single"),  # ~23 s (sandboxed, SMALL_SHAPES): the default run's one honest training milestone accepted end to end
    pytest.param("resume", marks=pytest.mark.slow),  # five jobs and kills: ~65 s; its regression stays in CI
    pytest.param("bitwise-dptp", marks=pytest.mark.slow),  # 4 processes (gloo): ~60 s a gate on 2 cores
    pytest.param("long-horizon", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("patch", sorted((HERE / "regressions").glob("*.patch")) + sorted((HERE / "solutions").glob("*.patch")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_fixture_patch_applies_to_head(patch):
    """The planted regressions and the solutions are diffs against the engine: an engine change that moves their
    context breaks them. This cheap check runs by default, so a patch whose gate test is slow is caught too."""
    proc = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"{patch.name} no longer applies to HEAD; regenerate it: {proc.stderr}"


@pytest.mark.parametrize("milestone", PASS)
def test_the_engine_passes(milestone, tmp_path):
    _needs_data(milestone)
    code, verdict = gate(milestone, None, tmp_path)
    assert code == 0 and verdict["accepted"], summary(verdict)


REGRESSIONS = [
    pytest.param("alignment", marks=pytest.mark.slow),  # ~43 s; the alignment tests themselves run by default (test_alignment.py)
    pytest.param("bitwise-single"),
    pytest.param("resume", marks=pytest.mark.slow),  # ~120 s: five jobs and kills; bitwise-single's regression stays in CI
    pytest.param("bitwise-dptp", marks=pytest.mark.slow),  # 4 processes (gloo): ~60 s a gate on 2 cores
    pytest.param("long-horizon", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("milestone", REGRESSIONS)
def test_the_planted_regression_fails_at_the_defending_gate(milestone, tmp_path):
    _needs_data(milestone)
    code, verdict = gate(milestone, HERE / "regressions" / f"{milestone}.patch", tmp_path)
    assert code == 1 and not verdict["accepted"], summary(verdict)
    protected = verdict["gates"][0]
    assert protected["passed"], f"the regression patch must be a legal candidate (engine/ only): {summary(verdict)}"
    assert failed_gate(verdict) == DEFENDING_GATE[milestone], summary(verdict)


@pytest.mark.gpu
@pytest.mark.parametrize("milestone", sorted(GPU_DEFENDING_GATE))
def test_a_gpu_milestone_is_passed_by_the_engine_and_failed_by_its_regression(milestone, tmp_path):
    """On the device (bench/fp8_parity_session.sh judges both at once there, sandboxed, with bench/device_gates.sh)."""
    _needs_data(milestone)
    (tmp_path / "main").mkdir()
    (tmp_path / "regression").mkdir()
    code, verdict = gate(milestone, None, tmp_path / "main")
    assert code == 0 and verdict["accepted"], summary(verdict)
    code, verdict = gate(milestone, HERE / "regressions" / f"{milestone}.patch", tmp_path / "regression")
    assert code == 1 and verdict["gates"][0]["passed"], summary(verdict)
    assert failed_gate(verdict) == GPU_DEFENDING_GATE[milestone], summary(verdict)


@pytest.mark.slow  # ~41 s; demo-tiny's acceptance is judged by default in tests/adversarial (honest@demo-tiny)
def test_demo_tiny_is_failed_by_main(tmp_path):
    code, verdict = gate("demo-tiny", None, tmp_path)
    assert code == 1 and failed_gate(verdict) == "pytest", summary(verdict)


@pytest.mark.slow
def test_demo_tiny_is_passed_by_the_demo_solution(tmp_path):
    code, verdict = gate("demo-tiny", HERE / "solutions" / "demo-tiny.patch", tmp_path)
    assert code == 0 and verdict["accepted"], summary(verdict)


def test_a_milestone_without_its_data_is_refused_not_rejected(tmp_path):
    """long-horizon reads the shared corpus; where it is absent the judge refuses like a hardware check (exit 3,
    nothing judged, no record), and neither `temper milestones` nor the refusal shows the raw `{data}` placeholder."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    (tmp_path / "empty.patch").write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEMPER_RUNS_DIR": str(tmp_path / "runs"), "TEMPER_DATA": str(empty)}
    env.pop("TEMPER_HOME", None)
    proc = subprocess.run([sys.executable, "-m", "harness", "gate", "long-horizon", "--patch", str(tmp_path / "empty.patch")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "REJECTED" not in proc.stdout and "corpus/train-00000-of-00002.parquet" in proc.stderr, proc.stderr
    assert "tokenizers/minicpm4" in proc.stderr and str(empty) in proc.stderr and "{data}" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    listing = subprocess.run([sys.executable, "-m", "harness", "milestones"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
    row = next(line for line in listing.stdout.splitlines() if line.startswith("long-horizon "))
    assert f"no: {empty} lacks the data its jobs read" in row and "{data}" not in listing.stdout, row
