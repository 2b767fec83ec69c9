"""Whole runs through the real CLI (subprocesses): determinism, resume, signals, divergence, export."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.helpers import REPO, TINY_FAST, deterministic_fields, eval_lines, loss_lines, run_engine
from tests.once import once_per_run


EIGHT = [*TINY_FAST, "--num-steps", "8", "--save-every", "4", "--keep-last", "5"]


@pytest.fixture(scope="session")
@once_per_run
def eight_steps(tmp_path_factory):
    """One 8-step run with checkpoints at steps 4 and 8, the reference of the determinism and resume tests:
    (run dir, the finished process)."""
    run_dir = tmp_path_factory.mktemp("eight") / "full"
    return run_dir, run_engine("pretrain", *EIGHT, "--run-dir", str(run_dir))


@pytest.fixture(scope="session")
@once_per_run
def seed_7_without_run_dir(tmp_path_factory):
    """A 2-step run with --seed 7 and no --run-dir, started in a folder of its own: (that folder, the process). Another
    seed for the determinism test, the default output folders for the header test."""
    cwd = tmp_path_factory.mktemp("no_run_dir")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "engine", "pretrain", *TINY_FAST, "--num-steps", "2", "--eval-samples", "0",
                           "--seed", "7"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cwd, proc


def test_same_seed_prints_identical_loss_lines(eight_steps, seed_7_without_run_dir, tmp_path):
    a = eight_steps[1]
    b = run_engine("pretrain", *EIGHT, "--run-dir", str(tmp_path / "b"))
    la, lb = loss_lines(a.stdout), loss_lines(b.stdout)
    assert len(la) == 8
    assert [deterministic_fields(x) for x in la] == [deterministic_fields(x) for x in lb]
    assert eval_lines(a.stdout) == eval_lines(b.stdout)
    # another seed: another initialisation and data order, so another first loss and grad norm
    c = seed_7_without_run_dir[1]
    assert deterministic_fields(loss_lines(c.stdout)[0])[1:3] != deterministic_fields(la[0])[1:3]


def test_val_loss_does_not_depend_on_the_batch_split(trained, tmp_path):
    """mbs 1 x GAS 4 and mbs 4 (the shared 3-step run, tests/engine/conftest.py) train identically (losses normalised
    by global tokens) and evaluate the same --eval-samples samples: the [EVAL] lines, at steps 0 to 3, agree to 1e-6
    relative (fp32 sums within each micro-batch's loss and of four micro-batch gradients, grouped differently; observed
    ~1e-8) and count the same tokens. Evaluation used to read eval_steps x mbs samples: 8 vs 32 here. (In process, at
    DP 2 and TP 2 too: tests/parallel/test_tp_dp_equivalence.py::test_validation_loss_is_the_same_whatever_the_layout.)"""
    split = run_engine("pretrain", *TINY_FAST, "--num-steps", "3", "--eval-every", "1", "--no-save-final",
                       "--micro-batch-size", "1", "--grad-accum-steps", "4", "--run-dir", str(tmp_path / "split"))
    evals = [[line.split() for line in eval_lines(out)] for out in (split.stdout, trained[2])]
    assert [len(e) for e in evals] == [4, 4]  # steps 0, 1, 2, 3
    for a, b in zip(*evals):
        fa, fb = dict(x.split("=") for x in a[1:]), dict(x.split("=") for x in b[1:])
        assert fa["step"] == fb["step"] and fa["tokens"] == fb["tokens"] == str(8 * 64)
        assert abs(float(fa["val_loss"]) - float(fb["val_loss"])) / float(fb["val_loss"]) < 1e-6, (a, b)


def test_without_run_dir_the_header_says_where_outputs_go(seed_7_without_run_dir):
    cwd, proc = seed_7_without_run_dir
    where = cwd.resolve() / "outputs" / "tiny"
    header = [line for line in proc.stdout.splitlines() if line.startswith("[RUN] outputs")]
    assert header == [f"[RUN] outputs run_dir={where} save_dir={where / 'checkpoints'} "
                      f"(no --run-dir: outputs/tiny under the current folder)"]
    assert (where / "metrics.jsonl").is_file() and (where / "checkpoints").is_dir()
    assert "numpy" not in proc.stderr.lower()  # pyproject's numpy dependency keeps torch quiet


def test_resume_is_bitwise(eight_steps, tmp_path):
    run_dir, full = eight_steps
    ckpt = run_dir / "checkpoints" / "step_00000004"
    assert (ckpt / "meta.json").is_file()
    resumed = run_engine("pretrain", *TINY_FAST, "--num-steps", "8", "--resume", str(ckpt),
                         "--run-dir", str(tmp_path / "resumed"))
    tail_full = [deterministic_fields(x) for x in loss_lines(full.stdout)[4:]]
    tail_resumed = [deterministic_fields(x) for x in loss_lines(resumed.stdout)]
    assert [t[0] for t in tail_resumed] == ["5", "6", "7", "8"]
    assert tail_resumed == tail_full
    assert eval_lines(resumed.stdout) == eval_lines(full.stdout)[-1:]
    # metrics.jsonl twin holds the same numbers as the wire lines
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if r["kind"] == "loss"]
    assert [f"{r['global_loss']:.9e}" for r in losses] == [t[1] for t in map(deterministic_fields, loss_lines(full.stdout))]


def test_sigterm_checkpoints_at_step_boundary_and_exits_zero(tmp_path):
    """SIGTERM saves the step it ends on and exits 0; --keep-last keeps the most recently written checkpoints and
    `latest` names the newest; --resume auto continues from it."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pretrain", *TINY_FAST, "--num-steps", "100000",
                             "--save-every", "2", "--keep-last", "2", "--run-dir", str(run_dir)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[LOSS] step=3 "):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    text = "".join(seen) + out
    assert "stopped by SIGTERM" in text
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    step = int(latest.split("_")[1])
    assert step >= 3
    # written: every second step, then the step SIGTERM ended on; the last two kept
    written = sorted({*range(2, step + 1, 2), step})
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts == [f"step_{s:08d}" for s in written[-2:]]
    resumed = run_engine("pretrain", *TINY_FAST, "--num-steps", str(step + 2), "--resume", "auto", "--override-schedule",
                         "--run-dir", str(run_dir))
    assert [deterministic_fields(x)[0] for x in loss_lines(resumed.stdout)] == [str(step + 1), str(step + 2)]
    assert "resumed from" in resumed.stdout


