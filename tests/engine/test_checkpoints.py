"""Checkpoints that cannot lie (issue 13): write order, checksums, metrics.jsonl after a resume, schedule
changes on resume, asynchronous saves. Real runs of the CLI (subprocesses), real kills.

The reference for every resumed run is the uninterrupted run's own [LOSS] lines, bit for bit: a resume
that restored everything is the same computation (tests/engine/test_runs.py::test_resume_is_bitwise).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.optim.schedule import lr_at
from engine.config import EngineConfig
from tests.engine.helpers import REPO, TINY_FAST, deterministic_fields, loss_lines, run_engine, run_engine_batch
from tests.once import once_per_run

FAST = [*TINY_FAST, "--eval-samples", "0"]


def _steps(stdout: str) -> list[tuple[str, ...]]:
    return [deterministic_fields(x) for x in loss_lines(stdout)]


def _run_until(args: list[str], line_prefix: str, sig: int, *, then_wait_for: Path | None = None) -> str:
    """Start `engine pretrain ARGS`, send `sig` once a stdout line starts with `line_prefix` (and, if given,
    once `then_wait_for` exists); return everything it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "engine", "pretrain", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(line_prefix):
            deadline = time.monotonic() + 60
            while then_wait_for is not None and not then_wait_for.exists() and time.monotonic() < deadline:
                time.sleep(0.001)
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    assert seen and seen[-1].startswith(line_prefix), "".join(seen) + out + err
    return "".join(seen) + out


@pytest.fixture(scope="session")
@once_per_run
def base(tmp_path_factory) -> tuple[Path, list[tuple[str, ...]]]:
    """4 steps, checkpoints at 2 and 4 (each test works on a copy): the reference [LOSS] lines."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    proc = run_engine("pretrain", *FAST, "--num-steps", "4", "--save-every", "2", "--keep-last", "10",
                      "--run-dir", str(run_dir))
    return run_dir, _steps(proc.stdout)


def _copy(base: tuple[Path, list], tmp_path: Path) -> tuple[Path, Path, list[tuple[str, ...]]]:
    run_dir = tmp_path / "run"
    shutil.copytree(base[0], run_dir)
    return run_dir, run_dir / "checkpoints", base[1]


def test_resuming_an_older_checkpoint_prunes_by_write_order(base, tmp_path):
    """The reported scenario: a run reaches step 4; it is resumed from step 2 with --keep-last 1 and
    dies after writing step 3. Pruning by step number deleted step 3 (keeping the abandoned step 4),
    and --resume auto then continued the abandoned run. By write order step 3 is the one kept."""
    run_dir, ckpts, reference = _copy(base, tmp_path)
    _run_until([*FAST, "--num-steps", "4", "--save-every", "1", "--keep-last", "1", "--resume",
                str(ckpts / "step_00000002"), "--run-dir", str(run_dir)], "[CKPT] step=3 ", signal.SIGKILL)
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_")) == ["step_00000003"]
    assert (ckpts / "latest").read_text().strip() == "step_00000003"
    resumed = run_engine("pretrain", *FAST, "--num-steps", "4", "--save-every", "1", "--keep-last", "1",
                         "--resume", "auto", "--run-dir", str(run_dir))
    assert f"resumed from {ckpts / 'step_00000003'} at step 3" in resumed.stdout
    assert _steps(resumed.stdout) == reference[3:]
    # metrics.jsonl: the killed run logged step 3 (maybe 4) again; each step is there once, as first run
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [f"{r['global_loss']:.9e}" for r in records] == [s[1] for s in reference]


def _damage(shard: Path, offset: int) -> None:
    """A same-size overwrite: 64 bytes in the middle of a shard replaced by their complement."""
    data = bytearray(shard.read_bytes())
    data[offset:offset + 64] = bytes(255 - b for b in data[offset:offset + 64])
    shard.write_bytes(bytes(data))


def _damage_newest_shard(ckpts: Path) -> Path:
    shard = ckpts / "step_00000004" / "__0_0.distcp"
    size = shard.stat().st_size
    _damage(shard, size // 2)
    assert shard.stat().st_size == size
    return shard


def _tree(folder: Path) -> dict[str, bytes] | None:
    """Every file under `folder` and its bytes; None when there is no such folder."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
