"""Printed measurements carry the digits the engine's documented format promises, or the log is refused.

The documented format (harness/judge/logparse.py `LOSS_FORMAT`, `EVAL_FORMAT`) prints `global_loss`,
`grad_norm` and `val_loss` as `%.9e`: ten significant digits, more than an fp32 value holds, so two runs
that print the same line carried the same number. The parser already refuses a line that lacks a field or
prints another format (`%.4e`, `%.3f`). The form alone does not make the digits real: a value rounded to 4
digits, or to float16, and then printed `%.9e` has the right form (`2.512300000e+00`) and hides every
run-to-run difference below its rounding. So the judge also asks whether the digits are there.

A value is *short* when its ten printed digits end in three or more zeros (at most SHORT_DIGITS = 7
significant digits), or when it prints as a binary number of at most SHORT_BITS = 12 significant bits
(float16 has 11, bfloat16 8). A value a step measured in fp32 or wider is short by chance with probability
about 1e-3 + 2^-12 (its digits past the 7th and its bits past the 12th are as good as uniform). Exact zeros
and non-finite values are left out (a zero grad norm is a real measurement). A field is refused when at
least MIN_SHORT = 3 of its values are short and they are at least a quarter of them: an honest 8-step log
is refused with probability ~1e-7 per field, and a log that rounds 3 values or more (and a quarter of them)
is refused every time.

Not checked: `lr` (schedules print round numbers; evidence.py holds the printed lr against the schedule
and the applied one), `time_s` and `mfu` (the judge's clock), `val_bpb`. Rounding to 8 or 9 digits cannot
be told from a measured value; it hides at most about one unit in the last place of an fp32 loss, and a
difference in any tensor of the run is caught by the checkpoint comparison (harness/judge/claims/bitwise.py).
"""

import math
from collections.abc import Sequence

from harness.judge.logparse import EVAL_FORMAT, LOSS_FORMAT, EvalRecord, StepRecord

__all__ = ["SHORT_DIGITS", "SHORT_BITS", "MIN_SHORT", "MEASURED", "short", "digit_problems"]

SHORT_DIGITS = 7
SHORT_BITS = 12
MIN_SHORT = 3
# (record kind, field, attribute) of the measured values held to their digits.
MEASURED = (("[LOSS]", "global_loss", "loss"), ("[LOSS]", "grad_norm", "grad_norm"), ("[EVAL]", "val_loss", "val_loss"))


def _round_bits(x: float, bits: int) -> float:
    mantissa, exponent = math.frexp(x)
    return math.ldexp(round(mantissa * 2**bits), exponent - bits)


def short(x: float) -> bool:
    """Whether `x`, printed `%.9e`, carries fewer digits than the format prints (module doc)."""
    if x == 0 or not math.isfinite(x):
        return False
    printed = f"{x:.9e}"
    if len(printed.lstrip("-").split("e")[0].replace(".", "").rstrip("0")) <= SHORT_DIGITS:
        return True
    return f"{_round_bits(x, SHORT_BITS):.9e}" == printed


def digit_problems(steps: Sequence[StepRecord], evals: Sequence[EvalRecord]) -> list[str]:
    """One line per measured field whose printed values are rounded below the documented format (module doc)."""
    problems = []
    for kind, name, attribute in MEASURED:
        records = steps if kind == "[LOSS]" else evals
        values = [(r.step, v) for r in records if (v := getattr(r, attribute)) is not None and v != 0 and math.isfinite(v)]
        rounded = [(step, v) for step, v in values if short(v)]
        if len(rounded) >= MIN_SHORT and 4 * len(rounded) >= len(values):
            documented = LOSS_FORMAT if kind == "[LOSS]" else EVAL_FORMAT
            examples = ", ".join(f"step {step}: {v:.9e}" for step, v in rounded[:3])
            problems.append(
                f"printed digits: {len(rounded)} of the {len(values)} {kind} {name} values carry fewer digits than the "
                f"engine's documented format `{documented}` promises (at most {SHORT_DIGITS} significant digits or "
                f"{SHORT_BITS} significant bits: {examples}); numbers rounded before printing hide run-to-run "
                "differences, so the judge refuses the log")
    return problems
