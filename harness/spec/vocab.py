"""The spec's vocabulary: the judge's globs, gate kinds, metrics, comparison ops, path checks and argv placeholders.

Shared by the gate models (gates.py), the milestone model (milestone.py) and the loader (load.py); nothing here
imports the judge.
"""

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from harness.globs import glob_match  # the one matcher; re-exported by harness.spec

__all__ = ["SpecError", "JUDGE_GLOBS", "TEST_GLOB", "NEW_TEST_GLOB", "GATE_KINDS", "GUARD_RULES", "OP_TASKS", "SHAPE_KEYS",
           "OPS", "MetricInfo", "METRICS", "STATE_METRICS", "JUDGED_PAIR_METRICS", "PRINTED_DIFFS", "compare", "glob_match", "referenced_jobs",
           "render_argv", "Strict", "RelPath", "Glob", "Selector", "check_relpath", "literal_prefix", "placeholders",
           "NAME_PATTERN", "FIXED_PLACEHOLDERS", "TASK_COMMAND"]


class SpecError(ValueError):
    """A milestone file is missing, does not parse, or breaks a rule. One line: file, field path, problem."""

    def __init__(self, source: str | Path, problems: list[tuple[str, str]]):
        self.source = str(source)
        self.problems = problems
        first_path, first_msg = problems[0]
        where = f"{self.source}: {first_path}: " if first_path else f"{self.source}: "
        more = f" (+{len(problems) - 1} more: " + "; ".join(f"{p}: {m}" for p, m in problems[1:]) + ")" if len(problems) > 1 else ""
        super().__init__(f"{where}{first_msg}{more}")


# ---------------------------------------------------------------- vocabulary

# The judge and everything that decides how it runs: an agent that could edit any of these could
# relax its own gates. Beyond the obvious folders: pytest configuration and conftest.py files change
# what is collected, ENV_WHITELIST.md feeds the ssot guard, .ci/ is the CI the team trusts.
JUDGE_GLOBS: tuple[str, ...] = (
    "harness/**",
    "guards/**",
    "guards.toml",
    "milestones/**",
    "prompts/**",
    "ENV_WHITELIST.md",
    "pyproject.toml",
    "setup.cfg",
    "pytest.ini",
    "tox.ini",
    "**/conftest.py",
    "sitecustomize.py",
    "usercustomize.py",
    ".ci/**",
)
TEST_GLOB = "tests/**"
# An agent may add new test files for its own change (never conftest.py, plugins or edits to existing
# tests): they run in a pytest process of their own and never count toward a gate's min_collected.
NEW_TEST_GLOB = "tests/**/test_*.py"

GATE_KINDS = ("protected", "guards", "pytest", "job", "metrics")
# Rule names of `temper guards check` (guards/): the engine's red lines.
GUARD_RULES = ("ssot", "dag", "public-surface", "fail-fast", "isolation", "exec-route", "recognition")
# Engine subcommand each engine job task runs (`python -m engine <argv[0]> ...`). The op tasks (bench,
# stress) run the judge's own harness/opbench.py instead, configured by the gate's `bench` table.
TASK_COMMAND = {"train": "pretrain", "prepare": "prepare"}
OP_TASKS = ("bench", "stress")
# The dimensions a milestone names for its timed shape (a bench gate's `shape` table), per op.
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("batch", "seq", "heads_q", "heads_kv", "head_dim"),
    "rmsnorm": ("tokens", "hidden"),
    "gemm_fc1": ("tokens", "hidden", "ffn"),
    "gemm_output": ("tokens", "hidden", "vocab_local", "vocab_size"),
    "rope": ("batch", "seq", "heads_q", "heads_kv", "head_dim"),
}

OPS: dict[str, str] = {"<": "less than", "<=": "at most", ">": "more than", ">=": "at least", "==": "exactly"}


@dataclass(frozen=True)
class MetricInfo:
    """One metric the judge can compute from a job's parsed results."""

    description: str
    tasks: tuple[str, ...]  # job tasks that produce it
    needs_ref: bool = False  # compares against a reference trajectory (a file or an earlier job)
    unit: str = ""


# The closed vocabulary. The judge computes every value itself from the job's [LOSS] lines / JSONL
# twin and the model config; it never trusts a number the engine claims (MFU least of all).
METRICS: dict[str, MetricInfo] = {
    "final_loss": MetricInfo("global_loss of the last logged step in the window", ("train",)),
    "min_loss": MetricInfo("lowest global_loss in the window", ("train",)),
    "steps": MetricInfo("number of steps logged in the window", ("train",), unit="steps"),
    "mfu": MetricInfo(
        "median model FLOPs utilisation over the window, recomputed by the harness from step times and the "
        "model config (Megatron count: 6 x matmul params incl. LM head + causal attention; peak 989 TFLOP/s)",
        ("train",),
    ),
    "tokens_per_s": MetricInfo("median global tokens / time_s over the window", ("train",), unit="tokens/s"),
    "step_time_s": MetricInfo("median time_s per step over the window", ("train",), unit="s"),
    "loss_rel_diff": MetricInfo(
        "max over common steps of |loss - ref| / |ref|", ("train",), needs_ref=True
    ),
    "loss_max_abs_diff": MetricInfo(
        "max over common steps of |loss - ref| (0.0 means bitwise equal at .9e)", ("train",), needs_ref=True
    ),
    "loss_mean_rel_diff": MetricInfo(
        "mean over common steps of |loss - ref| / |ref| (the ForgeTrain long-horizon criterion)", ("train",), needs_ref=True
    ),
    "grad_norm_rel_diff": MetricInfo(
        "max over common steps of |grad_norm - ref| / |ref|", ("train",), needs_ref=True
    ),
    "state_bitwise_diff": MetricInfo(
        "elements that differ in their bits between the job's checkpoints and the reference job's, over every saved "
        "tensor (fp32 masters, Adam moments) and value (step, Adam step, data position) at every step both kept, the "
        "last printed step included; read by the judge (harness/judge/claims/bitwise.py); 0 means bit for bit",
        ("train",), needs_ref=True, unit="elements"),
    "state_rel_diff": MetricInfo(
        "max over the steps both jobs kept and over every parameter's fp32 master and Adam moments, reassembled whole "
        "from each layout's TP / DP shards by the judge, of the relative L2 difference ||a - b|| / ||b||; step, Adam "
        "step and data position must be equal (harness/judge/claims/bitwise.py)", ("train",), needs_ref=True),
    "val_loss": MetricInfo("validation loss of the final evaluation", ("train",)),
    "val_loss_rel_diff": MetricInfo(
        "(val_loss - ref) / ref, signed: the judge's own validation loss of the job's final weights against the "
        "reference job's (ref_job, an earlier verified train job of the same judging), both on the windows the judge "
        "drew for this judging (harness/judge/claims/evidence.py); the windows must be the same text for both",
        ("train",), needs_ref=True),
    "val_bpb": MetricInfo("validation bits per byte of the final evaluation", ("train",), unit="bits/byte"),
    "speedup": MetricInfo("bench: the base commit's baseline time per call / the candidate version's, medians over "
                          "the rounds, by the judge's clock (harness/judge/opjudge.py)", ("bench",), unit="x"),
}