@once_per_run
def refused(base, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path, dict | None]]:
    """The resumes that must be refused, each `python -m engine pretrain ...` as the CLI runs it, all in one process
    (tests/engine/engine_batch.py: torch is imported once, not once per refusal): case -> (the run, its --run-dir,
    what that folder held before)."""
    tmp = tmp_path_factory.mktemp("refused")
    damaged = _copy(base, tmp / "damaged")[1]
    _damage_newest_shard(damaged)
    truncated = _copy(base, tmp / "truncated")[1] / "step_00000004"
    for shard in truncated.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    earlier = _copy(base, tmp / "earlier")[0]
    unverified, unverified_ckpts, _ = _copy(base, tmp / "unverified")
    for manifest in unverified_ckpts.glob("step_*/manifest.json"):
        manifest.unlink()
    step2 = str(base[0] / "checkpoints" / "step_00000002")
    cases = {  # case -> (flags after FAST, --run-dir)
        "same-size overwrite": (["--num-steps", "4", "--resume", str(damaged / "step_00000004")], tmp / "explicit"),
        "nothing verifies": (["--num-steps", "4", "--resume", "auto"], unverified),
        "truncated shards": (["--num-steps", "4", "--resume", str(truncated)], tmp / "after-truncated"),
        "fresh run over checkpoints": (["--num-steps", "4", "--seed", "7"], earlier),
        "schedule change": (["--num-steps", "6", "--lr", "0.02", "--resume", step2], tmp / "schedule"),
        "muP change": (["--num-steps", "4", "--dim-model-base", "64", "--resume", step2], tmp / "mup"),
        "seq-length change": (["--num-steps", "4", "--seq-length", "32", "--resume", step2], tmp / "seq"),
    }
    before = {case: _tree(run_dir) for case, (_, run_dir) in cases.items()}
    runs = run_engine_batch([["pretrain", *FAST, *flags, "--run-dir", str(run_dir)] for flags, run_dir in cases.values()])
    return {case: (run, run_dir, before[case]) for (case, (_, run_dir)), run in zip(cases.items(), runs)}


def _one_line_refusal(refused: dict, case: str) -> str:
    """The case's only stderr line; exit 2, and its --run-dir is as it was (absent stays absent)."""
    run, run_dir, before = refused[case]
    assert run.returncode == 2, (case, run.stdout[-2000:] + run.stderr)
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, (case, run.stderr)
    assert _tree(run_dir) == before, f"{case}: a refused run must write nothing"
    return lines[0]


def test_same_size_overwrite_is_named_and_auto_falls_back(base, refused, tmp_path):
    line = _one_line_refusal(refused, "same-size overwrite")
    assert "step_00000004/__0_0.distcp bytes 0.." in line and "fails verification" in line, line

    run_dir, ckpts, reference = _copy(base, tmp_path)
    _damage_newest_shard(ckpts)
    auto = run_engine("pretrain", *FAST, "--num-steps", "4", "--save-every", "2", "--resume", "auto",
                      "--run-dir", str(run_dir))
    skipped = [x for x in auto.stdout.splitlines() if x.startswith("[CKPT] skipped")]
    assert len(skipped) == 1 and "step_00000004" in skipped[0] and "__0_0.distcp" in skipped[0], auto.stdout
    assert f"resumed from {ckpts / 'step_00000002'} at step 2" in auto.stdout
    assert _steps(auto.stdout) == reference[2:]


def test_no_checkpoint_that_verifies_is_an_error_not_a_fresh_start(refused):
    proc, run_dir, before = refused["nothing verifies"]
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "found no checkpoint" in proc.stderr and "has no manifest.json" in proc.stderr, proc.stderr
    assert not _steps(proc.stdout)
    assert _tree(run_dir) == before


def test_truncated_checkpoint_shards(refused):
    line = _one_line_refusal(refused, "truncated shards")
    assert "--resume" in line and "step_00000004" in line, line


