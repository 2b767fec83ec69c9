"""Per-step wire lines on stdout, their JSONL twin, and optional TensorBoard scalars.

`tokens` is the number of tokens in that step (global, all DP ranks) and `time_s` that step's wall
time, so tokens / time_s is the step's throughput.

The wire format is a contract with the harness's log parser (keep it byte for byte):
  [LOSS] step=N global_loss=%.9e grad_norm=%.9e lr=%.6e tokens=N time_s=%.6f mfu=%.4f
  [EVAL] step=N val_loss=%.9e val_bpb=%.6f tokens=N
`.9e` keeps bitwise comparisons of losses honest. Only the main rank writes. MFU uses the count in
engine/flops.py and is printed as a fraction (0.5 = 50%).
"""

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from engine.atomic_files import write_text_atomic
from engine.errors import ConfigError

__all__ = ["MetricsWriter", "loss_line", "eval_line", "skip_line", "keep_through_step"]


def loss_line(step: int, loss: float, grad_norm: float, lr: float, tokens: int, time_s: float, mfu: float) -> str:
    return (f"[LOSS] step={step} global_loss={loss:.9e} grad_norm={grad_norm:.9e} lr={lr:.6e} "
            f"tokens={tokens} time_s={time_s:.6f} mfu={mfu:.4f}")


def skip_line(step: int, loss: float, running_mean: float, factor: float, consecutive: int, total: int) -> str:
    """A step whose update was skipped as a loss spike (engine/optim/spike.py); not a wire record."""
    return (f"[SKIP] step={step} global_loss={loss:.9e} running_mean={running_mean:.9e} factor={factor:g} "
            f"consecutive={consecutive} skipped_batches={total}")


def eval_line(step: int, val_loss: float, val_bpb: float, tokens: int) -> str:
    return f"[EVAL] step={step} val_loss={val_loss:.9e} val_bpb={val_bpb:.6f} tokens={tokens}"


def keep_through_step(path: Path, step: int) -> int:
    """Rewrite a metrics.jsonl without the records after `step`, atomically (a crash meanwhile leaves the
    old file whole); returns how many lines were dropped. A run that crashed after its last checkpoint
    logged steps it will now repeat; a torn last line (killed mid-write) is dropped too."""
    if not path.is_file():
        return 0
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    kept = []
    for number, line in enumerate(lines, 1):
        if not line.endswith("\n") and number == len(lines):
            break  # torn by a kill mid-write
        try:
            later = json.loads(line)["step"] > step
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError("--run-dir", str(path.parent), f"repair or remove line {number} of {path}",
                              f"holds a metrics.jsonl that is not one JSON record with a step per line ({err!r})") from err
        if not later:
            kept.append(line)
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(kept))
    return len(lines) - len(kept)


class MetricsWriter:
    def __init__(self, run_dir: Path, *, enabled: bool, tensorboard: bool, resume_step: int | None = None,
                 stream: TextIO | None = None):
        """resume_step: a resumed run continues metrics.jsonl from that step (later records, which it will
        write again, are dropped first); None: start it afresh."""
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self._jsonl = None
        self._tb = None
        self.dropped = 0  # metrics.jsonl records after the resumed step, removed
        if not enabled:
            return
        path = run_dir / "metrics.jsonl"
        self.dropped = keep_through_step(path, resume_step) if resume_step is not None else 0
        self._jsonl = path.open("a" if resume_step is not None else "w", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            # purge_step: TensorBoard hides the events a crashed run wrote after the resumed step
            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def _emit(self, line: str, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        print(line, file=self.stream, flush=True)
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                if key not in ("kind", "step") and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"{record['kind']}/{key}", value, step)

    def log_step(self, *, step: int, loss: float, grad_norm: float, lr: float, tokens: int, time_s: float,
                 mfu: float, peak_mem_gib: float, skipped_batches: int = 0, print_line: bool = True,
                 extra: dict[str, Any] | None = None) -> None:
        """skipped_batches: loss-spike skips so far in the run; extra: more keys of the record (the elapsed training
        time, per-source token counts). JSONL and TensorBoard only: the wire line is fixed (harness/judge/logparse.py)."""
        record = {"kind": "loss", "step": step, "global_loss": loss, "grad_norm": grad_norm, "lr": lr,
                  "tokens": tokens, "time_s": time_s, "mfu": mfu, "peak_mem_gib": peak_mem_gib,
                  "skipped_batches": skipped_batches, **(extra or {})}
        line = loss_line(step, loss, grad_norm, lr, tokens, time_s, mfu)
        if print_line:
            self._emit(line, record)
        elif self.enabled:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()

    def log_eval(self, *, step: int, val_loss: float, val_bpb: float, tokens: int) -> None:
        record = {"kind": "eval", "step": step, "val_loss": val_loss, "val_bpb": val_bpb, "tokens": tokens}
        self._emit(eval_line(step, val_loss, val_bpb, tokens), record)

    def info(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
