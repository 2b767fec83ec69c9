"""Exact-step verification: what a training step printed and applied, against the judge's own forward and
backward pass on the exact batch of that step.

Part of the judge: nothing here imports the engine. For a step N whose checkpoints N - 1 and N the judge
holds (read with harness/judge/claims/checkpoint_reader.py), and whose batch it knows from a trusted source (the base
commit's `engine batches`, harness/judge/claims/batches.py), it computes with harness/judge/claims/reference.py, from
the masters of step N - 1:

    L = sum of next-token cross-entropy over the batch's labels / their count   (the engine's loss of a step)
    G = dL / dw for every parameter                                             (the gradient before clipping)

and holds against them:
a. the printed `global_loss` of step N (the loss is measured on the weights before the update);
b. the printed `grad_norm` of step N (the norm before clipping) against ||G||;
c. the gradient the optimizer applied, recovered from the Adam moments of the two checkpoints:
       g = (m_N - b1 m_{N-1}) / (1 - b1)       against   c G,   c = min(1, clip / (||G|| + 1e-6))
   (the engine clips in place before Adam; weight decay is decoupled, so it is not in the moments), as a
   relative L2 error over all parameters together (bf16 and FP8 runs: each tensor weighted by its signal-to-noise
   ratio in the judge's own pass, "Where the noise sits" below);
d. the second moment: (v_N - b2 v_{N-1}) / (1 - b2) against (c G)^2, likewise.
c. and d. pin the data the step trained on, how many tokens and at what sequence length, that it ran a
backward pass, and how the loss was normalised: a run that trained on fewer samples, shorter sequences,
other data or a stale gradient, or that printed made-up numbers (a smoothed curve, a reference run's
losses) fails here whatever its weights look like from afar.

AdamW only: c. and d. read Adam moments of every tensor. A job whose argv asks for `--optimizer muon` (no Adam
moments for the hidden matrices) is refused by name in harness/judge/claims/evidence.py before any step is checked.

The moments do not depend on the learning rate, so c. and d. hold whatever lr each tensor trained at (muP's
per-tensor multipliers included: harness/judge/claims/evidence.py holds the applied lr of every tensor). The
forward reads packed documents as the EXPECTED config says (document_mask, reset_position_ids; the EOS of
the judge's own tokenization), never as the job's meta.json does (reference.judged_config).

Skipped updates (--skip-spike-factor): a step whose loss spikes is not applied and is retried on the next
batch, so step N trained on batch N + (skips before it), as the job's [SKIP] lines say (BatchOrder). Those
lines are checked too: none where the config does not skip; counts that go up one at a time; the expected
factor, a loss above factor x running mean, a full window and a running mean that is the mean of the
printed losses of the window; and, where the judge holds checkpoint N - 1, each skipped batch's printed
loss against its own forward pass of those weights (the weights do not move at a skip). A run cannot
drop hard batches by calling them spikes.

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
  more above those. They did not hold on a GPU: MiniCPM4-0.5B at lr 1e-2, steps 26-30 of perf's run, printed
  grad norms 3-12 % from the fp32 reference with every op version, the baseline ops included (a norm's gain,
  a sum over 16k tokens of terms that cancel, carried most of it). So each bf16 step also gets a floor: the
  judge runs its own pass again in bf16 autocast (GEMM inputs rounded to bf16, fp32 accumulation, the loss in
  fp32) on the same weights and batch, and a bound is at least FLOOR_FACTOR = 3 x how far that lands from its
  fp32 pass (the gradient and the second moment by the weighted measure below), at most BF16_CAP (loss 5e-2,
  gradient 0.5, second moment 0.6), below what the cheats move. The printed grad norm's bound has no cap: late in
  a run its rounding noise can pass any cap that would still catch a cheat (fp8-parity, minicpm4-0.5b, step 300 on
  an H200: the judge's own bf16 norm 0.213 from its fp32 one, the honest engine's 0.207, rejected by the old cap
  of 0.2); a step whose norm is that noisy is judged by its gradient (weighted, below), which is what it applied.
  The floors are in each check (`StepCheck.floor`) and the verdict's measured values.
- FP8 runs (expected config `fp8` tensorwise or rowwise, docs/fp8.md): the decoder's linears (QKV, O, FC1, FC2)
  round every GEMM operand to E4M3 (3 mantissa bits) or, tensorwise, the output gradient to E5M2 (2 bits): 16-32x
  bf16's roundoff, and the gradient moves far more than the loss. Measured with the engine's CPU emulation (fp32
  otherwise) against this fp32 reference, tiny, step 2: loss 1.7e-4, grad norm 2.3e-3, gradient 2.1e-2; at
  minicpm4-0.5b shapes (4 layers, initial weights, 4 x 256 tokens) the gradient 0.35 (docs/fp8.md) to 0.89
  (another init), loss 6e-4. So each FP8 step gets a floor of its own, as bf16 steps do: the judge's pass with the
  decoder's linears quantised as the recipe states (harness/judge/claims/fp8_reference.py: dynamic amax scales per tensor
  or per row, fp32 products; in bf16 autocast too when the run computes in bf16) against its fp32 pass, and each
  bound is at least FLOOR_FACTOR x that (weighted as below) and at most FP8_CAP (5e-2, no cap, 0.7, 0.8: the
  gradient caps above bf16's 0.5 / 0.6 because FP8's error adds to bf16's, ~0.35 and ~0.3-0.45 measured, ~0.5-0.57
  together). An honest CPU step lands within 1 % of the floor (the same quantisation as the engine's). Margin
  left: on tiny the bound is ~0.06 of the gradient and half the batch moves it 0.21, another batch 0.45
  (tests/judge/test_exactstep.py holds both > 2 x the bound), and a wrong scale (fp8-parity's planted regression)
  0.64 and the loss 1 %. At 0.5b shapes the gradient floor is as large as the cheats' move (half the batch 0.90,
  another 1.29, at initial weights; the loss only 1e-4 and 2.6e-3 there): FP8_CAP then decides, so an honest step
  must stay below 0.7 and a cheat is named when its own FP8 noise and the batch's add past that (half the batch
  with 0.35 of FP8 noise: ~0.97). Closer than that the relative L2 against fp32 cannot tell FP8 rounding from
  batch noise; the judge would need the engine's exact FP8 grid (its micro-batch and TP-shard scales).

Where the noise sits (bf16 and FP8 runs, c. and d.). Late in a run at a high lr the gradient of a small batch
is small, and rounding is as large as it over all parameters: fp8-parity's honest bf16 job (minicpm4-0.5b, lr
1e-2, 4 x 1024 tokens, step 300, 2 x H200) applied a gradient 0.525 from the fp32 one while the judge's own bf16
pass lay 0.447 from it; with the bound at min(max(0.15, 3 x 0.447), BF16_CAP 0.5) the honest step was rejected.
A plain relative L2 cannot help there: an honest engine's rounding is an independent draw as large as the
judge's, and a cheat moves the gradient by ~1 (half the batch) to ~1.4 (another batch), so 3 x the floor
covers the cheats and a cap below them rejects honest steps. But the noise is not spread evenly: it sits in
the tensors whose gradient is a sum of terms that cancel (norm gains, summed over every token; the QKV of
layers whose softmax backward subtracts nearly equal terms), while the others are held to a few percent; and
a cheat moves every tensor alike (other samples change every tensor's gradient by about its own size late in a
run; a wrong FP8 scale every linear's). So c. and d. weigh each tensor t by its signal-to-noise ratio in the
judge's own pass, the optimal weighting for independent noise of that size:

    distance^2 = sum_t w_t ||g_t - c G_t||^2 / sum_t w_t ||c G_t||^2,   w_t = 1 / max(f_t^2, (base / 3)^2)

with f_t = ||G16_t - G_t|| / ||G_t|| the tensor's own relative error (G16: the judge's bf16 / FP8 pass) and base
the dtype's plain bound (BF16 0.15: below base / 3 a tensor's floor would set no bound, so it gets no more
weight). The floor is the same measure of the judge's own pass, and the bound FLOOR_FACTOR x it as before,
capped as before. What that buys: an honest engine's distance over the floor is sqrt of the signal-weighted mean
of (its noise / the judge's noise)^2 per tensor, so it passes while its rounding stays within 3x the judge's
where the gradient is; a cheat adds its per-tensor move (~1) to that, weighted by signal-to-noise, against a
floor that is now that of the quiet tensors (never above the plain floor). tests/judge/test_exactstep.py holds a
step whose noise is structured as fp8-parity's (plain floor 0.43, engine 0.51 > 0.5): weighted floor 0.085,
engine 0.10, half the batch and another batch > 3x the bound. On the GPU (fp8-parity's gate at another drawn
seed, 2 x H200, bench/results/exactstep_floor_05b_h200x2.json): the honest bf16 step 300 is 0.440 plain (the
judge's own 0.254) and 0.156 weighted (0.087): bound 0.261, the step at 0.6 of it. The engine's rounding is
1.7-1.8x the judge's autocast pass by both measures there (1.2x at seed 98), so FLOOR_FACTOR 3 leaves ~1.7x. What
it cannot do: tell a cheat confined to the
noisy tensors (a norm gain's gradient dropped) from their rounding at that step; the plain distances are in
the verdict beside the weighted ones (`StepCheck.grad_rel_plain`, `floor["grad_plain"]`).
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from harness.judge.claims import reference
from harness.judge.claims.checkpoint_reader import CheckpointError, load_checkpoint
from harness.judge.claims.fp8_reference import RECIPES as FP8_RECIPES, fp8_linear

__all__ = ["Tolerances", "FP32", "BF16", "BF16_CAP", "FP8_CAP", "FLOOR_FACTOR", "tolerances_for", "StepBatch", "StepCheck",
           "ExactEvidence", "BatchOrder", "batch_order", "step_pairs", "verify_exact_steps", "weighted_rel"]


@dataclass(frozen=True)
class Tolerances:
    loss: float
    grad_norm: float
    grad: float
    second_moment: float


FP32 = Tolerances(loss=1e-4, grad_norm=1e-4, grad=1e-3, second_moment=1e-3)
BF16 = Tolerances(loss=2e-2, grad_norm=5e-2, grad=0.15, second_moment=0.2)
# bf16 runs: a bound grows to FLOOR_FACTOR x the judge's own bf16 error on the step (module doc), never past these,
# which stay below what the cheats move (another batch ~0.3-1 of the gradient, half the samples percents of the loss).
# The printed grad norm has no cap: where rounding moves it past a cap it cannot tell a cheat anyway (module doc).
BF16_CAP = Tolerances(loss=5e-2, grad_norm=math.inf, grad=0.5, second_moment=0.6)
FLOOR_FACTOR = 3.0
# FP8 runs (config fp8 != off): the same widening from the judge's own FP8 pass (module doc), capped here.
FP8_CAP = Tolerances(loss=5e-2, grad_norm=math.inf, grad=0.7, second_moment=0.8)


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
    grad_rel: float = math.nan  # as judged: weighted by each tensor's own noise where the judge measured one (weighted_rel)
    grad_rel_plain: float = math.nan  # the plain relative L2 over all parameters
    second_moment_rel: float = math.nan
    floor: dict[str, float] = field(default_factory=dict)  # bf16 / FP8 runs: the judge's own error on this step
    floor_pass: str = ""  # which pass measured it: "bf16", "FP8 tensorwise", "bf16 + FP8 rowwise"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ExactEvidence:
    checked: list[StepCheck] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# A [SKIP] line's running mean against the mean of the printed losses of its window: both are the same fp32
# losses, printed with 10 significant digits.
_MEAN_RTOL = 1e-6


@dataclass(frozen=True)
class BatchOrder:
    """Which of the loader's global batches (numbered from 1, as `engine batches` states them) each optimizer step
    of one job trained on. Step N trained on batch N, unless updates were skipped (--skip-spike-factor): a
    skipped step is retried on the next batch, so step N trained on batch N + (skips before it). The job's
    [SKIP] lines on the judge's pipe say where; `before` counts the run's skips before this job's log began
    (a resumed run). `batch_order` builds it and refuses what an honest engine never prints."""

    skips: tuple[Any, ...] = ()  # logparse.SkipRecord, in log order
    before: int = 0

    def batch_of(self, step: int) -> int:
        return step + self.before + sum(1 for k in self.skips if k.step <= step)

    def skipped_batch(self, skip: Any) -> int:
        return skip.step + skip.skipped_batches - 1

    def decision_problems(self, printed_steps: Sequence[Any], expected: Mapping[str, Any]) -> list[str]:
        """Each skip must be the engine's own decision (engine/optim/spike.py): the expected factor, a loss above
        factor x the running mean, a full window, and (where the window's [LOSS] lines are all in this log) a
        running mean that is the mean of the last `skip_spike_window` printed losses."""
        factor, window = float(expected.get("skip_spike_factor", 0.0)), int(expected.get("skip_spike_window", 20))
        losses = {r.step: r.loss for r in printed_steps}
        out = []
        for k in self.skips:
            if not _rel(k.factor, factor) <= _MEAN_RTOL:
                out.append(f"exact step: the [SKIP] line of step {k.step} says factor={k.factor:g}; the job was asked for "
                           f"--skip-spike-factor {factor:g}")
            elif not k.loss > k.factor * k.running_mean:
                out.append(f"exact step: step {k.step}'s update was skipped with global_loss={k.loss:.9e}, not above "
                           f"{k.factor:g} x running_mean={k.running_mean:.9e}: only a loss spike may be skipped")
            elif k.step - 1 < window:
                out.append(f"exact step: step {k.step}'s update was skipped before --skip-spike-window {window} steps were "
                           "accepted (the engine starts checking once its window is full)")
            elif all(s in losses for s in range(k.step - window, k.step)):
                mean = sum(losses[s] for s in range(k.step - window, k.step)) / window
                if not _rel(k.running_mean, mean) <= _MEAN_RTOL:
                    out.append(f"exact step: the [SKIP] line of step {k.step} says running_mean={k.running_mean:.9e}; the "
                               f"printed losses of steps {k.step - window}..{k.step - 1} average {mean:.9e}")
        return out


def batch_order(skips: Sequence[Any], *, expected: Mapping[str, Any]) -> tuple[BatchOrder | None, list[str], str]:
    """(the job's BatchOrder, violations, why it cannot be known) from its [SKIP] lines and the expected config.

    No order (None) with violations: the lines contradict the config or each other. None with a reason: a
    resumed run under --skip-spike-factor that printed no [SKIP] line, whose skips before the resume are on
    no pipe of this job (the caller flags the verdict: its steps are not verified exactly)."""
    factor = float(expected.get("skip_spike_factor", 0.0))
    resumed = bool(expected.get("resume"))
    if not skips:
        if factor > 0 and resumed:
            return None, [], ("exact steps not verified: a resumed run under --skip-spike-factor that skipped nothing "
                              "itself; the skips before the resume, which shift its batches, are on no line of its log")
        return BatchOrder(), [], ""
    if not factor > 0:
        k = skips[0]
        return None, [f"exact step: the job skipped the update of step {k.step} ([SKIP] line {k.line_no}), but it was "
                      "asked for --skip-spike-factor 0: no step's update may be dropped"], ""
    before = skips[0].skipped_batches - 1
    problems = []
    if before < 0 or (before and not resumed):
        problems.append(f"exact step: the first [SKIP] line (step {skips[0].step}) counts skipped_batches="
                        f"{skips[0].skipped_batches}; a run that did not resume starts at 1")
    for i, (a, b) in enumerate(zip(skips, skips[1:]), start=1):
        if b.skipped_batches != before + i + 1 or b.step < a.step:
            problems.append(f"exact step: [SKIP] lines {a.line_no} and {b.line_no} (steps {a.step}, {b.step}) count "
                            f"skipped_batches {a.skipped_batches}, {b.skipped_batches}: not one skip after another")
            break
    return (None, problems, "") if problems else (BatchOrder(tuple(skips), before), [], "")


def step_pairs(checkpoints: Sequence[Path]) -> list[tuple[Path, Path]]:
    """(step N - 1, step N) folder pairs among `checkpoints` (step_XXXXXXXX folders), by step."""
    by_step = {int(p.name.removeprefix("step_")): p for p in checkpoints}
    return [(by_step[s - 1], by_step[s]) for s in sorted(by_step) if s - 1 in by_step]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


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


def _norm(grads: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of every gradient together, summed in fp64."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))


def _own_floor(params: Mapping[str, torch.Tensor], cfg: Mapping[str, Any], batch: StepBatch, device: str,
               eos_id: int | None, loss: float, norm: float, grads: Mapping[str, torch.Tensor], *, bf16: bool,
               fp8: str, least: tuple[float, float]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """How far the judge's own pass as the run computes (bf16 autocast: GEMM inputs rounded to bf16, fp32
    accumulation, the loss in fp32; `fp8`: the decoder's linears through fp8_reference) lands from its fp32 pass on
    the same weights and batch: the rounding noise of an honest step of that run here.

    Returns (floor, own_g, own_v): the floors of the step (loss, grad norm; the gradient and the second moment both
    weighted by each tensor's own noise as `weighted_rel` weighs the engine's, and the gradient's plain relative L2),
    and each tensor's own squared relative error of the gradient and of its square (`weighted_rel`'s `own`; `least`:
    its `least` for the gradient and the second moment)."""
    linear = fp8_linear(fp8) if fp8 != "off" else None
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
        loss16, _, grads16 = reference.loss_and_grads(params, cfg, batch.inputs.to(device), batch.labels.to(device),
                                                      eos_id=eos_id, linear=linear)
    norm16 = _norm(grads16)
    noise_g, ref_g, own_g, noise_v, ref_v, own_v = {}, {}, {}, {}, {}, {}
    for k, g in grads.items():
        g, g16 = g.double(), grads16.pop(k).double()
        noise_g[k], ref_g[k] = float((g16 - g).pow(2).sum()), float(g.pow(2).sum())
        noise_v[k], ref_v[k] = float((g16 * g16 - g * g).pow(2).sum()), float(g.pow(4).sum())
        own_g[k] = noise_g[k] / ref_g[k] if ref_g[k] > 0 else 0.0
        own_v[k] = noise_v[k] / ref_v[k] if ref_v[k] > 0 else 0.0
    floor = {"loss": _rel(loss16, loss), "grad_norm": _rel(norm16, norm),
             "grad": weighted_rel(noise_g, ref_g, own_g, least[0]),
             "grad_plain": math.sqrt(sum(noise_g.values()) / max(sum(ref_g.values()), 1e-300)),
             "second_moment": weighted_rel(noise_v, ref_v, own_v, least[1])}
    return floor, own_g, own_v


def weighted_rel(err: Mapping[str, float], ref: Mapping[str, float], own: Mapping[str, float] | None,
                 least: float) -> float:
    """The relative L2 distance sqrt(sum_t w_t err_t / sum_t w_t ref_t) over tensors t, from each tensor's squared error
    `err` and squared reference norm `ref`, each tensor weighted by its signal-to-noise ratio in the judge's own
    pass: w_t = 1 / max(own_t, least^2), `own` the tensor's own squared relative error (None: w_t = 1, the plain
    relative L2). Module doc, "Tolerances": noise sits in a few tensors, a cheat moves them all."""
    def w(name: str) -> float:
        return 1.0 if own is None else 1.0 / max(own[name], least * least, 1e-300)

    num = sum(w(k) * e for k, e in err.items())
    den = sum(w(k) * r for k, r in ref.items())
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def _widened(tol: Tolerances, floor: Mapping[str, float], cap: Tolerances) -> Tolerances:
    """The bounds, each at least FLOOR_FACTOR x the step's own floor and at most `cap`'s."""
    def bound(name: str) -> float:
        return min(max(getattr(tol, name), FLOOR_FACTOR * floor[name]), getattr(cap, name))

    return Tolerances(loss=bound("loss"), grad_norm=bound("grad_norm"), grad=bound("grad"),
                      second_moment=bound("second_moment"))


def _floor_note(check: StepCheck, name: str) -> str:
    if not check.floor:
        return ""
    note = f"; the judge's own {check.floor_pass} pass is {check.floor[name]:.3g} from its fp32 one"
    return note + (f" by the same measure (unweighted {check.floor['grad_plain']:.3g})" if name == "grad" else
                   " by the same measure" if name == "second_moment" else "")


def _check_pair(prev_path: Path, path: Path, batch: StepBatch, printed: Any | None, expected: Mapping[str, Any],
                tol: Tolerances, device: str, ev: ExactEvidence, group_elems: int, eos_id: int | None,
                skipped: Sequence[tuple[Any, int, StepBatch]]) -> None:
    step = int(path.name.removeprefix("step_"))
    prev = load_checkpoint(prev_path, kinds=("master",))
    if prev.step != step - 1:
        ev.violations.append(f"exact step: {prev_path} holds step {prev.step}, not {step - 1}")
        return
    cfg = reference.judged_config(expected, prev.config)
    b1, b2 = float(expected.get("adam_beta1", prev.config.get("adam_beta1"))), float(expected.get("adam_beta2", prev.config.get("adam_beta2")))
    clip = float(expected.get("grad_clip", prev.config.get("grad_clip", 0.0)))
    params = {k: v.to(device) for k, v in prev.masters.items()}
    shapes = {k: v.shape for k, v in prev.masters.items()}
    del prev
    for skip, number, other in skipped:  # the weights of step N - 1 also met the batches skipped before step N
        judged, _, _ = reference.loss_and_grads(params, cfg, other.inputs.to(device), other.labels.to(device),
                                                eos_id=eos_id, backward=False)
        if not _rel(skip.loss, judged) <= tol.loss:
            ev.violations.append(f"exact step: the [SKIP] line of step {step} (line {skip.line_no}) printed global_loss="
                                 f"{skip.loss} for batch {number}; the judge's forward pass of step {step - 1}'s weights on "
                                 f"it gives {judged:.9e} (relative difference {_rel(skip.loss, judged):.3g} > {tol.loss}): a "
                                 "skipped update must be a real loss spike")
    loss, _, grads = reference.loss_and_grads(params, cfg, batch.inputs.to(device), batch.labels.to(device), eos_id=eos_id)
    norm = _norm(grads)
    check = StepCheck(step=step, judge_loss=loss, judge_grad_norm=norm)
    fp8 = str(expected.get("fp8", "off"))
    own_g = own_v = None  # each tensor's own squared relative error, which weighs it (weighted_rel); None: fp32
    least = (tol.grad / FLOOR_FACTOR, tol.second_moment / FLOOR_FACTOR)  # below these a tensor's floor sets no bound
    if tol == BF16 or fp8 != "off":
        check.floor, own_g, own_v = _own_floor(params, cfg, batch, device, eos_id, loss, norm, grads, bf16=tol == BF16,
                                               fp8=fp8, least=least)
        check.floor_pass = " + ".join(["bf16"] * (tol == BF16) + [f"FP8 {fp8}"] * (fp8 != "off"))
        tol = _widened(tol, check.floor, FP8_CAP if fp8 != "off" else BF16_CAP)
    del params
    ev.checked.append(check)
    if printed is not None:
        check.printed_loss, check.printed_grad_norm = printed.loss, printed.grad_norm
        if printed.loss is None or not _rel(printed.loss, loss) <= tol.loss:
            ev.violations.append(f"exact step: step {step} printed global_loss={printed.loss}; the judge's forward pass of "
                                 f"step {step - 1}'s weights on the exact batch of step {step} gives {loss:.9e} (relative "
                                 f"difference {_rel(printed.loss or math.nan, loss):.3g} > {tol.loss}{_floor_note(check, 'loss')})")
        if printed.grad_norm is None or not _rel(printed.grad_norm, norm) <= tol.grad_norm:
            ev.violations.append(f"exact step: step {step} printed grad_norm={printed.grad_norm}; the judge's backward pass "
                                 f"on the exact batch gives {norm:.9e} (relative difference "
                                 f"{_rel(printed.grad_norm or math.nan, norm):.3g} > {tol.grad_norm}{_floor_note(check, 'grad_norm')})")
    coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    err_g, ref_g, err_v, ref_v = {}, {}, {}, {}
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
            err_g[name], ref_g[name] = float((got - want).pow(2).sum()), float(want.pow(2).sum())
            err_v[name], ref_v[name] = float((got_v - want * want).pow(2).sum()), float(want.pow(4).sum())
    check.grad_rel = weighted_rel(err_g, ref_g, own_g, least[0])
    check.grad_rel_plain = weighted_rel(err_g, ref_g, None, 0.0)
    check.second_moment_rel = weighted_rel(err_v, ref_v, own_v, least[1])
    if not check.grad_rel <= tol.grad:
        ev.violations.append(f"exact step: the gradient step {step} applied (from the Adam moments of {prev_path.name} and "
                             f"{path.name}) is {check.grad_rel:.3g} away {_measure(check, check.grad_rel_plain)} from the "
                             f"judge's gradient of the exact batch > {tol.grad}{_floor_note(check, 'grad')}; "
                             f"{_worst(err_g, ref_g, own_g)}: "
                             "the step did not train on the batch it was given, or not on all of it")
    elif not check.second_moment_rel <= tol.second_moment:
        ev.violations.append(f"exact step: the second moment step {step} accumulated is {check.second_moment_rel:.3g} away "
                             f"{_measure(check)} from the square of the judge's gradient > {tol.second_moment}"
                             f"{_floor_note(check, 'second_moment')}; {_worst(err_v, ref_v, own_v)}")


def _measure(check: StepCheck, plain: float | None = None) -> str:
    """How a distance was measured, for the verdict: weighted by the judge's own noise where it measured one."""
    if not check.floor:
        return "(relative L2 over all parameters)"
    return (f"(relative L2, each tensor weighted by its signal-to-noise ratio in the judge's own {check.floor_pass} pass"
            + (f"; unweighted {plain:.3g})" if plain is not None else ")"))


def _worst(err: Mapping[str, float], ref: Mapping[str, float], own: Mapping[str, float] | None) -> str:
    """The tensor farthest from the judge's, relative to its own floor where there is one."""
    def rel(name: str) -> float:
        return math.sqrt(err[name] / ref[name]) if ref[name] > 0 else math.inf

    if own is None:
        name = max(err, key=rel)
        return f"worst tensor {name} ({rel(name):.3g})"
    name = max(err, key=lambda k: rel(k) / max(math.sqrt(own[k]), 1e-30))
    return f"worst tensor past its own floor {name} ({rel(name):.3g}, its own floor {math.sqrt(own[name]):.3g})"


def verify_exact_steps(pairs: Sequence[tuple[Path, Path]], *, expected_config: Mapping[str, Any],
                       printed_steps: Sequence[Any], batches: Mapping[int, StepBatch], device: str = "cpu",
                       tolerances: Tolerances | None = None, group_elems: int = 64 * 2**20, eos_id: int | None = None,
                       order: BatchOrder | None = None,
                       on_checked: Callable[[int, int, int], None] | None = None) -> ExactEvidence:
    """Check each (checkpoint N - 1, checkpoint N) pair whose batch is in `batches` (module doc).

    `on_checked(step, done, total)` after each pair, for a progress display (minutes on CPU for a long job).

    `batches`: by the loader's batch number (`order` maps a step to it; None: step N trained on batch N).
    `printed_steps`: the job's [LOSS] records (.step, .loss, .grad_norm); a step without one gets checks c
    and d only. `eos_id`: the EOS of the judge's own tokenization, for a config with document_mask on.
    Never raises for a bad run: every problem is a violation of the returned evidence."""
    ev = ExactEvidence()
    fp8 = str(expected_config.get("fp8", "off"))
    if fp8 not in ("off", *FP8_RECIPES):
        ev.violations.append(f"exact step: the job runs --fp8 {fp8}, a recipe the judge has no FP8 reference for "
                             f"({', '.join(FP8_RECIPES)}); add it to harness/judge/claims/fp8_reference.py")
        return ev
    tol = tolerances or tolerances_for(expected_config, device)
    order = order or BatchOrder()
    printed = {r.step: r for r in printed_steps}
    ev.violations += order.decision_problems(printed_steps, expected_config)
    for done, (prev_path, path) in enumerate(pairs, 1):
        step = int(path.name.removeprefix("step_"))
        skipped = [(k, order.skipped_batch(k)) for k in order.skips if k.step == step]
        missing = [n for n in (order.batch_of(step), *(n for _, n in skipped)) if n not in batches]
        if missing:
            ev.notes.append(f"exact step {step}: no batch known for batch number(s) {missing}")
            continue
        try:
            _check_pair(prev_path, path, batches[order.batch_of(step)], printed.get(step), expected_config, tol, device, ev,
                        group_elems, eos_id, [(k, n, batches[n]) for k, n in skipped])
        except CheckpointError as err:
            ev.violations.append(f"exact step: {err}")
        if on_checked is not None:
            on_checked(step, done, len(pairs))
    return ev
