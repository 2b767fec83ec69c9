"""verify_train_run on real tiny CPU runs of the engine: honest runs pass, each cheat is named.

Cheats (one class each): a log edited to claim a lower loss ("val loss"); a run trained at twice
the lr with the printed lr lines (and meta.json) edited back ("learning rate"); a smaller model
("model shape"), also with meta.json edited to claim the expected size (then unreadable as that
size: "checkpoint"); an edited weight decay claim, which must NOT matter.
"""

import shutil

import pytest
import torch

from harness.judge.claims.evidence import (TRAIN_RTOL, VAL_RTOL, batch_rtol, embedded_tokens, estimate_lr, verify_train_run,
                                    _moment_residual)
from tests.judge.runs import DROP_MUP_LR, edit_lines, expected_config, rewrite_meta, train, validation_bytes

SEED = 20261123


@pytest.fixture(scope="module")
def validation():
    return embedded_tokens(validation_bytes())


def verify(run, validation, log=None, expected=None, seed=SEED, **kw):
    return verify_train_run(run.save_dir, expected_config=expected or expected_config(), printed_steps=run.steps(log),
                            printed_evals=run.evals(log), seed=seed, validation=validation, num_samples=64, **kw)


def test_honest_run_passes_with_measured_values(honest, validation):
    for seed in (SEED, 7):  # any seed the judge draws
        ev = verify(honest, validation, seed=seed)
        assert ev.ok, ev.violations
        assert not ev.notes, ev.notes  # every check ran
        assert ev.final_step == 6 and ev.previous_step == 5
        assert ev.judge_val_loss is not None and ev.judge_val_loss_prev is not None
        assert abs(ev.judge_val_loss - ev.claimed_val_loss) / ev.claimed_val_loss < VAL_RTOL / 2
        assert abs(ev.judge_val_loss_prev - ev.claimed_train_loss) / ev.claimed_train_loss < TRAIN_RTOL / 2
        # the fit is far inside its tolerance on an honest run, for every tensor: muP's hidden matrices at
        # lr / (hidden 128 / dim_model_base 32), the embedding, norms and LM head at lr
        assert abs(ev.lr_estimate - ev.lr_claimed) / ev.lr_claimed < 1e-4
        for name, fitted in ev.lr_by_tensor.items():
            want = ev.lr_claimed * (0.25 if name.endswith(("attn.qkv", "attn.o", "mlp.fc1", "mlp.fc2")) else 1.0)
            assert ev.lr_multipliers[name] * ev.lr_claimed == pytest.approx(want, rel=1e-12), name
            assert abs(fitted - want) / want < 1e-3, (name, fitted, want)
        assert ev.wd_estimate == pytest.approx(0.1, rel=1e-3)
        assert ev.moment_residual < 1e-4


def test_claimed_lower_loss_is_caught(honest, validation):
    log = edit_lines(honest.log, "[LOSS]", "global_loss", 0.8, ".9e")
    ev = verify(honest, validation, log=log)
    assert not ev.ok
    text = " ".join(ev.violations)
    assert "val loss" in text and f"{ev.claimed_train_loss:.6g}" in text and f"{ev.judge_val_loss_prev:.6g}" in text
    log = edit_lines(honest.log, "[EVAL]", "val_loss", 0.85, ".9e")
    ev = verify(honest, validation, log=log)
    assert any("val loss" in v and "val_loss" in v for v in ev.violations), ev.violations


def test_a_batch_of_few_sequences_gets_room_for_its_own_noise():
    # fp8-parity's honest bf16 job (minicpm4-0.5b, 4 x 1024 tokens a step, 2 x H200) printed a final loss 11 % from
    # the judge's mean over its windows, past the flat 10 %: its four sequences carry four documents' losses. One
    # window's loss spreading 8 % gives 4 standard errors of a 4-sequence batch = 16 %; a per-token count
    # (3 / sqrt(4096)) gave 4.7 %. Many sequences bring it back to the floor; a line without its token count
    # gets no room at all.
    assert batch_rtol(TRAIN_RTOL, 4096, 1024, 0.08) == pytest.approx(0.16)
    assert batch_rtol(TRAIN_RTOL, 256 * 1024, 1024, 0.08) == TRAIN_RTOL
    assert batch_rtol(TRAIN_RTOL, None, 1024, 0.5) == TRAIN_RTOL
    assert batch_rtol(TRAIN_RTOL, 100, 1024, 0.08) == pytest.approx(0.32)  # less than one sequence: one


