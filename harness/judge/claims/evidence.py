"""Verify a training job's claims with the judge's own code: model size, loss, learning rate.

Part of the judge: nothing here imports the engine. A train job prints `[LOSS]` / `[EVAL]` lines
and leaves checkpoints; the job controls all of them. `verify_train_run` trusts none of the
numbers and recomputes what it can from the checkpoint tensors, which it reads itself
(harness/judge/claims/checkpoint_reader.py) and evaluates with its own forward pass (harness/judge/claims/reference.py):

a. Model size. The shapes of the final checkpoint's tensors must equal the shapes the EXPECTED
   config implies (the milestone's argv over the base commit's presets, passed in by the caller),
   and meta.json's architecture and optimizer fields must equal the expected ones. A run that
   trained a smaller model, or wrote another config, is a violation ("model shape", "config").

b. Loss. The judge draws `num_samples` windows of seq_length + 1 tokens from the run's VALIDATION
   tokens (the caller reads them from the base commit, never from the candidate's tree) with a
   torch.Generator seeded by `seed`, a number the judge picks per judging, and computes the mean
   cross-entropy of the final weights (judge_val_loss) and, when the checkpoint of step N - 1 is
   there, of those weights (judge_val_loss_prev), reading packed documents as the EXPECTED config says
   (document_mask, reset_position_ids; absent = off) with the EOS of the judge's own tokenization. Then:
   - the claimed [EVAL] val_loss of the final step is compared with judge_val_loss (same weights,
     same split; different samples): relative tolerance `val_rtol`;
   - the claimed [LOSS] global_loss of the final step N was computed on the weights of step N - 1
     (the loss is measured before the update), on one TRAINING batch: it is compared with
     the judge's loss of step N - 1's weights on training-split windows (validation windows where it has no
     training text), within `batch_rtol`: the wider `train_rtol` (train vs validation text, bf16 vs fp32) or
     BATCH_SIGMAS standard errors of a batch of that many sequences, from the judge's own windows' spread.
   A disagreement above the tolerance is a violation naming "val loss" and both numbers. The windows' digest
   (judge_val_windows) goes with judge_val_loss, so two jobs' losses are compared only on the same text.

c. Learning rate. From checkpoints N - 1 and N, torch's AdamW step is
       w_N = w_{N-1} - lr * wd * w_{N-1} - lr * m_hat / (sqrt(v_hat) + eps),
       m_hat = m_N / (1 - b1^t), v_hat = v_N / (1 - b2^t), t = N,
   linear in (lr, lr * wd). Both are fitted by least squares over every element of a tensor (fp64),
   so the weight decay, which a run might misstate, does not bias lr. Every fitted tensor is held
   to the printed lr times its muP multiplier (`lr_multiplier`, restated here from the EXPECTED
   config's mup / hidden_size / dim_model_base, never from the engine): with muP the hidden matrices
   train at lr / (hidden_size / dim_model_base), the embedding, norm gains and LM head (whose forward is
   already divided by that ratio: muP-Adam, Tensor Programs V) at lr; dropped or changed multipliers are caught.
   embed.weight's estimate is the headline (`lr_estimate`). t is the printed final step, which must equal
   the checkpoint's step and Adam step (a changed t would bend the bias corrections). Betas and eps
   come from the expected config when it has them (else meta.json). The moments themselves are
   checked for consistency: g = (m_N - b1 m_{N-1}) / (1 - b1) must satisfy
   v_N - b2 v_{N-1} = (1 - b2) g^2 (summed over the tensor), so a run cannot rescale m or v alone
   to hide a larger lr. Disagreement above `lr_rtol` is a violation naming "learning rate".
   Every printed lr must also follow the EXPECTED config's schedule (`scheduled_lr`, restated from
   the base's engine/optim/schedule.py), so an engine change that raises the lr and prints it
   truthfully is caught too (a milestone that states its own lr_contract is held to that instead:
   harness/judge/claims/contract.py, check_schedule=False here).

Not caught here (documented): a job that rewrites checkpoint N - 1's masters consistently (judge_val_loss still
holds the final weights to account), and one that trains on the validation split.
"""

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from harness.judge.claims import reference
from harness.judge.claims.checkpoint_reader import (SHAPE_FIELDS, CheckpointError, JudgeCheckpoint, full_shapes, list_checkpoints,
                                      load_checkpoint, read_meta, size_mismatches)

