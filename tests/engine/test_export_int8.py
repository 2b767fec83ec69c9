"""`python -m engine export-int8` (issue 14): per-row int8 + zlib in one file, its round trip and evaluation.

References and tolerances:
- quantisation against numpy in float64: the scale of a row is max |row| / 127 (rel. 1e-6: one fp32 division),
  and every weight reads back within scale / 2 of itself, plus one fp32 rounding of the product q x scale
  (2^-23 x |w|);
- the loaded file against the numpy round trip of the checkpoint's own weights (load_full_weights): the same
  values, except that a weight at a rounding tie (w / scale within fp32 rounding of x.5) may land one step
  away (at most 1 in 1000 weights; observed 1 in 98,304); the fp32 tensors (norm gains, small matrices) bit
  for bit;
- logits of the round-tripped model against the checkpoint's: rel. Frobenius error in (1e-4, 3e-2) with every
  2-D tensor in int8 (observed 9.2e-3 on the tiny preset after 3 steps: each weight is off by up to half of
  1/127 of its row's largest, and these logits are small, ~0.1 each, so the relative error is large), and
  within a twentieth of that error of a model built from the numpy round trip (the same weights but the
  few rounding ties; observed 1.3e-5);
- the export's evaluation of the ORIGINAL weights equals the training run's own final [EVAL] (the same
  evaluation path on the same weights; 1e-6 absolute at the printed %.6f).
"""

import re
import struct

import numpy as np
import pytest
import torch

from engine.errors import ConfigError
from engine.checkpoint.hf_export import load_full_weights
from engine.checkpoint.int8_export import MAGIC, load_int8, model_from_weights, quantize_rows
from tests.engine.helpers import eval_lines, run_engine, run_engine_batch
from tests.once import once_per_run


