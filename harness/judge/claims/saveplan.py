"""Which checkpoints the judge makes a train job leave, so that it can verify the job's claims from them.

The judge verifies a finished train job from its checkpoints (harness/judge/claims/evidence.py: the final
weights' loss and the applied learning rate; harness/judge/claims/exactstep.py: each verified step's loss, grad
norm and applied gradient on its exact batch). A step N is verified exactly when checkpoints N - 1 and
N both exist, so the judge rewrites the job's argv (`plan_saves`):

- CPU, every step's checkpoint fits in JOB_BUDGET bytes: `--save-every 1 --keep-last <all>`. Every step
  from 2 on is verified. A cadence the milestone chose is replaced (CPU milestones time nothing, and all
  of its checkpoints are kept, so a later job resuming from one still finds it).
- CPU, they do not fit: `--save-every 1 --keep-last 4`, and the judge keeps (harness/judge/claims/keeper.py) the
  final pair and as many secret random pairs as KEEP_BUDGET holds: the job cannot tell which steps
  are checked, so it has to do every step's full work. (With a cadence of the milestone's own, which the
  judge keeps here, only the final pair: see below.)
- GPU: saving every step would cost the run its speed (0.5B: 6 GB a checkpoint), so only the final pair,
  `--save-last 2` (the base engine's flag: the last two steps are saved whatever the cadence), if the
  disk holds it. MFU milestones are then verified on their final step only; what that leaves open is
  in docs/HARNESS.md's threat model.
A base whose engine has no `--save-last` gets the judge's old request (the final weights only on GPU):
`limits` says what is then not verified, and the job gate puts it on the verdict.

A run verified on its final step alone could do less work on the steps before it. So the judge then replays
the job, untimed (`plan_replay`): the same argv and seed in a folder of its own, checkpointing after steps
k - 1, k and k + 1 for a secret k in 2..N - 2 (`--save-at`, synchronous saves), stopped (SIGKILL) at the printed
line of step k + 2. Under --deterministic (the engine's default) the replay must print steps 1..k + 2 bit for bit
as the timed run did, and steps k and k + 1 are verified exactly on its checkpoints.

The replay tells the engine k (its argv names the steps it saves), and that costs the check nothing: whatever
the replay does, its lines must be the timed run's, which did not know k. If the timed run did less work on
step k or k + 1, the replay either does the same (the exact check of that step fails) or does the full work
there (its state, and so its printed loss at k + 1 or k + 2, differs from the timed run's). A run that does less
work on a fraction f of its steps is caught with the probability that k or k + 1 is one of them, as it would be
by a replay saving every step without naming k; that replay cost a checkpoint every step (0.5B: 6 GB, ~6-10 s
each on an H200 host, docs/fp8.md), this one three. A base engine without `--save-at` is replayed saving
every step.
Checkpoints hold fp32 masters and two Adam moments: 12 bytes a parameter.
"""

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.judge.baseconfig import flag_values

__all__ = ["SavePlan", "ReplayPlan", "plan_saves", "plan_replay", "checkpoint_bytes", "JOB_BUDGET", "KEEP_BUDGET"]

JOB_BUDGET = 256 * 2**20  # bytes of per-step checkpoints a CPU job keeps in its own folder
KEEP_BUDGET = 3 * 2**30  # bytes of checkpoints the judge keeps for itself to verify sampled steps
_SLACK = 4  # --keep-last of a sampled job: the judge links each checkpoint before the job prunes it
_REPLAY_KEEP = 4  # --keep-last of a replay: k - 1 .. k + 2 whether or not step k + 2's save finished before the kill


@dataclass(frozen=True)
class SavePlan:
    argv: list[str]
    save_dir: Path  # where the job's checkpoints land
    num_steps: int
    scope: str  # which steps the plan lets the judge verify exactly, for the job gate's summary
    sample_pairs: int = 0  # secret pairs the judge keeps as the job runs (keeper.draw_pairs), 0: none
    pairs_expected: bool = True  # the job was asked for consecutive checkpoints: none at the end is its fault
    limits: str = ""  # why no step can be verified exactly (a flag on the verdict), "" when some can


def checkpoint_bytes(cfg: Mapping[str, Any]) -> int:
    """Bytes of one checkpoint of the model `cfg` describes (0 when the config does not say)."""
    try:
        h, layers, ffn = int(cfg["hidden_size"]), int(cfg["num_layers"]), int(cfg["ffn_hidden_size"])
        heads, kv, d = int(cfg["num_heads"]), int(cfg["num_kv_heads"]), int(cfg["head_dim"])
        attn = h * (heads + 2 * kv) * d + heads * d * h
        return 12 * (2 * int(cfg["vocab_size"]) * h + layers * (attn + 3 * h * ffn + 2 * h) + h)
    except (KeyError, TypeError, ValueError):
        return 0


