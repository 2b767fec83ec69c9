"""Exact-step verification: what a training step printed and applied, against the judge's own forward and
backward pass on the exact batch of that step.

Part of the judge: nothing here imports the engine. For a step N whose checkpoints N - 1 and N the judge
holds (read with harness/judge/checkpoint.py), and whose batch it knows from a trusted source (the base
commit's `engine batches`, harness/judge/batches.py), it computes with harness/judge/reference.py, from
the masters of step N - 1:

    L = sum of next-token cross-entropy over the batch's labels / their count   (the engine's loss of a step)
    G = dL / dw for every parameter                                             (the gradient before clipping)

and holds against them:
a. the printed `global_loss` of step N (the loss is measured on the weights before the update);
b. the printed `grad_norm` of step N (the norm before clipping) against ||G||;
c. the gradient the optimizer applied, recovered from the Adam moments of the two checkpoints:
       g = (m_N - b1 m_{N-1}) / (1 - b1)       against   c G,   c = min(1, clip / (||G|| + 1e-6))
   (the engine clips in place before Adam; weight decay is decoupled, so it is not in the moments), as a
   relative L2 error over all parameters together;
d. the second moment: (v_N - b2 v_{N-1}) / (1 - b2) against (c G)^2, likewise.
c. and d. pin the data the step trained on, how many tokens and at what sequence length, that it ran a
backward pass, and how the loss was normalised: a run that trained on fewer samples, shorter sequences,
other data or a stale gradient, or that printed made-up numbers (a smoothed curve, a reference run's
losses) fails here whatever its weights look like from afar.

Tolerances (`tolerances_for`), relative:
- fp32 compute (CPU): the engine and the reference add the same products in another order (fused QKV,
  chunked LM head, flat-buffer norms, TP partial sums, a DP reduce-scatter). Measured on honest runs,
  torch 2.13 CPU (tiny 8 steps, llama-tiny 30 steps, tiny TP 2 x DP 2 and DP 2): loss <= 1.6e-7, grad
  norm <= 1.1e-7, gradient <= 2.9e-7, second moment <= 8.8e-7. Bounds: 1e-4, 1e-4, 1e-3, 1e-3, 600x and
  more above the worst seen, so other CPUs and torch builds stay inside. The cheats they must catch are
  far away: another batch of the same text moves the gradient by ~0.3-1 (tests/judge/test_exactstep.py),
  half the samples the printed loss and norm by percents.
- bf16 compute (GPU): the engine's forward and backward round every GEMM input to bf16 (unit roundoff
  2^-8 = 3.9e-3) and accumulate in fp32. Measured with the engine in bf16 on CPU against this fp32
  reference: tiny, 8 steps: 2.4e-4 / 2.0e-3 / 4.2e-3 / 5.6e-3; llama-tiny, 30 steps (small late gradients,
  where rounding weighs most): 4.5e-4 / 1.1e-2 / 3.7e-2 / 3.6e-2. Bounds: 2e-2, 5e-2, 0.15, 0.2, 4x and
  more above those. Larger models on a GPU must be measured on the device before the bounds are trusted
  there (`python -m pytest -m gpu -s tests/judge/test_exactstep.py` prints them).
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from harness.judge import reference
from harness.judge.checkpoint import CheckpointError, load_checkpoint

__all__ = ["Tolerances", "FP32", "BF16", "tolerances_for", "StepBatch", "StepCheck", "ExactEvidence", "step_pairs",
           "verify_exact_steps"]


@dataclass(frozen=True)
class Tolerances:
    loss: float
    grad_norm: float
    grad: float
    second_moment: float


FP32 = Tolerances(loss=1e-4, grad_norm=1e-4, grad=1e-3, second_moment=1e-3)
BF16 = Tolerances(loss=2e-2, grad_norm=5e-2, grad=0.15, second_moment=0.2)


def tolerances_for(config: Mapping[str, Any], device: str) -> Tolerances:
    """The bounds for the compute dtype the run used (`auto`: bf16 on CUDA, fp32 on CPU, as the engine resolves it)."""
    dtype = str(config.get("compute_dtype", "auto"))
    if dtype == "auto":
        dtype = "bf16" if device == "cuda" else "fp32"
    return FP32 if dtype == "fp32" else BF16


@dataclass(frozen=True)
class StepBatch:
    """The whole global batch of one optimizer step: inputs and labels [rows, seq] (labels -100 carry no loss)."""

    inputs: torch.Tensor
    labels: torch.Tensor


@dataclass
class StepCheck:
    step: int
    judge_loss: float
    judge_grad_norm: float
    printed_loss: float | None = None
    printed_grad_norm: float | None = None
    grad_rel: float = math.nan
    second_moment_rel: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ExactEvidence:
    checked: list[StepCheck] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def step_pairs(checkpoints: Sequence[Path]) -> list[tuple[Path, Path]]:
    """(step N - 1, step N) folder pairs among `checkpoints` (step_XXXXXXXX folders), by step."""
    by_step = {int(p.name.removeprefix("step_")): p for p in checkpoints}
    return [(by_step[s - 1], by_step[s]) for s in sorted(by_step) if s - 1 in by_step]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def _model_config(expected: Mapping[str, Any], meta_config: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dict(meta_config)
    cfg.update({k: expected[k] for k in (*reference.REQUIRED_FIELDS, "scale_emb", "scale_depth", "dim_model_base")
                if k in expected})
    return cfg


def _groups(names: Sequence[str], shapes: Mapping[str, torch.Size], max_elems: int) -> list[list[str]]:
    """Parameter names in groups of at most `max_elems` elements (one name per group if larger): the moments of
    four checkpoints are read a group at a time, so an 8B model's never sit in memory all at once."""
    out: list[list[str]] = []
    size = 0
    for name in names:
        n = math.prod(shapes[name])
        if out and size + n <= max_elems:
            out[-1].append(name)
            size += n
        else:
            out.append([name])
            size = n
    return out


