"""A train job's learning rate against the milestone's stated contract, at every step the judge can see.

Part of the judge: nothing here imports the engine. The contract is the job gate's `lr_contract` formula
(harness/formula.py: e.g. demo-tiny's `lr * min(s / W, sqrt(W / s))`), or, where the milestone states
none, the schedule the BASE engine defines for the job's config (evidence.scheduled_lr). Held against it:

a. the printed lr of every [LOSS] line, within PRINTED_RTOL (the line carries 7 significant digits), and,
   for a run that does not resume, one line for each step 1..N, none missing or repeated: a contract
   checked on the steps a run chose to print would be checked on nothing;
b. the lr the optimizer actually applied at every step N whose checkpoints N - 1 and N the judge holds (on
   CPU every step, else the final one and secret ones: harness/judge/claims/saveplan.py), fitted from the fp32
   masters and the Adam moments of step N per tensor (evidence.estimate_lr), times the tensor's muP
   multiplier (evidence.lr_multiplier), within evidence.LR_RTOL.

So no gate relies on another for the schedule (issue 30: the milestone's job used to switch the check off
and lean on a fixed-seed hidden test), and an engine right only for the steps, seeds or shapes that test
happens to run is caught on whatever the judging drew. Names a formula may use, per step s: lr (peak),
W = max(warmup, 1), warmup, N (steps), D (decay steps), min_lr = lr x min_lr_ratio.
"""

import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.formula import Formula, FormulaError
from harness.judge.claims.checkpoint_reader import CheckpointError, load_checkpoint
from harness.judge.claims.evidence import LR_RTOL, estimate_lr, lr_multiplier, scheduled_lr
from harness.judge.claims.saveplan import checkpoint_bytes

__all__ = ["contract_lr", "check_lr_contract", "PRINTED_RTOL", "FIT_ALL_BYTES"]

PRINTED_RTOL = 1e-5  # `lr=%.6e`: 7 significant digits, within 5e-7 of the engine's own float
FIT_ALL_BYTES = 1 << 30  # checkpoints up to this size get every tensor's lr fitted per step; larger: embed.weight only
_LR_TENSOR = "embed.weight"


def contract_lr(formula: str, expected: Mapping[str, Any]) -> tuple[Callable[[int], float], str]:
    """(lr of printed step s, what the contract is called) for the job's expected config."""
    if not formula:
        return (lambda s: scheduled_lr(expected, s - 1)), f"the base engine's {expected.get('lr_schedule')} schedule"
    parsed = Formula(formula)
    lr = float(expected["lr"])
    names = {"lr": lr, "W": float(max(int(expected.get("warmup_steps", 0)), 1)),
             "warmup": float(expected.get("warmup_steps", 0)), "N": float(expected.get("num_steps", 0)),
             "D": float(expected.get("decay_steps", 0)), "min_lr": lr * float(expected.get("min_lr_ratio", 0.0))}
    return (lambda s: parsed.value({**names, "s": float(s)})), f"the milestone's contract lr = {parsed.text}"


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def check_lr_contract(formula: str, *, printed_steps: Sequence[Any], expected: Mapping[str, Any],
                      pairs: Sequence[tuple[Path, Path]], resumed: bool) -> tuple[list[str], dict[str, float]]:
    """(violations, measured) of a. and b. (module doc) for one train job."""
    try:
        want, called = contract_lr(formula, expected)
        want(1)
    except (FormulaError, ValueError, KeyError) as err:
        return [f"learning rate: the judge cannot evaluate the job's lr contract: {err}"], {}
    problems: list[str] = []
    steps = sorted(printed_steps, key=lambda r: r.step)
    n = int(expected.get("num_steps", 0))
    if not resumed and n:
        seen = [r.step for r in steps]
        missing = sorted(set(range(1, n + 1)) - set(seen))
        repeated = sorted({s for s in seen if seen.count(s) > 1})
        if missing or repeated:
            problems.append(f"learning rate: the run printed {len(seen)} [LOSS] lines for its {n} steps (missing "
                            f"{missing[:8]}, repeated {repeated[:8]}): {called} is held at every step")
    for rec in steps:
        target = want(rec.step)
        if rec.lr is None or not _rel(rec.lr, target) <= PRINTED_RTOL:
            problems.append(f"learning rate: step {rec.step} printed lr={rec.lr}; {called} gives {target:.7g} at step "
                            f"{rec.step} (relative tolerance {PRINTED_RTOL})")
            break
    fitted, fit_problems = _applied(pairs, expected, want, called)
    problems += fit_problems
    measured = {"lr_contract_steps": float(len(steps)), "lr_fitted_steps": float(len(fitted))}
    if fitted:
        measured["lr_fitted_rel_max"] = max(fitted.values())
    return problems, measured


def _applied(pairs: Sequence[tuple[Path, Path]], expected: Mapping[str, Any], want: Callable[[int], float],
             called: str) -> tuple[dict[int, float], list[str]]:
    """{step: worst relative difference of a tensor's fitted lr from the contract's}, violations."""
    b1, b2, eps = (float(expected[k]) for k in ("adam_beta1", "adam_beta2", "adam_eps"))
    names = None if checkpoint_bytes(expected) <= FIT_ALL_BYTES else [_LR_TENSOR]
    out: dict[int, float] = {}
    loaded: dict[Path, Any] = {}  # consecutive pairs share a checkpoint: each is read once
    for prev_path, path in pairs:
        try:
            for p in (prev_path, path):
                if p not in loaded:
                    loaded[p] = load_checkpoint(p, names=names)
            prev, cur = loaded[prev_path], loaded[path]
        except CheckpointError as err:
            return out, [f"learning rate: {err}"]
        for p in [p for p in loaded if p != path]:
            del loaded[p]
        step, target = cur.step, want(cur.step)
        worst = (-1.0, "", math.nan, 1.0)
        for name, w in cur.masters.items():
            lr, _ = estimate_lr(prev.masters[name], w, cur.exp_avg[name], cur.exp_avg_sq[name], t=cur.adam_step,
                                beta1=b1, beta2=b2, eps=eps, decay=w.ndim >= 2)
            multiplier = lr_multiplier(name, expected)
            rel = _rel(lr, target * multiplier) if math.isfinite(lr) else math.inf
            if rel > worst[0]:
                worst = (rel, name, lr, multiplier)
        out[step] = worst[0]
        if not worst[0] <= LR_RTOL:
            rel, name, lr, multiplier = worst
            return out, [f"learning rate: at step {step} the optimizer applied lr {lr:.6g} to {name} (fitted from the "
                         f"masters of checkpoints {step - 1} and {step} and the Adam moments of {step}); {called} gives "
                         f"{target:.7g} x its muP multiplier {multiplier:.4g} = {target * multiplier:.6g} (relative "
                         f"difference {rel:.3g} > {LR_RTOL})"]
    return out, []