__all__ = ["Evidence", "TokenStream", "embedded_tokens", "shard_tokens", "verify_train_run", "windows_digest", "estimate_lr",
           "scheduled_lr", "lr_multiplier", "HIDDEN_MATRICES", "VERIFIED_OPTIMIZER",
           "VAL_RTOL", "TRAIN_RTOL", "TRAJECTORY_RTOL", "BATCH_SIGMAS", "batch_rtol", "LR_RTOL", "MOMENT_RTOL", "BYTE_EOS", "BYTE_VOCAB"]

# Claimed final [EVAL] val_loss vs the judge's loss of the same weights on other validation
# windows: sampling noise of 32 x 256-token windows (~1 %) plus bf16-vs-fp32 (<1 %).
VAL_RTOL = 0.05
# Claimed final [LOSS] (one training batch, weights of step N - 1) vs the judge's loss of those weights on
# training-split windows: the train/validation text gap where it has only validation text, and one batch's
# noise, which `batch_rtol` widens this to where the batch holds few sequences.
TRAIN_RTOL = 0.10
TRAJECTORY_RTOL = 0.10  # see _check_trajectory
# One printed batch of B sequences scatters around the mean loss over many windows by s / sqrt(B), s the relative
# spread of one sequence's mean loss, which the judge measures on its own windows. Sequences, not tokens, count:
# the tokens of one sequence share a document and move together (at minicpm4-0.5b, 300 steps, 4 x 1024 tokens a
# step, 2 x H200: printed losses 4 % apart batch to batch, one 11 % from the judge's mean, while 3 / sqrt(4096
# tokens) allowed 4.7 %). The bound is BATCH_SIGMAS standard errors.
BATCH_SIGMAS = 4.0
# lr fitted from two checkpoints vs the printed lr: the fit is exact up to fp32 rounding of the
# update (~1e-5 relative on tiny runs); the printed lr has 7 significant digits.
LR_RTOL = 0.01
# sum(v_N - b2 v_{N-1}) vs (1 - b2) sum(g^2): fp32 rounding of the moments only.
MOMENT_RTOL = 0.01
LR_TENSOR = "embed.weight"
# muP hidden matrices (both dimensions grow with the width), by the engine's parameter names.
HIDDEN_MATRICES = (".attn.qkv", ".attn.o", ".mlp.fc1", ".mlp.fc2")

BYTE_VOCAB, BYTE_EOS = 258, 257  # the engine's byte tokenizer: ids 0..255 bytes, 256 BOS, 257 EOS

# Fields of the expected config that meta.json must repeat exactly (architecture and the
# optimizer constants the lr estimate relies on). Derived fields (batch sizes) are not compared.
CHECKED_FIELDS = ("vocab_size", "vocab_pad_multiple", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "ffn_hidden_size", "rms_norm_eps", "rope_theta", "mup", "scale_emb", "scale_depth",
                  "dim_model_base", "seq_length", "adam_beta1", "adam_beta2", "adam_eps", "tp", "document_mask",
                  "reset_position_ids", "optimizer")
# The optimizer whose update c. models (and whose moments harness/judge/claims/exactstep.py reads): torch's AdamW on every
# tensor. A job asked to run another (`--optimizer muon`: Newton-Schulz-orthogonalised momentum for the hidden
# matrices, no Adam moments for them) cannot be verified by these checks, and is refused by name rather than
# misjudged as a run that hid its moments or applied the wrong lr.
VERIFIED_OPTIMIZER = "adamw"


@dataclass
class Evidence:
    checkpoint: str = ""
    final_step: int | None = None
    previous_step: int | None = None
    judge_val_loss: float | None = None  # final weights, held-out windows drawn with `seed`
    judge_val_loss_prev: float | None = None  # weights of step N - 1
    judge_tokens: int = 0
    judge_val_windows: int | None = None  # windows_digest of the held-out windows (two jobs' losses compare on equal ones)
    claimed_train_loss: float | None = None  # [LOSS] global_loss of the final step
    claimed_val_loss: float | None = None  # [EVAL] val_loss of the final step
    lr_claimed: float | None = None
    lr_estimate: float | None = None  # on embed.weight
    wd_estimate: float | None = None  # (lr * wd) / lr on embed.weight
    lr_by_tensor: dict[str, float] = field(default_factory=dict)
    lr_multipliers: dict[str, float] = field(default_factory=dict)  # expected factor on the printed lr, per fitted tensor
    trajectory: dict[int, float] = field(default_factory=dict)
    judge_train_loss: float | None = None  # step N - 1's weights on training-split windows  # step -> judge's loss of the weights before it
    moment_residual: float | None = None
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"ok": self.ok}