def test_fresh_run_into_a_save_dir_with_checkpoints(refused):
    """Without --resume, a second run in the same folder would overwrite the first one's checkpoints step by
    step (and --keep-last would prune the rest): refused before anything is written (--resume auto continues:
    test_same_size_overwrite_is_named_and_auto_falls_back)."""
    run_dir = refused["fresh run over checkpoints"][1]
    assert _one_line_refusal(refused, "fresh run over checkpoints") == (
        f"error: --save-dir={str(run_dir / 'checkpoints')!r} already holds checkpoints of an earlier run (newest "
        "step_00000004): pass --resume auto to continue that run, or give this run its own --run-dir (or --save-dir); "
        "delete them to start over in the same place")


def test_schedule_change_on_resume_is_refused(refused):
    line = _one_line_refusal(refused, "schedule change")
    assert "--lr 0.01 -> 0.02" in line and "--num-steps 4 -> 6" in line and "--override-schedule" in line, line


def test_a_muP_scaling_change_on_resume_is_refused(base, refused):
    """--dim-model-base sets the hidden matrices' learning rate and the logits' scale: a resume that changes it
    would continue other weights under another model, so it is refused like a shape change."""
    line = _one_line_refusal(refused, "muP change")
    assert line == ("error: --dim-model-base=64 differs from the checkpoint: use 32 as in the checkpoint "
                    f"{base[0] / 'checkpoints' / 'step_00000002'}, or start a new run"), line
    # another --seq-length: named as that flag with the checkpoint's value, not as a value of --resume
    line = _one_line_refusal(refused, "seq-length change")
    assert line == ("error: --seq-length=32 differs from the checkpoint (its data position counts windows of that "
                    f"length): use --seq-length 64 as in the checkpoint {base[0] / 'checkpoints' / 'step_00000002'}, "
                    "or start a new run"), line


@pytest.mark.slow
def test_schedule_override_is_recorded_and_followed(base, tmp_path):
    ckpt = base[0] / "checkpoints" / "step_00000002"
    out = tmp_path / "override"
    accepted = run_engine("pretrain", *FAST, "--num-steps", "6", "--lr", "0.02", "--resume", str(ckpt),
                          "--override-schedule", "--run-dir", str(out))
    assert "[RUN] schedule overridden at step 2 (--override-schedule): lr 0.01 -> 0.02, num_steps 4 -> 6" in accepted.stdout
    meta = json.loads((out / "checkpoints" / "step_00000006" / "meta.json").read_text())
    assert meta["schedule_overrides"] == [{"step": 2, "changes": {"lr": [0.01, 0.02], "num_steps": [4, 6]}}]
    assert meta["config"]["override_schedule"] is True
    # the steps after the resume follow the new schedule: step k prints lr_at(new config, k - 1); %.6e
    new = EngineConfig(lr=0.02, num_steps=6, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1)
    assert [float(s[3]) for s in _steps(accepted.stdout)] == pytest.approx([lr_at(new, k) for k in range(2, 6)], rel=1e-6)

    # a constant schedule does not read --num-steps: extending such a run needs no flag
    const = tmp_path / "const"
    run_engine("pretrain", *FAST, "--num-steps", "2", "--lr-schedule", "constant", "--run-dir", str(const))
    more = run_engine("pretrain", *FAST, "--num-steps", "3", "--lr-schedule", "constant", "--resume", "auto",
                      "--run-dir", str(const))
    assert [s[0] for s in _steps(more.stdout)] == ["3"]


