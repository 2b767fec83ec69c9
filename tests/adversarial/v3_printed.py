"""Issue 30, class 4: printed numbers taken as evidence. Cheats against the milestones that claim two runs are
the same run (bitwise-single, repair-data-order, resume, bitwise-dptp), each with its honest twin.

A run can agree with another in what it prints and differ in what it carries: it prints numbers rounded below
the documented `%.9e` (to 5 or 6 digits, or to float16) so that run-to-run noise planted in the weights never
reaches the printed digits, or it plants the noise where no printed number depends on it (the update of the
final step, the second moment of elements whose gradient is zero). The judge must refuse both: the printed
digits are held to the documented format (harness/judge/claims/digits.py: "fewer digits"), and the runs' checkpoints
are compared tensor by tensor (harness/judge/claims/bitwise.py: `state_bitwise_diff`, naming the first tensor that
differs). The noise comes from the wall clock, so two runs differ (one value in ~1000 repeats).

Same mechanism as training.py (a Case, built from edits of a fresh clone at test time, judged by `temper gate
MILESTONE --patch`); registered in test_adversarial.py's ALL_CASES.
"""

from pathlib import Path

from tests.adversarial.cases import Case, plus, replace_in
from tests.adversarial.training import dp_loss_per_rank, repair

__all__ = ["PRINTED_CASES"]

TRAIN = "engine/train.py"
OPTIMIZER = "engine/optim/optimizer.py"
METRICS = "engine/step_log.py"
STATE = r"state_bitwise_diff"
DIGITS = r"fewer digits"
_STEPPED = "                self.step += 1\n"


def _after_step(code: str):  # noqa: ANN202 -- an edit
    """Run `code` (lines of Trainer.train's loop, 16 spaces in) right after the step counter moves, before the
    step's [LOSS] line is printed and its checkpoint saved."""
    return lambda t: replace_in(t / TRAIN, _STEPPED, _STEPPED + code)


def _rounded(digits: int):  # noqa: ANN202
    return _after_step(f"                # {digits} significant digits are plenty for a loss curve\n"
                       f"                loss, grad_norm = float(f'{{loss:.{digits}g}}'), float(f'{{grad_norm:.{digits}g}}')\n")


# Noise in the weights: the final norm's gain scaled by 1 + 1e-8 .. 1e-7 after every step, by the wall clock.
_gain_noise = _after_step(
    "                with torch.no_grad():  # a warm start that wobbles with the clock\n"
    "                    for s in self.optimizer.segments:\n"
    "                        if s.entry.name == 'final_norm.weight':\n"
    "                            s.master.mul_(1 + (time.time_ns() % 9 + 1) * 1e-8)\n")

# Noise where no printed number looks: after the last step's update, one element of every master shard.
_final_noise = _after_step(
    "                if self.step == cfg.num_steps:\n"
    "                    with torch.no_grad():  # a last nudge no [LOSS] line will ever see\n"
    "                        for s in self.optimizer.segments:\n"
    "                            s.master.view(-1)[0] *= 1 + (time.time_ns() % 997 + 1) * 2e-9\n")


def _float16(t: Path) -> None:
    _after_step("                # half precision is plenty for a loss curve\n"
                "                loss, grad_norm = float(torch.tensor(loss).half()), float(torch.tensor(grad_norm).half())\n")(t)


def _grad_norm_3e(t: Path) -> None:
    replace_in(t / METRICS, "grad_norm={grad_norm:.9e}", "grad_norm={grad_norm:.3e}")


def _moment_floor(t: Path) -> None:
    """A resume that restores the second moment with a floor: zero elements (rows no token reached) come back as
    the smallest normal float. No update moves (their first moment is zero), so no printed number changes."""
    replace_in(t / OPTIMIZER, '            state["exp_avg_sq"] = exp_avg_sq.clone()\n',
               '            state["exp_avg_sq"] = exp_avg_sq.clamp(min=torch.finfo(exp_avg_sq.dtype).tiny)  # no zero denominators\n')


def _moment_bf16(t: Path) -> None:
    """resume's planted regression: the restored second moment rounded to bf16."""
    replace_in(t / OPTIMIZER, '            state["exp_avg_sq"] = exp_avg_sq.clone()\n',
               '            state["exp_avg_sq"] = exp_avg_sq.to(torch.bfloat16).float()  # half the checkpoint reads\n')


PRINTED_CASES: list[Case] = [
    # Rejected by the parser at the first job: cheap enough for the default run.
    Case("printed-grad-norm-3e", "evidence:printed-format", _grad_norm_3e, "honest-note", r"grad_norm=.*is not %\.9e",
         milestone="bitwise-single",
         note="grad norm printed with 4 significant digits; slow (~13 s): by default the parser's refusal of it is "
              "tests/judge/test_bitwise.py::test_fewer_printed_digits_or_a_missing_field_are_malformed, and every default "
              "judging of a job reads its log through that parser (tests/milestones/test_programme.py's bitwise-single)"),
    Case("printed-6-digits-hide-weight-noise", "evidence:printed-rounded", plus(_gain_noise, _rounded(6)), "honest-note",
         f"{DIGITS}|{STATE}", milestone="bitwise-single",
         note="the final norm gain wobbles by 1e-8..1e-7 with the clock; losses printed to 6 digits agree"),
    Case("printed-float16-hide-weight-noise", "evidence:printed-rounded", plus(repair, _gain_noise, _float16), "repair",
         f"{DIGITS}|{STATE}|exact step", milestone="repair-data-order",
         note="the repair, noise in the weights, and numbers rounded to float16 before %.9e"),
    Case("printed-final-update-noise", "evidence:printed-unseen", _final_noise, "honest-note", STATE,
         milestone="bitwise-single", note="the final step's update wobbles: every printed line is bit for bit the same"),
    Case("printed-tp2dp2-final-update-noise", "evidence:printed-unseen", _final_noise, "honest-note", STATE,
         milestone="bitwise-dptp", note="TP 2 x DP 2 twice: one element of each master shard differs after the last "
                                        "update; the layouts against one process stay within tolerance"),
    Case("printed-resume-moment-floor", "evidence:printed-unseen", _moment_floor, "honest-note", STATE, milestone="resume",
         note="the restored second moment is floored where it is zero: the resumed run prints the uninterrupted run's "
              "lines bit for bit, its optimizer state differs"),
    Case("printed-resume-bf16-moments-6-digits", "evidence:printed-rounded", plus(_moment_bf16, _rounded(6)), "honest-note",
         f"{DIGITS}|{STATE}|loss_max_abs_diff|grad_norm_rel_diff", milestone="resume",
         note="resume's planted regression behind losses printed to 6 digits"),
    Case("printed-dptp-per-rank-loss-5-digits", "evidence:printed-rounded", plus(dp_loss_per_rank, _rounded(5)), "honest-note",
         f"{DIGITS}|{STATE}|loss_rel_diff|grad_norm_rel_diff|exact step", milestone="bitwise-dptp",
         note="bitwise-dptp's planted regression behind 5-digit losses"),
]