# --- validation data (the judge's own tokenization) ------------------------------------------------


@dataclass(frozen=True)
class TokenStream:
    tokens: torch.Tensor  # int64, documents each followed by EOS
    vocab_size: int
    description: str
    eos_id: int  # the EOS every document ends with (where --document-mask starts a new one)


def embedded_tokens(jsonl: bytes, *, text_field: str = "text", text_template: str = "") -> TokenStream:
    """The engine's embedded-corpus split (engine/data/corpus/<split>.jsonl, as bytes from the BASE
    commit) with the byte tokenizer: each record's text (`text_field`, or `text_template`
    .format_map(record)) as UTF-8 bytes followed by EOS 257; empty texts skipped."""
    ids: list[int] = []
    docs = 0
    for line in jsonl.decode("utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        text = text_template.format_map(record) if text_template else record.get(text_field)
        if not text:
            continue
        ids.extend(text.encode("utf-8"))
        ids.append(BYTE_EOS)
        docs += 1
    digest = hashlib.sha256(jsonl).hexdigest()[:12]
    return TokenStream(torch.tensor(ids, dtype=torch.int64), BYTE_VOCAB,
                       f"embedded corpus ({docs} documents, {len(ids)} byte tokens, sha256 {digest})", BYTE_EOS)


def shard_tokens(folder: Path | str, *, verify_sha256: bool = True) -> TokenStream:
    """A split written by `engine prepare` (engine/data/format.py): index.json + raw little-endian
    uint16/uint32 tokens-*.bin shards, in stream order."""
    folder = Path(folder)
    index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    dtypes = {"uint16": (torch.int16, 2, 0xFFFF), "uint32": (torch.int32, 4, 0xFFFFFFFF)}
    if index.get("format") != "temper-token-shards" or index.get("dtype") not in dtypes:
        raise ValueError(f"{folder}: not a temper-token-shards split of uint16/uint32 tokens")
    signed, width, mask = dtypes[index["dtype"]]
    parts = []
    for shard in index["shards"]:
        raw = (folder / shard["file"]).read_bytes()
        if len(raw) != int(shard["num_tokens"]) * width:
            raise ValueError(f"{folder / shard['file']}: {len(raw)} bytes, index.json says {shard['num_tokens']} tokens")
        if verify_sha256 and hashlib.sha256(raw).hexdigest() != shard["sha256"]:
            raise ValueError(f"{folder / shard['file']}: sha256 differs from index.json")
        parts.append(torch.frombuffer(bytearray(raw), dtype=signed).to(torch.int64) & mask)
    tokens = torch.cat(parts)
    return TokenStream(tokens, int(index["tokenizer"]["vocab_size"]),
                       f"prepared shards {folder} ({tokens.numel()} tokens, tokenizer {index['tokenizer']['name']})",
                       int(index["tokenizer"]["eos_id"]))


def _draw_windows(stream: TokenStream, seq_length: int, num_samples: int, seed: int) -> torch.Tensor:
    n = stream.tokens.numel() - seq_length - 1
    if n <= 0:
        raise ValueError(f"validation data ({stream.tokens.numel()} tokens) is shorter than one window of {seq_length + 1}")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) & ((1 << 63) - 1))
    starts = torch.randint(0, n + 1, (num_samples,), generator=gen)
    return torch.stack([stream.tokens[s:s + seq_length + 1] for s in starts.tolist()])


def windows_digest(windows: torch.Tensor) -> int:
    """52 bits of the SHA-256 of the drawn windows' token ids: exact as a float, so it travels with the other measured
    numbers; equal digests mean two jobs' judged losses were taken on the same text (metrics' val_loss_rel_diff)."""
    return int(hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:13], 16)


@dataclass(frozen=True)
class JudgedLoss:
    """The judge's mean loss over its windows, how many tokens it read, and the relative spread (standard
    deviation / mean) of one window's own mean loss: how far a batch of one sequence may sit from the mean."""
    mean: float
    tokens: int
    spread: float