def _check_pair(prev_path: Path, path: Path, batch: StepBatch, printed: Any | None, expected: Mapping[str, Any],
                tol: Tolerances, device: str, ev: ExactEvidence, group_elems: int) -> None:
    step = int(path.name.removeprefix("step_"))
    prev = load_checkpoint(prev_path, kinds=("master",))
    if prev.step != step - 1:
        ev.violations.append(f"exact step: {prev_path} holds step {prev.step}, not {step - 1}")
        return
    cfg = _model_config(expected, prev.config)
    b1, b2 = float(expected.get("adam_beta1", prev.config.get("adam_beta1"))), float(expected.get("adam_beta2", prev.config.get("adam_beta2")))
    clip = float(expected.get("grad_clip", prev.config.get("grad_clip", 0.0)))
    params = {k: v.to(device) for k, v in prev.masters.items()}
    shapes = {k: v.shape for k, v in prev.masters.items()}
    del prev
    loss, _, grads = reference.loss_and_grads(params, cfg, batch.inputs.to(device), batch.labels.to(device))
    del params
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    check = StepCheck(step=step, judge_loss=loss, judge_grad_norm=norm)
    ev.checked.append(check)
    if printed is not None:
        check.printed_loss, check.printed_grad_norm = printed.loss, printed.grad_norm
        if printed.loss is None or not _rel(printed.loss, loss) <= tol.loss:
            ev.violations.append(f"exact step: step {step} printed global_loss={printed.loss}; the judge's forward pass of "
                                 f"step {step - 1}'s weights on the exact batch of step {step} gives {loss:.9e} (relative "
                                 f"difference {_rel(printed.loss or math.nan, loss):.3g} > {tol.loss})")
        if printed.grad_norm is None or not _rel(printed.grad_norm, norm) <= tol.grad_norm:
            ev.violations.append(f"exact step: step {step} printed grad_norm={printed.grad_norm}; the judge's backward pass "
                                 f"on the exact batch gives {norm:.9e} (relative difference "
                                 f"{_rel(printed.grad_norm or math.nan, norm):.3g} > {tol.grad_norm})")
    coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    sums = {"g_err": 0.0, "g_ref": 0.0, "v_err": 0.0, "v_ref": 0.0}
    worst = ("", 0.0)
    for names in _groups(list(grads), shapes, group_elems):
        a = load_checkpoint(prev_path, kinds=("exp_avg", "exp_avg_sq"), names=names)
        b = load_checkpoint(path, kinds=("exp_avg", "exp_avg_sq"), names=names)
        if b.adam_step != a.adam_step + 1:
            ev.violations.append(f"exact step: the Adam step goes from {a.adam_step} ({prev_path.name}) to {b.adam_step} "
                                 f"({path.name}); one optimizer step lies between them")
            return
        for name in names:
            want = grads[name].double().to("cpu") * coef
            got = (b.exp_avg[name].double() - b1 * a.exp_avg[name].double()) / (1 - b1)
            got_v = (b.exp_avg_sq[name].double() - b2 * a.exp_avg_sq[name].double()) / (1 - b2)
            err = float((got - want).pow(2).sum())
            ref = float(want.pow(2).sum())
            sums["g_err"] += err
            sums["g_ref"] += ref
            sums["v_err"] += float((got_v - want * want).pow(2).sum())
            sums["v_ref"] += float((want * want).pow(2).sum())
            if ref > 0 and math.sqrt(err / ref) > worst[1]:
                worst = (name, math.sqrt(err / ref))
    check.grad_rel = math.sqrt(sums["g_err"] / max(sums["g_ref"], 1e-300))
    check.second_moment_rel = math.sqrt(sums["v_err"] / max(sums["v_ref"], 1e-300))
    if not check.grad_rel <= tol.grad:
        ev.violations.append(f"exact step: the gradient step {step} applied (from the Adam moments of {prev_path.name} and "
                             f"{path.name}) is {check.grad_rel:.3g} away (relative L2) from the judge's gradient of the "
                             f"exact batch > {tol.grad}; worst tensor {worst[0]} ({worst[1]:.3g}): the step did not train "
                             "on the batch it was given, or not on all of it")
    elif not check.second_moment_rel <= tol.second_moment:
        ev.violations.append(f"exact step: the second moment step {step} accumulated is {check.second_moment_rel:.3g} away "
                             f"(relative L2) from the square of the judge's gradient > {tol.second_moment}")


def verify_exact_steps(pairs: Sequence[tuple[Path, Path]], *, expected_config: Mapping[str, Any],
                       printed_steps: Sequence[Any], batches: Mapping[int, StepBatch], device: str = "cpu",
                       tolerances: Tolerances | None = None, group_elems: int = 64 * 2**20) -> ExactEvidence:
    """Check each (checkpoint N - 1, checkpoint N) pair whose batch N is in `batches` (module doc).

    `printed_steps`: the job's [LOSS] records (.step, .loss, .grad_norm); a step without one gets checks c
    and d only. Never raises for a bad run: every problem is a violation of the returned evidence."""
    ev = ExactEvidence()
    tol = tolerances or tolerances_for(expected_config, device)
    printed = {r.step: r for r in printed_steps}
    for prev_path, path in pairs:
        step = int(path.name.removeprefix("step_"))
        if step not in batches:
            ev.notes.append(f"exact step {step}: no batch known")
            continue
        try:
            _check_pair(prev_path, path, batches[step], printed.get(step), expected_config, tol, device, ev, group_elems)
        except CheckpointError as err:
            ev.violations.append(f"exact step: {err}")
    return ev