def test_divergence_stops_with_report_and_keeps_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_engine("pretrain", *TINY_FAST, "--num-steps", "50", "--lr", "1e12", "--grad-clip", "0",
                      "--warmup-steps", "0", "--save-every", "1", "--keep-last", "100", "--run-dir", str(run_dir), check=False)
    assert proc.returncode == 3, proc.stderr
    assert "training diverged" in proc.stderr and "largest grad norms" in proc.stderr
    bad_step = int(proc.stderr.split("step ")[1].split(":")[0])
    saved = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert saved and max(saved) == bad_step - 1  # the diverged step wrote nothing
    assert f"step_{max(saved):08d}" in proc.stderr


def test_a_non_finite_evaluation_stops_the_run(tmp_path):
    """Fault injection: an evaluation that returns nan over real tokens (as quack's no-grad CE kernel once did on
    GPU, 300 steps of val_loss=nan logged as if it meant something) stops the run with the step and the count."""
    code = ("import sys, engine.train as t; t.evaluate = lambda *a, **k: (float('nan'), float('nan'), 512); "
            "from engine.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "pretrain", *TINY_FAST, "--eval-every", "2",
                           "--run-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "training diverged: step 0: the validation loss over 512 tokens is nan" in proc.stderr
    assert not loss_lines(proc.stdout)  # stopped at the first evaluation, before step 1


def test_export_hf_loads_in_transformers(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    run_dir = trained[0]  # a 3-step run (tests/engine/conftest.py)
    out = tmp_path / "hf"
    run_engine("export-hf", "--checkpoint", str(run_dir / "checkpoints"), "--out", str(out), "--dtype", "float32")
    umask = os.umask(0o022)
    os.umask(umask)
    for f in out.iterdir():  # files to share: what the umask gives a new file (0644 under 022), not 0600
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, (f.name, oct(f.stat().st_mode))
    hf = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    from engine.checkpoint.hf_export import load_full_weights

    cfg, weights = load_full_weights(run_dir / "checkpoints" / "step_00000003")
    from engine.distributed import ParallelState
    from engine.model import build_model
    from engine.ops import resolve_ops

    model = build_model(cfg, ParallelState.single(torch.device("cpu")), resolve_ops(cfg, torch.device("cpu")), torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])
    tokens = torch.randint(0, cfg.vocab_size, (2, 32))
    with torch.no_grad():
        ref = hf(tokens).logits
    # muP scalings folded into the weights: equal up to fp32 rounding of the folded products
    assert ((model.logits(tokens) - ref).norm() / ref.norm()).item() < 1e-5


def test_export_hf_never_replaces_what_it_did_not_write(trained, tmp_path):
    """--out pointing at the save dir, the run dir, a folder inside the checkpoint or a folder with other files is
    refused by name before anything is written (it used to replace the save dir, deleting every checkpoint);
    an earlier export is replaced whole, and no temp folder is left beside it. The trained run (tests/engine/conftest.py)
    is read, never written: the listing of its folder is the same after."""
    from engine.errors import ConfigError
    from engine.checkpoint.hf_export import export_hf

    run_dir = trained[0]
    save_dir = run_dir / "checkpoints"

    def listing(root: Path) -> dict[str, int]:
        return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}

    before = listing(run_dir)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    for out, problem in [(save_dir, "holds files that are not an earlier HF export (latest, step_00000003"),
                         (run_dir, "holds files that are not an earlier HF export (checkpoints, config.json"),
                         (save_dir / "step_00000003" / "hf", "is inside the checkpoint"),
                         (foreign, "holds files that are not an earlier HF export (notes.txt)")]:
        with pytest.raises(ConfigError, match=re.escape(problem)) as err:
            export_hf(str(save_dir), str(out))
        assert err.value.field == "--out"
    assert listing(run_dir) == before and (foreign / "notes.txt").read_text() == "keep me"

    out = tmp_path / "hf"
    export_hf(str(save_dir), str(out), dtype="float32")
    export_hf(str(save_dir / "step_00000003"), str(out), dtype="bfloat16")  # an earlier export: replaced whole
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mine"]


def test_tensorboard_scalars_twin_the_wire_lines(trained):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, stdout = trained  # the shared 3-step run wrote its scalars (tests/engine/conftest.py)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("loss/global_loss")]
    wire = [float(deterministic_fields(x)[1]) for x in loss_lines(stdout)]
    assert len(wire) == 3 and losses == pytest.approx(wire, rel=1e-6)  # TensorBoard stores float32
    assert [e.step for e in events.Scalars("eval/val_loss")] == [0, 1, 2, 3]