# Metrics read from two jobs' checkpoints, and the printed-number comparisons that must never stand alone: a
# claim that two runs agree is held against every tensor they saved, not only against what they printed.
STATE_METRICS = ("state_bitwise_diff", "state_rel_diff")
# Metrics the judge measures on two jobs' final weights (their verification's evidence), not on printed numbers.
JUDGED_PAIR_METRICS = ("val_loss_rel_diff",)
PRINTED_DIFFS = ("loss_rel_diff", "loss_max_abs_diff", "loss_mean_rel_diff", "grad_norm_rel_diff")


def compare(op: str, actual: float, value: float) -> bool:
    """`actual <op> value`. NaN never passes: a diverged run must not satisfy `loss <= 5`."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {list(OPS)}")
    if math.isnan(actual) or math.isnan(value):
        return False
    return {
        "<": actual < value,
        "<=": actual <= value,
        ">": actual > value,
        ">=": actual >= value,
        "==": actual == value,
    }[op]


# ---------------------------------------------------------------- globs and paths


def check_relpath(value: str, what: str = "path") -> str:
    if not value:
        raise ValueError(f"empty {what}")
    if "\\" in value:
        raise ValueError(f"{what} {value!r} uses '\\'; write repository paths with '/'")
    pure = PurePosixPath(value)
    if pure.is_absolute() or value.startswith("~"):
        raise ValueError(f"{what} {value!r} must be relative to the repository root")
    if ".." in pure.parts:
        raise ValueError(f"{what} {value!r} must not leave the repository ('..')")
    return value


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: 'engine/ops/**' -> 'engine/ops/'."""
    match = re.search(r"[*?\[]", pattern)
    return pattern if match is None else pattern[: match.start()]


def _check_glob(value: str) -> str:
    return check_relpath(value, "glob")


def _check_selector(value: str) -> str:
    check_relpath(value.split("::", 1)[0], "selector")
    return value


# Item-level validation keeps the index in error paths: `editable[1]`, not `editable`.
RelPath = Annotated[str, AfterValidator(check_relpath)]
Glob = Annotated[str, AfterValidator(_check_glob)]
Selector = Annotated[str, AfterValidator(_check_selector)]

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
NAME_PATTERN = r"[a-z0-9][a-z0-9_-]*"
FIXED_PLACEHOLDERS = ("job_dir", "worktree", "seed", "device", "data")


def placeholders(arg: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(arg) if m.group(1) is not None]


def referenced_jobs(argv: list[str]) -> set[str]:
    """The earlier jobs whose folders an argv names ({job_dir:NAME})."""
    return {name[len("job_dir:"):] for arg in argv for name in placeholders(arg) if name.startswith("job_dir:")}


def render_argv(argv: list[str], *, job_dir: str | Path, worktree: str | Path, job_dirs: Mapping[str, str | Path],
                seed: int = 0, device: str = "cpu", data: str | Path = "",
                drawn: Mapping[str, str] | None = None) -> list[str]:
    """Fill a job's argv placeholders: {job_dir}, {worktree}, {job_dir:NAME} (an earlier job's folder),
    {seed} (drawn by the judge for each judging, so acceptance inputs cannot be special-cased) and
    {device} ("cuda" or "cpu": what the judge runs the milestone on) and {data} (the shared data folder:
    TEMPER_DATA, else ../shared/data beside the judge's home; see harness.settings.data_dir), and the
    milestone's other drawn values (`drawn`: {name} and {name.key} of its [draw] table, {corpus}; see
    harness/judge/draws.py).

    `{{` and `}}` are literal braces. The spec loader has already checked every name.
    """
    def fill(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        fixed = {"job_dir": job_dir, "worktree": worktree, "seed": seed, "device": device, "data": data, **(drawn or {})}
        if name in fixed:
            return str(fixed[name])
        if name.startswith("job_dir:") and name[len("job_dir:"):] in job_dirs:
            return str(job_dirs[name[len("job_dir:"):]])
        raise KeyError(f"unknown placeholder {token} (known: {', '.join('{' + k + '}' for k in FIXED_PLACEHOLDERS)}, "
                       f"{{job_dir:NAME}} for {sorted(job_dirs)})")

    return [_PLACEHOLDER.sub(fill, arg) for arg in argv]



class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