def plan_saves(argv: Sequence[str], job_dir: Path, *, expected: Mapping[str, Any], base_defaults: Mapping[str, Any],
               device: str, free_bytes: int) -> SavePlan:
    """The job's argv with the saves the judge needs (module doc); `free_bytes`: free disk where job_dir lives."""
    out = [a for a in argv if a != "--no-save-final"]
    flags = flag_values(out)
    if "save-dir" not in flags:
        out += ["--save-dir", str(Path(job_dir) / "checkpoints")]
    size = checkpoint_bytes(expected)
    steps = int(expected.get("num_steps", 0))
    where = {"save_dir": Path(str(flag_values(out)["save-dir"])), "num_steps": steps}
    if device == "cpu" and size and size * (steps + 1) <= JOB_BUDGET:
        return SavePlan(**where, argv=out + ["--save-every", "1", "--keep-last", str(steps + 1), "--save-final"], scope="every step")
    if device == "cpu" and size and "save-every" not in flags:
        pairs = max(0, (KEEP_BUDGET // size - _SLACK) // 2)
        return SavePlan(**where, argv=out + ["--save-every", "1", "--keep-last", str(_SLACK), "--save-final"], sample_pairs=pairs,
                        scope=f"the final step and {pairs} secret random steps")
    if "save_last" not in base_defaults:
        return SavePlan(**where, argv=out + ["--save-final"], scope="none", pairs_expected=False,
                        limits="exact steps not verified: the base engine has no --save-last to keep checkpoint N - 1")
    keep = max(int(expected.get("keep_last", 1)), 2)
    if size and size * (keep + 1) > free_bytes:
        return SavePlan(**where, argv=out + ["--save-final"], scope="none", pairs_expected=False,
                        limits=f"exact steps not verified: {keep + 1} checkpoints of {size / 2**30:.1f} GiB do not fit in "
                               f"the {free_bytes / 2**30:.1f} GiB free beside the job")
    return SavePlan(**where, argv=out + ["--save-last", "2", "--keep-last", str(keep), "--save-final"], scope="the final step")


@dataclass(frozen=True)
class ReplayPlan:
    argv: list[str]
    save_dir: Path
    num_steps: int
    step: int  # the secret step k: checkpoints k - 1 and k are left when the replay is stopped
    stop_at: int  # the step whose printed line stops the replay (SIGKILL): k + 2
    saves: str  # the saves it asks for, as said on a verdict: "--save-at 27,28,29" or "--save-every 1"


def plan_replay(argv: Sequence[str], job_dir: Path, *, expected: Mapping[str, Any], base_defaults: Mapping[str, Any],
                free_bytes: int, draw: Callable[[int], int] = secrets.randbelow) -> ReplayPlan | str:
    """The untimed replay of a job verified on its final step only (module doc); `argv` is the job's own, rendered
    for the replay's folder. A str says why there is none (claims/verify_train.py flags the verdict with it)."""
    out = list(argv)
    flags = flag_values(out)
    steps = int(expected.get("num_steps", 0))
    if "resume" in flags:
        return "not replayed: a run that resumes another's checkpoint would replay from a state the judge did not see made"
    if not expected.get("deterministic", False):
        return "not replayed: the job runs without --deterministic, so a replay need not print the same numbers"
    if steps < 4:
        return f"not replayed: {steps} step(s) leave no secret step between the second and the last two"
    size = checkpoint_bytes(expected)
    if not size or size * (_REPLAY_KEEP + 1) > free_bytes:
        return (f"not replayed: {_REPLAY_KEEP + 1} checkpoints of {size / 2**30:.1f} GiB do not fit in the "
                f"{free_bytes / 2**30:.1f} GiB free beside the job" if size else
                "not replayed: the judge cannot size the job's checkpoints from its config")
    if "save-dir" not in flags:
        out += ["--save-dir", str(Path(job_dir) / "checkpoints")]
    step = 2 + draw(steps - 3)
    # checkpoints k - 1, k, k + 1 only (module doc); every step from a base engine without --save-at
    saves = ["--save-at", f"{step - 1},{step},{step + 1}"] if "save_at" in base_defaults else ["--save-every", "1"]
    out += [*saves, "--keep-last", str(_REPLAY_KEEP)]
    if "async_save" in expected:  # a background save could still be in flight when the replay is stopped
        out.append("--no-async-save")
    return ReplayPlan(argv=out, save_dir=Path(str(flag_values(out)["save-dir"])), num_steps=steps, step=step,
                      stop_at=step + 2, saves=" ".join(saves))