@pytest.mark.slow  # ~40 s on 2 cores; an applied lr off the printed one: tests/judge/test_draws.py::test_the_applied_lr_is_fitted_at_every_kept_step
def test_secretly_doubled_lr_is_caught(honest, tmp_path, validation):
    cheat = train(tmp_path / "cheat", lr=2e-2, num_steps=3, warmup_steps=1)  # the expected lr is the preset's 1e-2
    rewrite_meta(cheat.save_dir, lr=1e-2)
    log = edit_lines(cheat.log, "[LOSS]", "lr", 0.5, ".6e")
    # what an honest 3-step run prints at its last step: the cosine has reached min lr (0.1 x the peak)
    assert cheat.steps(log)[-1].lr == pytest.approx(1e-2 * 0.1, rel=1e-6)
    ev = verify(cheat, validation, log=log, expected=expected_config(num_steps=3, warmup_steps=1))
    lr_violations = [v for v in ev.violations if "learning rate" in v]
    assert lr_violations, ev.violations
    assert f"{ev.lr_claimed:.6g}" in lr_violations[0] and f"{ev.lr_estimate:.6g}" in lr_violations[0]
    assert ev.lr_estimate == pytest.approx(2 * ev.lr_claimed, rel=1e-3)
    # the same run printing its lr truthfully: the fit agrees with the print, the expected schedule does not
    ev = verify(cheat, validation, expected=expected_config(num_steps=3, warmup_steps=1))
    assert ev.lr_estimate == pytest.approx(ev.lr_claimed, rel=1e-4)
    assert any("learning rate" in v and "schedule gives" in v for v in ev.violations), ev.violations
    assert verify(cheat, validation, expected=expected_config(num_steps=3, warmup_steps=1, lr=2e-2)).ok


def test_document_masked_run_is_read_with_the_mask_the_milestone_asked_for(tmp_path, validation):
    """A --document-mask run verifies when the expected config asks for the mask (the judge then reads its
    windows with it, with the EOS of its own tokenization); the same run judged against a milestone that asked
    for plain causal attention is a config violation naming the field."""
    run = train(tmp_path / "docs", document_mask=True, reset_position_ids=True)
    ev = verify(run, validation, expected=expected_config(document_mask=True, reset_position_ids=True))
    assert ev.ok, ev.violations
    ev = verify(run, validation, expected=expected_config(document_mask=False, reset_position_ids=False))
    assert any(v.startswith("config:") and "document_mask=True" in v for v in ev.violations), ev.violations
    assert ev.judge_val_loss is None  # another run than the expected one: nothing more is measured


def test_dropped_mup_lr_multipliers_are_caught(tmp_path, validation):
    """An engine that trains the hidden matrices at the printed lr instead of lr / 4 (muP dropped), printing and
    checkpointing everything else honestly: its embedding lr, losses and schedule all check out; only the
    per-tensor multipliers, restated from the expected config, tell."""
    cheat = train(tmp_path / "nomup", prelude=DROP_MUP_LR, num_steps=3, warmup_steps=1)
    ev = verify(cheat, validation, expected=expected_config(num_steps=3, warmup_steps=1))
    assert len(ev.violations) == 1 and ev.violations[0].startswith("learning rate:"), ev.violations
    assert "layers.0.attn.qkv" in ev.violations[0] and "expected lr x 0.25" in ev.violations[0]
    assert ev.lr_estimate == pytest.approx(ev.lr_claimed, rel=1e-4)  # the embedding is honest
    assert ev.lr_by_tensor["layers.3.mlp.fc2"] == pytest.approx(ev.lr_claimed, rel=1e-3)  # 4x its muP lr


@pytest.mark.slow
def test_misstated_weight_decay_does_not_bias_the_lr(tmp_path, validation):
    run = train(tmp_path / "wd", weight_decay=0.3)
    rewrite_meta(run.save_dir, weight_decay=0.1)
    ev = verify(run, validation)
    assert ev.ok, ev.violations
    assert ev.wd_estimate == pytest.approx(0.3, rel=1e-3)


def test_smaller_model_is_caught(tmp_path, validation):
    small = train(tmp_path / "small", hidden_size=64, ffn_hidden_size=192, num_steps=2, warmup_steps=1)
    expected = expected_config(num_steps=2, warmup_steps=1)
    ev = verify(small, validation, expected=expected)
    assert any(v.startswith("model shape") for v in ev.violations), ev.violations
    assert any(v.startswith("config:") and "hidden_size=64" in v for v in ev.violations), ev.violations
    assert ev.judge_val_loss is None  # a wrong-sized model is not evaluated
    # meta.json edited to claim the expected width: the stored tensor sizes still tell
    rewrite_meta(small.save_dir, hidden_size=128, ffn_hidden_size=384)
    ev = verify(small, validation, expected=expected)
    assert not any(v.startswith("config:") for v in ev.violations), ev.violations
    assert any(v.startswith("model shape: optim.master/embed.weight holds") for v in ev.violations), ev.violations
    assert ev.judge_val_loss is None