def reference_round_trip(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(dequantised weights, scales) by numpy in float64: symmetric per-row int8."""
    a = w.double().numpy()
    scale = np.abs(a).max(axis=1) / 127.0
    q = np.clip(np.rint(a / np.where(scale > 0, scale, 1.0)[:, None]), -127, 127)
    return q * scale[:, None], scale


def test_per_row_error_is_at_most_half_a_step():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 300, generator=gen) * torch.logspace(-4, 2, 64)[:, None]  # rows over six decades
    w[5] = 0.0
    w[9, 17] = 1e4  # one outlier: its row's step is large, the other rows keep theirs
    q, scale = quantize_rows(w)
    ref_deq, ref_scale = reference_round_trip(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    np.testing.assert_allclose(scale.double().numpy(), ref_scale, rtol=1e-6)
    deq = q.double() * scale.double()[:, None]
    bound = scale.double()[:, None] / 2 + 2.0 ** -23 * w.double().abs()
    assert bool(((deq - w.double()).abs() <= bound).all())
    assert bool((deq[5] == 0).all())
    np.testing.assert_allclose(deq.numpy(), ref_deq, rtol=0, atol=float(scale.max()) * 1e-3)


@pytest.fixture(scope="session")
@once_per_run
def exported(trained, tmp_path_factory):
    """`engine export-int8` of the trained checkpoint with the default threshold, evaluated on the CPU in fp32: the file
    and what the command printed."""
    _, ckpt, _ = trained
    out = tmp_path_factory.mktemp("exported") / "model.int8"
    proc = run_engine("export-int8", "--checkpoint", str(ckpt), "--out", str(out), "--device", "cpu")
    return out, proc.stdout


@pytest.fixture(scope="session")
@once_per_run
def int8_cli(trained, exported, tmp_path_factory):
    """eval-int8 of the export, of a corrupt copy and of a missing file, and export-int8 with a bad flag, each as
    `python -m engine ...` runs it, all in one process (tests/engine/engine_batch.py: torch is imported once)."""
    _, ckpt, _ = trained
    tmp = tmp_path_factory.mktemp("int8_cli")
    flipped = bytearray(exported[0].read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    (tmp / "bad.int8").write_bytes(bytes(flipped))
    cases = {"eval": ["eval-int8", "--int8", str(exported[0]), "--device", "cpu"],
             "eval corrupt": ["eval-int8", "--int8", str(tmp / "bad.int8")],
             "eval missing": ["eval-int8", "--int8", str(tmp / "none.int8")],
             "bad flag": ["export-int8", "--checkpoint", str(ckpt), "--out", str(tmp / "x.int8"), "--quantize-min-numel", "0"]}
    return tmp, dict(zip(cases, run_engine_batch(list(cases.values()))))


def test_export_round_trip_and_evaluation(trained, tmp_path):
    run_dir, ckpt, train_out = trained
    out = tmp_path / "model.int8"
    # --device cpu: the run trained and evaluated on the CPU in fp32; on a GPU machine 'auto' would evaluate in bf16
    proc = run_engine("export-int8", "--checkpoint", str(ckpt), "--out", str(out), "--quantize-min-numel", "1024",
                      "--device", "cpu")
    size = int(re.search(r"-> \S+: ([\d,]+) bytes", proc.stdout).group(1).replace(",", ""))
    assert size == out.stat().st_size and out.read_bytes().startswith(MAGIC)
    m = re.search(r"val_loss (\S+) -> (\S+) \((\S+)\), val_bpb (\S+) -> (\S+) \((\S+)\)", proc.stdout)
    assert m, proc.stdout
    trained_loss = float(re.search(r"val_loss=(\S+)", eval_lines(train_out)[-1]).group(1))
    assert abs(float(m.group(1)) - trained_loss) < 1e-6
    assert abs(float(m.group(6)) - (float(m.group(5)) - float(m.group(4)))) < 2e-6
    assert 0 < abs(float(m.group(6))) < 0.05  # int8 costs something, and little

    cfg, original = load_full_weights(ckpt)
    loaded_cfg, loaded = load_int8(out)
    assert loaded_cfg.hidden_size == cfg.hidden_size and sorted(loaded) == sorted(original)
    reference = {}
    for name, w in original.items():
        if w.dim() == 2:  # 1024 elements or more: every 2-D tensor of the tiny preset
            deq, scale = (torch.from_numpy(a) for a in reference_round_trip(w))
            reference[name] = deq.float()
            off = (loaded[name].double() - deq).abs() / scale[:, None].clamp_min(1e-30)
            # fp32 w / scale may round a near-tie (x.5) the other way than float64: one step, on a few weights
            assert bool((off <= 1 + 1e-5).all()) and (off > 1e-5).float().mean().item() < 1e-3, name
            assert not torch.equal(loaded[name], w), name
        else:
            reference[name] = w
            assert torch.equal(loaded[name], w), name
    tokens = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(7))
    cpu = torch.device("cpu")
    base = model_from_weights(cfg, original, cpu, torch.float32).logits(tokens)
    got = model_from_weights(loaded_cfg, loaded, cpu, torch.float32).logits(tokens)
    ref = model_from_weights(cfg, reference, cpu, torch.float32).logits(tokens)
    int8_error = ((got - base).norm() / base.norm()).item()
    assert 1e-4 < int8_error < 3e-2, int8_error
    assert ((got - ref).norm() / ref.norm()).item() < int8_error / 20


def test_eval_int8_verifies_and_evaluates_an_export(exported, int8_cli):
    """`engine eval-int8` reads an export back from the command line: the same val_loss / val_bpb as the export's
    own round trip (the same evaluation, on CPU in fp32: equal to the printed digits); a corrupt file is refused in
    one line, exit 2, before anything is unpickled."""
    _, runs = int8_cli
    m = re.search(r"val_loss \S+ -> (\S+) \(\S+\), val_bpb \S+ -> (\S+) \(", exported[1])
    checked = runs["eval"]
    assert checked.returncode == 0 and "checksum verified" in checked.stdout, checked.stdout + checked.stderr
    got = re.search(r"\[EVAL-INT8\] val_loss=(\S+) val_bpb=(\S+) over (\d+) tokens", checked.stdout)
    assert got and (got.group(1), got.group(2)) == (m.group(1), m.group(2)), (checked.stdout, exported[1])
    bad = runs["eval corrupt"]
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "is corrupt" in bad.stderr, bad.stderr
    missing = runs["eval missing"]
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_default_threshold_keeps_small_tensors_in_fp32(trained, exported):
    _, ckpt, _ = trained
    _, original = load_full_weights(ckpt)
    _, loaded = load_int8(exported[0])
    for name, w in original.items():
        assert torch.equal(loaded[name], w) == (w.dim() != 2 or w.numel() < 65_536), name


def test_truncated_or_corrupt_files_are_refused(exported, tmp_path):
    data = exported[0].read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    cases = {"truncated.int8": (data[:-100], "is truncated or padded"), "header.int8": (data[:20], "is truncated ("),
             "flipped.int8": (bytes(flipped), "is corrupt"), "other.int8": (b"PK\x03\x04" + data[4:], "not an int8 export"),
             "version.int8": (MAGIC + struct.pack("<I", 9) + data[len(MAGIC) + 4:], "format version 9")}
    for name, (content, fragment) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            load_int8(tmp_path / name)


def test_the_write_is_atomic(trained, tmp_path):
    """The file is written beside the target and renamed over it (engine/atomic_files.py): when the write cannot
    complete, the previous export is left whole and nothing half-written takes its name."""
    import os

    from engine.checkpoint.int8_export import export_int8

    _, ckpt, _ = trained
    out = tmp_path / "model.int8"
    out.write_bytes(MAGIC + b"previous export")
    (tmp_path / f".model.int8.tmp-{os.getpid()}").mkdir()  # where the engine's atomic writer stages the file
    with pytest.raises(IsADirectoryError):
        export_int8(str(ckpt), str(out), eval_samples=0)
    assert out.read_bytes() == MAGIC + b"previous export"


def test_never_replaces_a_file_that_is_not_an_export(trained, tmp_path):
    """--out naming another file (a checkpoint's own, a model, notes) or a path inside the checkpoint is refused
    before anything is written; the checkpoint still verifies."""
    from engine.checkpoint.store import select_checkpoint
    from engine.checkpoint.int8_export import export_int8

    _, ckpt, _ = trained
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    for out, problem in [(notes, "is a file that is not an int8 export"),
                         (ckpt / "meta.json", "is inside the checkpoint"),
                         (ckpt / "model.int8", "is inside the checkpoint"),
                         (tmp_path, "is a folder")]:
        with pytest.raises(ConfigError, match=problem) as err:
            export_int8(str(ckpt), str(out), eval_samples=0)
        assert err.value.field == "--out"
    assert notes.read_text() == "keep me" and not (ckpt / "model.int8").exists()
    select_checkpoint(str(ckpt), ckpt, flag="--checkpoint")  # its manifest still verifies


def test_bad_flags_are_one_line(int8_cli):
    tmp, runs = int8_cli
    proc = runs["bad flag"]
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --quantize-min-numel=0 is out of range: use a positive number of elements (default 65536)"]
    assert not (tmp / "x.int8").exists()