def test_metrics_truncation_survives_a_kill_mid_rewrite(tmp_path):
    """Kill the rewrite the moment metrics.jsonl changes on disk: it is the old file or the new, never a
    torn one. A rewrite in place would be seen half-written (60 MB take far longer than one poll)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    record = {"kind": "loss", "global_loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 256, "time_s": 0.1,
              "mfu": 0.0, "peak_mem_gib": 0.0, "pad": "x" * 120}
    old = "".join(json.dumps({**record, "step": i}) + "\n" for i in range(1, 300_001))
    path.write_text(old)
    new = "".join(json.dumps({**record, "step": i}) + "\n" for i in range(1, 150_001))
    before = os.stat(path)
    code = f"from engine.step_log import keep_through_step; from pathlib import Path; keep_through_step(Path({str(path)!r}), 150000)"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    while proc.poll() is None:
        now = os.stat(path)
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns):
            proc.kill()
            break
        time.sleep(0.001)
    proc.wait(timeout=60)
    assert path.read_text() in (old, new)
    # torn last line (a kill mid-append) is dropped with the later steps
    head = "".join(new.splitlines(keepends=True)[:3])
    path.write_text(head + '{"kind": "loss", "st')
    from engine.step_log import keep_through_step
    assert keep_through_step(path, 5) == 1 and path.read_text() == head


def test_latest_names_a_checkpoint_at_every_instant_and_kill_leftovers_are_removed(base, tmp_path):
    """A writer rewriting `latest` as fast as it can, SIGKILLed mid-stream: every read in between sees a whole name
    (write new, fsync, rename; never removed first). What kills leave (`.latest.tmp-<pid>`, a `step_N.tmp` folder, a
    folder set aside by a re-save) is removed when the next run starts, and only that."""
    run_dir, ckpts, _ = _copy(base, tmp_path)
    code = ("import itertools; from pathlib import Path; from engine.atomic_files import write_text_atomic\n"
            f"for i in itertools.count(): write_text_atomic(Path({str(ckpts / 'latest')!r}), f'step_{{i % 7:08d}}\\n')")
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    seen = set()
    try:
        while len(seen) < 5 and writer.poll() is None:  # several rewrites observed
            text = (ckpts / "latest").read_text()
            assert len(text) == 14 and text.startswith("step_") and text.endswith("\n"), repr(text)
            seen.add(text)
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert len(seen) >= 5
    (ckpts / "latest").write_text("step_00000004\n")
    (ckpts / ".latest.tmp-4242").write_text("step_000")  # a kill between the temp file's write and its rename
    (ckpts / "step_00000006.tmp").mkdir()  # a kill mid-save
    (ckpts / "step_00000006.tmp" / "__0_0.distcp").write_bytes(b"x" * 10)
    (ckpts / ".step_00000002.old-4242-0a1b2c3d").mkdir()  # a kill between replace_dir's two renames
    (ckpts / "notes.txt").write_text("mine")
    kept = sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".") and not p.name.endswith(".tmp"))
    killed = [f".latest.tmp-{writer.pid}"] * (ckpts / f".latest.tmp-{writer.pid}").exists()  # where the kill landed
    proc = run_engine("pretrain", *FAST, "--num-steps", "4", "--save-every", "2", "--keep-last", "10", "--resume", "auto",
                      "--run-dir", str(run_dir))
    planted = [".latest.tmp-4242", ".step_00000002.old-4242-0a1b2c3d", "step_00000006.tmp"]
    assert f"removed what interrupted saves left in {ckpts}: {', '.join(sorted(planted + killed))}\n" in proc.stdout
    assert sorted(p.name for p in ckpts.iterdir()) == kept and (ckpts / "latest").read_text() == "step_00000004\n"


def _big(*extra: str) -> list[str]:
    """~8M parameters (a 100 MB checkpoint): writing it takes long enough to be killed in the middle."""
    return [*FAST, "--hidden-size", "512", "--num-heads", "8", "--num-kv-heads", "4", "--head-dim", "64",
            "--ffn-hidden-size", "2048", "--num-layers", "2", "--micro-batch-size", "2", *extra]


def test_async_save_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    args = _big("--num-steps", "4", "--save-every", "2", "--async-save", "--run-dir", str(run_dir))
    text = _run_until(args, "[CKPT] step=4 staged", signal.SIGKILL, then_wait_for=ckpts / "step_00000004.tmp")
    assert "[CKPT] step=2 path=" in text  # the first save completed and was reported
    assert not (ckpts / "step_00000004").exists(), "the kill landed after the write: nothing was tested"
    assert (ckpts / "latest").read_text().strip() == "step_00000002"
    resumed = run_engine("pretrain", *_big("--num-steps", "4", "--save-every", "2", "--async-save", "--resume", "auto",
                                           "--run-dir", str(run_dir)))
    assert f"resumed from {ckpts / 'step_00000002'} at step 2" in resumed.stdout
    assert [s[0] for s in _steps(resumed.stdout)] == ["3", "4"]
    assert not (ckpts / "step_00000004.tmp").exists()  # the stale folder of the killed write was replaced, then published
    assert (ckpts / "latest").read_text().strip() == "step_00000004"


@pytest.mark.slow
def test_async_save_writes_what_a_blocking_save_writes(tmp_path):
    """Same losses, the same checkpoint tensors, resumable bit for bit; SIGTERM waits for the save in flight."""
    from engine.checkpoint.hf_export import load_full_weights

    blocking = run_engine("pretrain", *FAST, "--num-steps", "6", "--save-every", "2", "--keep-last", "5",
                          "--run-dir", str(tmp_path / "blocking"))
    run_dir = tmp_path / "async"
    asynchronous = run_engine("pretrain", *FAST, "--num-steps", "6", "--save-every", "2", "--keep-last", "5",
                              "--async-save", "--run-dir", str(run_dir))
    assert _steps(asynchronous.stdout) == _steps(blocking.stdout)
    for step in (2, 4, 6):
        name = f"step_{step:08d}"
        assert f"[CKPT] step={step} path={run_dir / 'checkpoints' / name} write_s=" in asynchronous.stdout
        _, a = load_full_weights(run_dir / "checkpoints" / name)
        _, b = load_full_weights(tmp_path / "blocking" / "checkpoints" / name)
        assert all(a[k].equal(b[k]) for k in b)
    resumed = run_engine("pretrain", *FAST, "--num-steps", "6", "--async-save", "--resume",
                         str(run_dir / "checkpoints" / "step_00000004"), "--run-dir", str(tmp_path / "resumed"))
    assert _steps(resumed.stdout) == _steps(blocking.stdout)[4:]

    stopped = tmp_path / "stopped"
    text = _run_until([*FAST, "--num-steps", "100000", "--save-every", "1", "--async-save", "--run-dir", str(stopped)],
                      "[LOSS] step=3 ", signal.SIGTERM)
    assert "stopped by SIGTERM" in text
    latest = (stopped / "checkpoints" / "latest").read_text().strip()
    assert f"[CKPT] step={int(latest[5:])} path=" in text  # reported as written before the exit
    assert (stopped / "checkpoints" / latest / "manifest.json").is_file()


def _async_snapshot_is_the_save_step(device: str, tmp_path: Path, **overrides) -> None:
    """In one process: save at step 2 with --async-save, train on at once (changing the masters and moments
    the save copied), then read the checkpoint back: it must hold the step-2 state exactly, as copied
    before the save returned. A save writing the live tensors would hold a later step's values."""
    import torch

    from engine.distributed import ParallelState
    from engine.checkpoint.hf_export import load_full_weights
    from engine.train import Trainer
    from tests.parallel.workers import make_config

    cfg = make_config({"device": device, "async_save": True, "num_steps": 4, **overrides}, 1, str(tmp_path))
    trainer = Trainer(cfg, ParallelState.single(torch.device(device)), torch.float32)
    try:
        for _ in range(2):
            trainer.train_step()
            trainer.step += 1
        trainer.param_gather.wait_all()
        at_save = {n: p.detach().float().cpu().clone() for n, p in trainer.model.named_parameters()}
        assert trainer.save() is None  # async: published later
        trainer.train_step()  # the background write overlaps this step
        trainer.step += 1
        finished = trainer.saver.wait()
        assert finished is not None and finished.step == 2
        _, saved = load_full_weights(finished.path)
        assert set(saved) == set(at_save)
        assert all(torch.equal(saved[n], at_save[n]) for n in at_save)
        after = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
        assert any(not torch.equal(after[n], at_save[n]) for n in at_save)  # training did move on
    finally:
        trainer.metrics.close()


def test_async_save_copies_the_state_of_its_step(tmp_path):
    _async_snapshot_is_the_save_step("cpu", tmp_path)


@pytest.mark.gpu
def test_async_save_copies_the_state_of_its_step_on_cuda(tmp_path):
    """Pinned host buffers, non-blocking device-to-host copies, one synchronize before the thread starts."""
    _async_snapshot_is_the_save_step("cuda", tmp_path, **{f"op_{op}": "baseline" for op in
                                                          ("attention", "rmsnorm", "gemm_fc1", "gemm_output")})