def test_missing_previous_checkpoint_is_reported(honest, tmp_path, validation):
    copy = tmp_path / "ck"
    shutil.copytree(honest.save_dir, copy)
    shutil.rmtree(copy / "step_00000005")
    run = type(honest)(tmp_path, honest.log, honest.args)
    ev = verify(run, validation)
    assert any("learning rate: cannot be verified" in v for v in ev.violations)
    assert ev.judge_val_loss is not None  # the loss is still checked, against the final weights
    ev = verify(run, validation, require_lr_check=False)
    assert ev.ok and ev.notes


def test_unreadable_or_absent_checkpoints_are_violations(honest, tmp_path, validation):
    run = type(honest)(tmp_path, honest.log, honest.args)
    ev = verify(run, validation)
    assert ev.violations and "holds no complete step_* checkpoint" in ev.violations[0]
    shutil.copytree(honest.save_dir, tmp_path / "ck")
    (tmp_path / "ck" / "step_00000006" / "__0_0.distcp").write_bytes(b"garbage")
    ev = verify(run, validation)
    assert any(v.startswith("checkpoint:") and "step_00000006" in v for v in ev.violations), ev.violations


# --- the lr fit itself, against torch's AdamW (no engine) --------------------------------------------


def _adamw_steps(lr: float, wd: float, steps: int = 4):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(64, 32) * 0.1)
    opt = torch.optim.AdamW([w], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd, foreach=True)
    snaps = []
    for _ in range(steps):
        w.grad = torch.randn_like(w) * torch.rand(64, 1)  # rows of different scale, as embeddings get
        w.grad[:8] = 0  # rows never seen: decay only
        opt.step()
        st = opt.state[w]
        snaps.append((w.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()))
    return snaps


def test_estimate_lr_recovers_torch_adamw():
    snaps = _adamw_steps(lr=3e-3, wd=0.2)
    (w0, m0, v0), (w1, m1, v1) = snaps[-2], snaps[-1]
    lr, lrwd = estimate_lr(w0, w1, m1, v1, t=len(snaps), beta1=0.9, beta2=0.95, eps=1e-8)
    assert lr == pytest.approx(3e-3, rel=1e-5) and lrwd / lr == pytest.approx(0.2, rel=1e-4)
    assert _moment_residual(m0, m1, v0, v1, 0.9, 0.95) < 1e-5
    # a checkpoint whose m was doubled to hide a doubled lr: the lr looks halved, but the moments disagree
    lr_half, _ = estimate_lr(w0, w1, m1 * 2, v1, t=len(snaps), beta1=0.9, beta2=0.95, eps=1e-8)
    assert lr_half == pytest.approx(1.5e-3, rel=1e-4)
    assert _moment_residual(m0 * 2, m1 * 2, v0, v1, 0.9, 0.95) > 0.5
    # m and v rescaled together (m x c, v x c^2) leave m / sqrt(v), hence the lr estimate, unchanged
    assert estimate_lr(w0, w1, m1 * 2, v1 * 4, t=len(snaps), beta1=0.9, beta2=0.95, eps=0.0)[0] == pytest.approx(
        estimate_lr(w0, w1, m1, v1, t=len(snaps), beta1=0.9, beta2=0.95, eps=0.0)[0], rel=1e-9)


def test_prepared_shards_give_the_same_validation_tokens(tmp_path):
    """`engine prepare` of the embedded corpus, read by the judge's shard reader, equals the judge's own
    tokenization of the corpus file (the two data paths a milestone may use agree)."""
    import subprocess
    import sys
    from harness.judge.claims.evidence import shard_tokens
    from tests.judge.runs import REPO
    proc = subprocess.run([sys.executable, "-m", "engine", "prepare", "--out", str(tmp_path / "prep")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shards = shard_tokens(tmp_path / "prep" / "validation")
    assert torch.equal(shards.tokens, embedded_tokens(validation_bytes()).tokens)
    assert shards.vocab_size == 258
    shard = next((tmp_path / "prep" / "validation").glob("tokens-*.bin"))
    shard.write_bytes(shard.read_bytes()[:-2] + b"\x00\x00")
    with pytest.raises(ValueError, match="sha256"):
        shard_tokens(tmp_path / "prep" / "validation")


def test_muon_runs_are_refused_by_name_not_misjudged(tmp_path, validation):
    """--optimizer muon keeps no Adam moments for the hidden matrices: the lr fit and the exact steps cannot
    hold it to account. Asked for by the milestone: one violation that says why and what to do. Not asked for
    (a run that switched optimizer on its own): its meta.json names the optimizer it ran."""
    run = train(tmp_path / "muon", optimizer="muon")
    asked = verify(run, validation, expected=expected_config(optimizer="muon"))
    assert len(asked.violations) == 1 and asked.violations[0].startswith("config: the job's argv asks for --optimizer muon")
    assert "verify = false" in asked.violations[0]
    unasked = verify(run, validation, expected=expected_config(optimizer="adamw"))
    assert any("has optimizer='muon', expected 'adamw'" in v for v in unasked.violations), unasked.violations