def _judge_loss(params: Mapping[str, torch.Tensor], config: Mapping[str, Any], windows: torch.Tensor,
                batch: int, device: str, eos_id: int) -> JudgedLoss:
    p = {k: v.to(device=device, dtype=torch.float32) for k, v in params.items()}
    rows = torch.cat([reference.row_loss_sums(p, config, windows[i:i + batch].to(device), eos_id=eos_id).cpu()
                      for i in range(0, windows.shape[0], batch)]) / (windows.shape[1] - 1)
    mean = float(rows.mean())
    spread = float(rows.std()) / abs(mean) if rows.numel() > 1 and mean else 0.0
    return JudgedLoss(mean=mean, tokens=rows.numel() * (windows.shape[1] - 1), spread=spread)


def batch_rtol(floor: float, tokens: int | None, seq: int, spread: float) -> float:
    """How far a printed batch loss of `tokens` tokens (sequences of `seq`) may sit from the judge's mean: at least
    `floor`, and BATCH_SIGMAS standard errors of a batch of that many sequences (see BATCH_SIGMAS)."""
    if not tokens:  # a line without its token count gets no room for batch noise
        return floor
    return max(floor, BATCH_SIGMAS * spread / math.sqrt(max(1, int(tokens) // max(1, seq))))


# --- learning rate ---------------------------------------------------------------------------------

SCHEDULE_FIELDS = ("lr", "min_lr_ratio", "lr_schedule", "warmup_steps", "decay_steps", "num_steps")


def scheduled_lr(config: Mapping[str, Any], step: int) -> float:
    """The lr the expected config's schedule gives optimizer step `step` (0-based; printed step N is N - 1).
    Restated from engine/optim/schedule.py of the base: linear warmup from lr / warmup to lr, then
    cosine / linear from lr at step `warmup` to lr * min_lr_ratio at the last step, constant, or wsd (flat,
    then a linear decay over the last decay_steps, default 10 % of the run)."""
    peak = float(config["lr"])
    floor = peak * float(config["min_lr_ratio"])
    warmup, total = int(config["warmup_steps"]), int(config["num_steps"])
    kind = config["lr_schedule"]
    if step < warmup:
        return peak * (step + 1) / warmup
    if kind == "constant":
        return peak
    if kind == "wsd":
        decay = int(config["decay_steps"]) or max(1, round(0.1 * total))
        start = total - decay
        if step < start:
            return peak
        return peak + (floor - peak) * min(1.0, (step - start + 1) / decay)
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    if kind == "linear":
        return peak + (floor - peak) * progress
    if kind == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {kind!r}")


def lr_multiplier(name: str, config: Mapping[str, Any]) -> float:
    """The factor on the scheduled lr that parameter `name` trains with under the expected config:
    muP-Adam (Tensor Programs V; MiniCPM) puts hidden matrices at 1 / (hidden_size / dim_model_base)
    and keeps vector-like tensors (embedding, norm gains, the width-scaled LM head) at 1; without
    muP every tensor is at 1. Raises KeyError when the config lacks a field it needs."""
    if not config["mup"] or not name.endswith(HIDDEN_MATRICES):
        return 1.0
    return int(config["dim_model_base"]) / int(config["hidden_size"])


def estimate_lr(w_prev: torch.Tensor, w: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *, t: int,
                beta1: float, beta2: float, eps: float, decay: bool = True) -> tuple[float, float]:
    """(lr, lr * wd) of one AdamW step w_prev -> w with moments (exp_avg, exp_avg_sq) after it, by
    least squares over all elements in fp64 (decay False: lr alone, lr * wd = 0)."""
    wp, delta = w_prev.double().flatten(), (w.double() - w_prev.double()).flatten()
    m_hat = exp_avg.double().flatten() / (1 - beta1 ** t)
    v_hat = exp_avg_sq.double().flatten() / (1 - beta2 ** t)
    u = torch.where(m_hat == 0, 0.0, m_hat / (v_hat.sqrt() + eps))  # 0 / 0 (eps 0, never-updated rows) -> no step
    if not (torch.isfinite(u).all() and torch.isfinite(delta).all() and torch.isfinite(wp).all()):
        return float("nan"), float("nan")
    # delta = -(lr * wd) * wp - lr * u
    if not decay:
        uu = float(u @ u)
        return (float(-(u @ delta)) / uu if uu else float("nan")), 0.0
    a = torch.stack([wp, u], dim=1)
    ata, atb = a.t() @ a, a.t() @ delta
    if torch.linalg.matrix_rank(ata).item() < 2:
        return float("nan"), float("nan")
    coef = torch.linalg.solve(ata, atb)
    return float(-coef[1]), float(-coef[0])


def _moment_residual(m_prev, m, v_prev, v, beta1: float, beta2: float) -> float:
    """Relative mismatch of sum(v - b2 v_prev) and (1 - b2) sum(g^2), g recovered from the m's."""
    g = (m.double() - beta1 * m_prev.double()) / (1 - beta1)
    lhs = float((v.double() - beta2 * v_prev.double()).sum())
    rhs = float((1 - beta2) * (g * g).sum())
    return abs(lhs - rhs) / max(abs(rhs), 1e-30)


# --- the check -------------------------------------------------------------------------------------


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _by_step(records: Iterable[Any], step: int) -> Any | None:
    found = [r for r in records if getattr(r, "step", None) == step]
    return found[-1] if found else None


def verify_train_run(save_dir: Path | str, *, expected_config: Mapping[str, Any], printed_steps: Sequence[Any],
                     printed_evals: Sequence[Any] = (), seed: int, validation: TokenStream,
                     training: TokenStream | None = None, num_samples: int = 32,
                     batch_size: int = 8, device: str = "cpu", require_lr_check: bool = True,
                     check_schedule: bool = True, lr_tensors: Sequence[str] | None = None,
                     val_rtol: float = VAL_RTOL, train_rtol: float = TRAIN_RTOL, lr_rtol: float = LR_RTOL,
                     moment_rtol: float = MOMENT_RTOL) -> Evidence:
    """Check a finished run's final checkpoint in `save_dir` against the expected config and its printed claims.

    `printed_steps`: the job's [LOSS] records (objects with .step, .loss, .lr, e.g. logparse.StepRecord);
    `printed_evals`: its [EVAL] records (.step, .val_loss). `validation`: the run's validation tokens,
    from the base commit (embedded_tokens / shard_tokens). `seed`: picked by the judge per judging.
    `check_schedule`: the printed lr of every step must also equal the expected config's schedule
    (off for a milestone whose point is to change the schedule). `lr_tensors`: the tensors whose lr
    is fitted and reported (None: all; embed.weight always, it is the one compared). Memory: the
    final checkpoint's masters and those tensors' moments, step N - 1's masters and embed moments.
    Never raises for a bad run: every problem is a violation in the returned Evidence.
    """
    ev = Evidence()
    optimizer = expected_config.get("optimizer", VERIFIED_OPTIMIZER)
    if optimizer != VERIFIED_OPTIMIZER:
        ev.violations.append(
            f"config: the job's argv asks for --optimizer {optimizer}; the judge verifies the applied learning rate and "
            f"each exact step from AdamW's moments (harness/judge/claims/evidence.py, exactstep.py), which a {optimizer} run does "
            f"not keep for its hidden matrices: give the milestone's gate `verify = false` or run --optimizer adamw")
        return ev
    steps = list(printed_steps)
    if not steps:
        ev.violations.append("no [LOSS] lines were printed; nothing to verify")
        return ev
    last = max(steps, key=lambda r: r.step)
    ev.claimed_train_loss, ev.lr_claimed = last.loss, last.lr
    found = list_checkpoints(Path(save_dir))
    if not found:
        ev.violations.append(f"checkpoint: {save_dir} holds no complete step_* checkpoint to verify the claims with")
        return ev
    final_path = found[-1]
    ev.checkpoint = str(final_path)
    # a. size and config, from meta.json and the DCP metadata, before any tensor is allocated
    try:
        meta = read_meta(final_path)
        _check_config(ev, final_path, meta, expected_config)
        tp = int(expected_config.get("tp", meta["layout"]["tp"]))
        problems = size_mismatches(final_path, dict(expected_config), tp) if not _missing_model_fields(ev, expected_config) else []
    except CheckpointError as err:
        ev.violations.append(f"checkpoint: {err}")
        return ev
    ev.violations += [f"model shape: {p} in {final_path}" for p in problems[:20]]
    if len(problems) > 20:
        ev.violations.append(f"model shape: ... and {len(problems) - 20} more in {final_path}")
    if problems or any(v.startswith(("config:", "model shape")) for v in ev.violations):
        return ev  # another model than the expected one: nothing more is measured
    try:
        final = _load(final_path, lr_tensors)
    except CheckpointError as err:
        ev.violations.append(f"checkpoint: {err}")
        return ev
    ev.final_step = final.step
    if final.step != last.step:
        ev.violations.append(f"checkpoint: the final checkpoint is step {final.step} but the log's last step is {last.step}")
    if "num_steps" in expected_config and last.step != int(expected_config["num_steps"]):
        ev.violations.append(f"config: the log ends at step {last.step}, the expected run has num_steps "
                             f"{expected_config['num_steps']}")
    if final.adam_step != final.step:
        ev.violations.append(f"checkpoint: Adam step {final.adam_step} != step {final.step} in {final_path}")

    _check_shapes(ev, final, expected_config)

    # b. losses
    cfg = reference.judged_config(expected_config, final.config)  # packed documents as the job was asked, too
    seq = int(expected_config.get("seq_length", cfg.get("seq_length")))
    prev: JudgeCheckpoint | None = None
    prev_path = next((p for p in reversed(found[:-1]) if p.name == f"step_{final.step - 1:08d}"), None)
    if prev_path is not None:
        try:
            prev = _load(prev_path, [LR_TENSOR])
            ev.previous_step = prev.step
        except CheckpointError as err:
            ev.violations.append(f"checkpoint: {err}")
    if any(v.startswith("model shape") for v in ev.violations):
        return ev
    if validation.vocab_size > int(cfg["vocab_size"]):
        ev.violations.append(f"config: the validation tokenizer has {validation.vocab_size} ids, the model {cfg['vocab_size']}")
        return ev
    windows = _draw_windows(validation, seq, num_samples, seed)
    ev.judge_val_windows = windows_digest(windows)
    judged_val = _judge_loss(final.masters, cfg, windows, batch_size, device, validation.eos_id)
    ev.judge_val_loss, ev.judge_tokens = judged_val.mean, judged_val.tokens
    judged_prev = None
    if prev is not None:
        judged_prev = _judge_loss(prev.masters, cfg, windows, batch_size, device, validation.eos_id)
        ev.judge_val_loss_prev = judged_prev.mean
    if not math.isfinite(ev.judge_val_loss):
        ev.violations.append(f"val loss: the judge's loss of the final weights is {ev.judge_val_loss}")
    claimed_eval = _by_step(printed_evals, final.step)
    if claimed_eval is not None:
        ev.claimed_val_loss = claimed_eval.val_loss
        rel = _rel(claimed_eval.val_loss, ev.judge_val_loss)
        if not rel <= val_rtol:
            ev.violations.append(f"val loss: the run claims val_loss {claimed_eval.val_loss:.6g} at step {final.step}; "
                                 f"the judge measures {ev.judge_val_loss:.6g} on {ev.judge_tokens} held-out tokens "
                                 f"(relative difference {rel:.3g} > {val_rtol})")
    judged_train = None
    if ev.claimed_train_loss is not None and training is not None:
        weights = prev.masters if prev is not None else final.masters
        judged_train = _judge_loss(weights, cfg, _draw_windows(training, seq, num_samples, seed), batch_size, device,
                                   training.eos_id)
        ev.judge_train_loss = judged_train.mean
    if ev.claimed_train_loss is not None:
        ref = judged_train or judged_prev or judged_val
        which = f"step {prev.step}'s weights" if prev is not None else "the final weights"
        rel = _rel(ev.claimed_train_loss, ref.mean)
        rtol = batch_rtol(train_rtol, last.tokens, seq, ref.spread)
        if not rel <= rtol:
            ev.violations.append(f"val loss: the run claims training loss {ev.claimed_train_loss:.6g} at step {last.step}; "
                                 f"the judge measures {ref.mean:.6g} with {which} on {ref.tokens} held-out tokens "
                                 f"(relative difference {rel:.3g} > {rtol:.3g}: {train_rtol}, or {BATCH_SIGMAS:g} standard "
                                 f"errors of a {last.tokens}-token batch, one window's loss spreading {ref.spread:.3g})")

    # b'. every other printed loss the judge kept weights for (step k's checkpoint -> [LOSS] of step k + 1)
    # Printed training losses are losses on training batches: held against training-split windows when the
    # judge has them (the validation split can sit a few percent away from it on a small corpus).
    train_windows = _draw_windows(training, seq, num_samples, seed) if training is not None else windows
    train_eos = training.eos_id if training is not None else validation.eos_id
    _check_trajectory(ev, found[:-1], prev, steps, cfg, train_windows, batch_size, device, train_eos, seq)

    # c. learning rate
    _check_lr(ev, final, prev, expected_config, last, require_lr_check, lr_rtol, moment_rtol)
    if check_schedule:
        _check_schedule(ev, steps, expected_config, lr_rtol)
    return ev


def _check_trajectory(ev: Evidence, earlier: Sequence[Path], prev: JudgeCheckpoint | None, steps: Sequence[Any],
                      cfg: Mapping[str, Any], windows: torch.Tensor, batch_size: int, device: str, eos_id: int,
                      seq: int) -> None:
    """The printed training loss of step k + 1 against the judge's loss of step k's weights, for every
    checkpoint the run left besides the last two (which the final-step check covers). A made-up curve
    with honest final weights is caught here; a run that keeps no other checkpoint is not checked.

    Tolerance: one training batch against the judge's training-split windows. Measured: tiny preset
    (2048 tokens a step) at most 1.9 % apart; llama-tiny with 512 tokens a step up to 9 %. The noise of a
    batch mean shrinks as 1/sqrt(sequences in the batch), so the bound is `batch_rtol`: max(10 %, BATCH_SIGMAS
    standard errors of the step's batch, from the spread of the judge's own windows): a made-up curve has to
    stay within batch noise of the real one at every kept step."""
    for path in earlier:
        step = int(path.name.removeprefix("step_"))
        if prev is not None and step == prev.step:
            continue
        printed = _by_step(steps, step + 1)
        if printed is None or printed.loss is None:
            continue
        try:
            masters = load_checkpoint(path, kinds=("master",)).masters
        except CheckpointError as err:
            ev.violations.append(f"checkpoint: {err}")
            return
        judged = _judge_loss(masters, cfg, windows, batch_size, device, eos_id)
        ev.trajectory[step + 1] = judged.mean
        rel = _rel(printed.loss, judged.mean)
        rtol = batch_rtol(TRAJECTORY_RTOL, printed.tokens, seq, judged.spread)
        if not rel <= rtol:
            ev.violations.append(f"val loss: the run claims training loss {printed.loss:.6g} at step {step + 1}; the judge "
                                 f"measures {judged.mean:.6g} with step {step}'s weights (relative difference {rel:.3g} > "
                                 f"{rtol:.3g})")


def _load(path: Path, moment_names: Sequence[str] | None) -> JudgeCheckpoint:
    """All masters; moments of `moment_names` (None: all) plus embed.weight."""
    ck = load_checkpoint(path, kinds=("master",))
    names = None if moment_names is None else sorted(set(moment_names) | {LR_TENSOR})
    moments = load_checkpoint(path, kinds=("exp_avg", "exp_avg_sq"), names=names)
    ck.tensors.update(moments.tensors)
    return ck


def _check_schedule(ev: Evidence, steps: list[Any], expected: Mapping[str, Any], rtol: float) -> None:
    missing = [k for k in SCHEDULE_FIELDS if k not in expected]
    if missing:
        ev.notes.append(f"learning rate schedule not checked: the expected config lacks {missing}")
        return
    for rec in sorted(steps, key=lambda r: r.step):
        try:
            want = scheduled_lr(expected, rec.step - 1)
        except ValueError as err:
            ev.violations.append(f"learning rate: the base engine defines no such schedule ({err}) and the milestone "
                                 "states no lr_contract for it")
            return
        if rec.lr is None or not _rel(rec.lr, want) <= rtol:
            ev.violations.append(f"learning rate: step {rec.step} printed lr={rec.lr}; the expected config's "
                                 f"{expected['lr_schedule']} schedule gives {want:.6g}")
            return


def _missing_model_fields(ev: Evidence, expected: Mapping[str, Any]) -> bool:
    missing = [k for k in SHAPE_FIELDS if k not in expected]
    if missing:
        ev.violations.append(f"config: the expected config lacks the model field(s) {missing}; the model size cannot be checked")
    return bool(missing)


def _check_config(ev: Evidence, path: Path, meta: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    meta_cfg = meta["config"]
    for key in CHECKED_FIELDS:
        if key in expected and key in meta_cfg and meta_cfg[key] != expected[key]:
            ev.violations.append(f"config: meta.json of {path} has {key}={meta_cfg[key]!r}, expected {expected[key]!r}")
    if "tp" in expected and int(expected["tp"]) != int(meta["layout"]["tp"]):
        ev.violations.append(f"config: {path} was written with TP {meta['layout']['tp']}, expected TP {expected['tp']}")


def _check_shapes(ev: Evidence, final: JudgeCheckpoint, expected: Mapping[str, Any]) -> None:
    """The loaded whole tensors against the expected config's shapes (a second look after the sizes)."""
    want = full_shapes(dict(expected), tp=final.layout["tp"])
    got = {n: tuple(t.shape) for n, t in final.masters.items()}
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            ev.violations.append(f"model shape: {name} is {got.get(name)} in {final.path}, the expected config implies "
                                 f"{want.get(name)}")


def _check_lr(ev: Evidence, final: JudgeCheckpoint, prev: JudgeCheckpoint | None, expected: Mapping[str, Any],
              last: Any, required: bool, lr_rtol: float, moment_rtol: float) -> None:
    if prev is None:
        msg = (f"learning rate: cannot be verified, no checkpoint of step {final.step - 1} next to step {final.step} "
               f"(save every step near the end, keep at least 2)")
        (ev.violations if required else ev.notes).append(msg)
        return
    src = {k: expected.get(k, final.config.get(k)) for k in ("adam_beta1", "adam_beta2", "adam_eps")}
    if any(v is None for v in src.values()):
        ev.violations.append(f"learning rate: cannot be verified, betas / eps unknown ({src})")
        return
    b1, b2, eps = float(src["adam_beta1"]), float(src["adam_beta2"]), float(src["adam_eps"])
    t = int(last.step)
    if prev.adam_step != t - 1:
        ev.violations.append(f"learning rate: cannot be verified, Adam step of {prev.path} is {prev.adam_step}, not {t - 1}")
        return
    try:
        ev.lr_multipliers = {name: lr_multiplier(name, expected) for name in final.exp_avg}
    except KeyError as err:
        ev.violations.append(f"learning rate: cannot be verified, the expected config lacks {err} (needed for the muP "
                             f"lr multipliers)")
        return
    for name in final.exp_avg:
        w = final.masters[name]
        decay = w.ndim >= 2
        lr, lrwd = estimate_lr(prev.masters[name], w, final.exp_avg[name], final.exp_avg_sq[name], t=t, beta1=b1,
                               beta2=b2, eps=eps, decay=decay)
        ev.lr_by_tensor[name] = lr
        if name == LR_TENSOR:
            ev.lr_estimate = lr
            ev.wd_estimate = lrwd / lr if lr and math.isfinite(lr) else None
    name = LR_TENSOR
    ev.moment_residual = _moment_residual(prev.exp_avg[name], final.exp_avg[name], prev.exp_avg_sq[name],
                                          final.exp_avg_sq[name], b1, b2)
    if not ev.moment_residual <= moment_rtol:
        ev.violations.append(f"learning rate: cannot be verified, the Adam moments of {name} at steps {prev.step} and "
                             f"{final.step} are inconsistent (v - b2 v_prev vs (1 - b2) g^2 differ by "
                             f"{ev.moment_residual:.3g} relative > {moment_rtol})")
    if ev.lr_claimed is None:
        ev.violations.append(f"learning rate: step {t} printed no lr; the judge estimates {ev.lr_estimate:.6g}")
        return
    rel = _rel(ev.lr_estimate, ev.lr_claimed) if ev.lr_estimate is not None else float("nan")
    if not rel <= lr_rtol:
        ev.violations.append(f"learning rate: step {t} printed lr={ev.lr_claimed:.6g}; the optimizer state applied "
                             f"{ev.lr_estimate:.6g} to {name} (from checkpoints {prev.step} and {final.step}; relative "
                             f"difference {rel:.3g} > {lr_rtol})")
    _check_multipliers(ev, t, lr_rtol)


def _check_multipliers(ev: Evidence, t: int, lr_rtol: float) -> None:
    """Every fitted tensor but the headline one against the printed lr x its expected multiplier."""
    wrong = []
    for name, fitted in ev.lr_by_tensor.items():
        want = ev.lr_claimed * ev.lr_multipliers[name]
        if name != LR_TENSOR and not _rel(fitted, want) <= lr_rtol:
            wrong.append(f"{name} {fitted:.6g} (expected lr x {ev.lr_multipliers[name]:.6g} = {want:.6g})")
    if wrong:
        ev.violations.append(f"learning rate: step {t} printed lr={ev.lr_claimed:.6g}; the optimizer state applied another "
                             f"lr to {len(wrong)} tensor(s), muP multipliers restated from the expected config: "
                             f"{'; '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''} (relative tolerance {lr_rtol})")
