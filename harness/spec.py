"""Milestone specs: one TOML file per milestone, validated by pydantic, loaded into a frozen `Milestone`.

A milestone says what the agent must achieve (goal, context), what it may touch (editable globs),
what it may never touch (the judge, tests, the spec itself), what runs before it starts (a setup
patch), how an attempt is judged (ordered gates) and what it may spend (budget). The gate runner
walks `Milestone.gates` in order and stops at the first failure.

Errors name the file and the field path in one line, e.g.
`milestones/x.toml: gates[2].rules[0].op: Input should be '<', '<=', '>', '>=' or '==' (got '=>')`.

Paths in a spec are relative to the repository root (the worktree), use `/`, and never leave it.
Globs: `**` matches any number of path segments (also none), `*` and `?` stay inside one segment.
Protection wins over editability: a file matching both is protected. The one exception is tests:
`tests/**` is protected unless an `editable` glob that starts with `tests/` names the file.
"""

import hashlib
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from harness.globs import glob_match  # the one matcher; re-exported here (harness.spec.glob_match)

__all__ = [
    "SpecError",
    "Milestone",
    "ContextFile",
    "Budget",
    "ProtectedGate",
    "GuardsGate",
    "PytestGate",
    "JobGate",
    "DrawVar",
    "DRAW_KINDS",
    "OpBench",
    "OP_TASKS",
    "SHAPE_KEYS",
    "MetricsGate",
    "MetricRule",
    "Gate",
    "MetricInfo",
    "METRICS",
    "STATE_METRICS",
    "PRINTED_DIFFS",
    "OPS",
    "GATE_KINDS",
    "GUARD_RULES",
    "JUDGE_GLOBS",
    "TEST_GLOB",
    "NEW_TEST_GLOB",
    "Requires",
    "compare",
    "glob_match",
    "render_argv",
    "referenced_jobs",
    "load_milestone",
    "load_milestones",
    "find_milestone",
]


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
_TASK_COMMAND = {"train": "pretrain", "prepare": "prepare"}
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
        "last printed step included; read by the judge (harness/judge/bitwise.py); 0 means bit for bit",
        ("train",), needs_ref=True, unit="elements"),
    "state_rel_diff": MetricInfo(
        "max over the steps both jobs kept and over every parameter's fp32 master and Adam moments, reassembled whole "
        "from each layout's TP / DP shards by the judge, of the relative L2 difference ||a - b|| / ||b||; step, Adam "
        "step and data position must be equal (harness/judge/bitwise.py)", ("train",), needs_ref=True),
    "val_loss": MetricInfo("validation loss of the final evaluation", ("train",)),
    "val_bpb": MetricInfo("validation bits per byte of the final evaluation", ("train",), unit="bits/byte"),
    "speedup": MetricInfo("bench: the base commit's baseline time per call / the candidate version's, medians over "
                          "the rounds, by the judge's clock (harness/judge/opjudge.py)", ("bench",), unit="x"),
}


# Metrics read from two jobs' checkpoints, and the printed-number comparisons that must never stand alone: a
# claim that two runs agree is held against every tensor they saved, not only against what they printed.
STATE_METRICS = ("state_bitwise_diff", "state_rel_diff")
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


def _check_relpath(value: str, what: str = "path") -> str:
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


def _literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: 'engine/ops/**' -> 'engine/ops/'."""
    match = re.search(r"[*?\[]", pattern)
    return pattern if match is None else pattern[: match.start()]


def _check_glob(value: str) -> str:
    return _check_relpath(value, "glob")


def _check_selector(value: str) -> str:
    _check_relpath(value.split("::", 1)[0], "selector")
    return value


# Item-level validation keeps the index in error paths: `editable[1]`, not `editable`.
_RelPath = Annotated[str, AfterValidator(_check_relpath)]
_Glob = Annotated[str, AfterValidator(_check_glob)]
_Selector = Annotated[str, AfterValidator(_check_selector)]

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_NAME = r"[a-z0-9][a-z0-9_-]*"
_FIXED_PLACEHOLDERS = ("job_dir", "worktree", "seed", "device", "data")


def _placeholders(arg: str) -> list[str]:
    return [m.group(1) for m in _PLACEHOLDER.finditer(arg) if m.group(1) is not None]


def referenced_jobs(argv: list[str]) -> set[str]:
    """The earlier jobs whose folders an argv names ({job_dir:NAME})."""
    return {name[len("job_dir:"):] for arg in argv for name in _placeholders(arg) if name.startswith("job_dir:")}


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
        raise KeyError(f"unknown placeholder {token} (known: {', '.join('{' + k + '}' for k in _FIXED_PLACEHOLDERS)}, "
                       f"{{job_dir:NAME}} for {sorted(job_dirs)})")

    return [_PLACEHOLDER.sub(fill, arg) for arg in argv]


# ---------------------------------------------------------------- models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class ContextFile(_Strict):
    """A file the prompt shows (`include = true`: an excerpt inlined) or only points to."""

    path: str
    include: bool = False
    lines: tuple[int, int] | None = None  # 1-based, inclusive; None: the whole file (up to the prompt's cap)
    why: str = ""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _check_relpath(value)

    @field_validator("lines")
    @classmethod
    def _lines(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1]:
            raise ValueError(f"lines {list(value)} must be [first, last] with 1 <= first <= last")
        return value


class Budget(_Strict):
    """Limits checked before every model call; the first one spent ends the run as budget_exhausted."""

    max_turns: int = Field(gt=0)
    max_tokens: int = Field(gt=0)  # input + output tokens over the whole run
    max_cost_usd: float | None = Field(default=None, gt=0)  # None: no cost limit (unknown prices stay allowed)
    max_wall_s: float = Field(gt=0)
    max_attempts: int = Field(gt=0)


class _GateBase(_Strict):
    name: str = ""  # filled by the loader: the kind for the first gate of a kind, else "<kind>-<n>"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not re.fullmatch(_NAME, value):
            raise ValueError(f"name {value!r} must match {_NAME} (lower case, digits, '-', '_')")
        return value


class ProtectedGate(_GateBase):
    """Judge integrity, before any candidate code runs: the diff policy (every touched path editable, or a
    new test file; no binaries, no symlinks) and no protected file changed in the agent's worktree."""

    kind: Literal["protected"]


class GuardsGate(_GateBase):
    """`temper guards check` over `paths` with the named rules (all by default)."""

    kind: Literal["guards"]
    paths: list[_RelPath] = Field(default_factory=lambda: ["engine"], min_length=1)
    rules: list[Literal["ssot", "dag", "public-surface", "fail-fast", "isolation", "exec-route", "recognition"]] = Field(
        default_factory=lambda: list(GUARD_RULES), min_length=1
    )


class PytestGate(_GateBase):
    """pytest on `selectors`; fails when fewer than `min_collected` tests are collected (a deleted test
    file or a skip-everything conftest must not pass)."""

    kind: Literal["pytest"]
    selectors: list[_Selector] = Field(min_length=1)
    min_collected: int = Field(gt=0)
    args: list[str] = Field(default_factory=list)  # only selections: "-k EXPR", "-m EXPR"
    timeout_s: float = Field(default=600, gt=0)

    @field_validator("args")
    @classmethod
    def _only_selections(cls, value: list[str]) -> list[str]:
        """The judge owns how pytest runs, stops and reports (its ini, plugins, canaries that must all run): an
        option like `-x`, `--maxfail`, `-p` or `--deselect` would stop or hide the canaries and make every
        verdict "untrusted", or change what a pass means. A gate's arguments may only select tests."""
        rest = iter(enumerate(value))
        for i, arg in rest:
            if arg in ("-k", "-m"):
                if next(rest, None) is None:
                    raise ValueError(f"args[{i}]: {arg} needs an expression after it")
            elif not arg.startswith(("-k=", "-m=")):
                raise ValueError(f"args[{i}]: {arg!r} is not a selection; a pytest gate's args may only be "
                                 "\"-k EXPR\" and \"-m EXPR\" (the judge sets how pytest runs and reports)")
        return value


class OpBench(_Strict):
    """What a bench or stress job measures (harness/opbench.py, judged by harness/judge/opjudge.py).

    The judge runs the op `version` (a name in engine/ops/<op>/register.toml; "default": its CUDA default,
    baseline on CPU) of the judged checkout against the base commit's `baseline`, `rounds` times each,
    alternately. Correctness: `cases` shapes drawn from the judging's seed (`case_scale` shrinks them for
    a CPU-sized programme). Timing: `segments` x `reps` calls at `shape`, each after the judge's GPU spin of
    `pace_ms` of wall time: it must exceed the host's launch time per call (the bench's ~1.3 ms plus the
    version's) minus the GPU's, so that the per-call CUDA events time the GPU's work, not the host's (unpaced
    and by the wall clock, an op of 0.17 ms on the GPU was timed at 2 ms on an H200 machine); the overhead
    segments spin alike, so the judge's wall-clock bound cancels it. Stress: `seconds` under load.
    """

    op: Literal["attention", "rmsnorm", "gemm_fc1", "gemm_output", "rope"]
    version: str = Field(default="default", min_length=1)
    shape: dict[str, int]
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    cases: int = Field(default=6, ge=1, le=64)
    case_scale: float = Field(default=1.0, gt=0, le=1)
    reps: int = Field(default=30, ge=1)
    segments: int = Field(default=2, ge=1)
    rounds: int = Field(default=2, ge=1, le=8)
    seconds: float = Field(default=20.0, ge=0)
    pace_ms: float = Field(default=4.0, ge=0, le=100)

    @field_validator("shape")
    @classmethod
    def _shape(cls, value: dict[str, int]) -> dict[str, int]:
        for key, n in value.items():
            if n <= 0:
                raise ValueError(f"shape.{key} = {n}: dimensions are positive")
        return value


class JobGate(_GateBase):
    """Runs the engine (`python -m engine <argv>`, or torchrun / srun for several processes).

    The log (stdout + stderr of all ranks) goes to `runs/<run>/jobs/<name>/log`; train jobs pass
    `--run-dir {job_dir}` so the engine's metrics.jsonl lands beside it. `task` is what the job does
    (the key `kind` is taken: it says this gate is a job).
    """

    kind: Literal["job"]
    name: str = Field(min_length=1)
    task: Literal["train", "prepare", "stress", "bench"]
    launcher: Literal["local", "slurm"] = "local"
    nodes: int = Field(default=1, gt=0)
    # Processes per node; or a drawn value, "{layout.nproc}" (CPU jobs: the layouts a judging draws, up to 8 processes)
    nproc: int | str = Field(default=1)
    gpus: int = Field(default=0, ge=0)  # GPUs per node; 0: CPU job
    partition: str = ""  # slurm only; empty: the cluster's default
    timeout_s: float = Field(gt=0)
    argv: list[str] = Field(default_factory=list)  # engine tasks: the subcommand and its flags
    bench: OpBench | None = None  # bench / stress tasks: what the judge's op bench measures
    env: dict[str, str] = Field(default_factory=dict)  # e.g. {TEMPER_OP_ATTENTION = "fa4"}
    expect_exit: int = 0
    # Interrupt the job when it prints `[LOSS] step=<kill_at_step>`: the judge sends kill_signal to its
    # whole process group (SIGTERM: the engine checkpoints at the step boundary and exits 0; SIGKILL:
    # nothing is saved after the last --save-every checkpoint). expect_exit says how it must end.
    kill_at_step: int | None = Field(default=None, gt=0)
    kill_signal: Literal["SIGTERM", "SIGKILL"] = "SIGTERM"
    # Judge-verified claims (train jobs): the judge makes the engine save the final weights (and the
    # step before), recomputes their loss with its own reference forward pass on held-out batches and
    # checks the applied learning rate against the printed one. Off only where no final weights exist
    # (a job the judge kills on purpose).
    verify: bool = True
    # The milestone's learning-rate contract, a formula of s, lr, W, N, ... (harness/formula.py): every printed lr
    # and the lr the judge fits from every pair of checkpoints it holds must follow it (harness/judge/contract.py).
    # Empty: they follow the schedule the base engine defines for the job's config. Never off: a milestone whose
    # point is a new schedule states it here.
    lr_contract: str = ""
    log: str = "log"
    metrics_file: str = "metrics.jsonl"  # relative to the job's folder

    @model_validator(mode="before")
    @classmethod
    def _no_schedule_switch(cls, data: Any) -> Any:
        if isinstance(data, dict) and "verify_schedule" in data:
            raise ValueError("verify_schedule is gone: no gate turns the schedule check off; a milestone whose point is "
                             "a new schedule states it as lr_contract = \"lr * min(s / W, sqrt(W / s))\" (harness/formula.py)")
        return data

    @field_validator("nproc")
    @classmethod
    def _nproc(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value <= 0:
            raise ValueError(f"nproc {value} must be positive")
        if isinstance(value, str) and not re.fullmatch(r"\{[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?\}", value):
            raise ValueError(f"nproc {value!r}: a number, or one drawn value such as \"{{layout.nproc}}\"")
        return value

    @field_validator("lr_contract")
    @classmethod
    def _lr_contract(cls, value: str) -> str:
        if value:
            from harness.formula import Formula, FormulaError

            try:
                Formula(value)
            except FormulaError as err:
                raise ValueError(f"lr_contract: {err}") from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"TEMPER_[A-Z0-9_]+", key):
                raise ValueError(f"env {key!r}: jobs may set only TEMPER_* variables (see ENV_WHITELIST.md)")
        return value

    @field_validator("log", "metrics_file")
    @classmethod
    def _file(cls, value: str) -> str:
        return _check_relpath(value, "file")


# What a [draw] entry may say besides a DrawVar table: how a seed is drawn, and the judge-cut training corpus.
# "small": 0..100, the seeds people type; "large": 2**32 .. 2**63 - 1; "any": either, at even odds.
# "epoch-crossing" (the entry `corpus` only): {corpus} is a prepared dataset the judge cuts from the base's
# bundled corpus for each job, so small that the job's run crosses an epoch boundary (harness/judge/draws.py).
DRAW_KINDS = ("small", "large", "any", "epoch-crossing")
_DRAW_NAME = r"[a-z][a-z0-9_]*"


class DrawVar(_Strict):
    """One value a judging draws from its secret (harness/judge/draws.py): an integer from `range` [lo, hi]
    (inclusive; a `multiple` of k when given), or one of `choices`: numbers, or tables of numbers that a job reads
    as {name.key} (a layout: {nproc = 4, tp = 2, gas = 3}). Job argv reads it as {name}."""

    range: tuple[int, int] | None = None
    multiple: int = Field(default=1, gt=0)
    choices: list[int | float | dict[str, int | float]] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> "DrawVar":
        if (self.range is None) == (self.choices is None):
            raise ValueError("give exactly one of range = [lo, hi] or choices = [...]")
        if self.range is not None:
            lo, hi = self.range
            if lo > hi or not any(v % self.multiple == 0 for v in range(lo, min(hi, lo + self.multiple) + 1)):
                raise ValueError(f"range {list(self.range)} holds no multiple of {self.multiple}")
        if self.choices is not None:
            tables = [c for c in self.choices if isinstance(c, dict)]
            if tables and (len(tables) != len(self.choices) or any(set(t) != set(tables[0]) for t in tables)):
                raise ValueError("choices are all numbers or all tables with the same keys")
            for key in (tables[0] if tables else {}):
                if not re.fullmatch(_DRAW_NAME, key):
                    raise ValueError(f"choice key {key!r} must match {_DRAW_NAME}")
        return self

    def keys(self) -> tuple[str, ...]:
        """The {name.key} parts a table choice offers (() for numbers)."""
        return tuple(self.choices[0]) if self.choices and isinstance(self.choices[0], dict) else ()

    def values_of(self, key: str = "") -> list[int | float]:
        """Every value the entry (or its `key`) can take: for the spec's own checks (nproc of a drawn layout)."""
        if self.range is not None:
            lo, hi = self.range
            return [v for v in range(lo, hi + 1) if v % self.multiple == 0]
        assert self.choices is not None
        return [c[key] if isinstance(c, dict) else c for c in self.choices]


class MetricRule(_Strict):
    """`<metric of job> <op> <value>`, optionally against a reference (a protected file or an earlier job)
    and over a window of steps (from_step / to_step, inclusive)."""

    job: str = ""  # empty: the only job gate before this metrics gate
    metric: str
    op: str
    value: float
    ref: str | None = None  # JSONL reference trajectory, repo-relative; must be a protected path
    ref_job: str | None = None  # an earlier job of this milestone
    from_step: int | None = Field(default=None, ge=0)
    to_step: int | None = Field(default=None, ge=0)

    @field_validator("metric")
    @classmethod
    def _metric(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; expected one of: {', '.join(METRICS)}")
        return value

    @field_validator("op")
    @classmethod
    def _op(cls, value: str) -> str:
        if value not in OPS:
            raise ValueError(f"unknown op {value!r}; expected one of: {' '.join(OPS)}")
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"value {value!r} must be a finite number")
        return value

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        return None if value is None else _check_relpath(value, "ref")

    def describe(self) -> str:
        """Human form for prompts and reports: 'mfu of train >= 0.55 (steps 5..)'."""
        against = f" vs {self.ref}" if self.ref else f" vs job {self.ref_job}" if self.ref_job else ""
        window = ""
        if self.from_step is not None or self.to_step is not None:
            window = f" (steps {'' if self.from_step is None else self.from_step}..{'' if self.to_step is None else self.to_step})"
        return f"{self.metric} of {self.job or 'the job'}{against} {self.op} {self.value:g}{window}"


class MetricsGate(_GateBase):
    kind: Literal["metrics"]
    rules: list[MetricRule] = Field(min_length=1)


Gate = Annotated[Union[ProtectedGate, GuardsGate, PytestGate, JobGate, MetricsGate], Field(discriminator="kind")]


class Requires(_Strict):
    """The hardware a milestone's jobs need. The judge checks what it actually runs on (it asks the
    machine itself, never the candidate) and, where it falls short, says "needs ..." instead of judging.

    device: "cpu" (jobs run on CPU), "cuda" (GPUs required) or "any" (GPUs when present, else CPU:
    the `{device}` placeholder says which). gpus: GPUs per node the jobs use; gpu_types: accepted GPU
    models, matched as substrings of the device name (e.g. ["H100", "H200"]); slurm: jobs go to SLURM.
    """

    device: Literal["cpu", "cuda", "any"] = "cpu"
    gpus: int = Field(default=0, ge=0)
    gpu_types: list[str] = Field(default_factory=list)
    slurm: bool = False

    def describe(self) -> str:
        if self.device == "cpu":
            what = "CPU"
        else:
            kinds = "/".join(self.gpu_types) or "CUDA"
            what = f"{max(self.gpus, 1)} x {kinds} GPU" + ("s" if self.gpus > 1 else "")
            if self.device == "any":
                what += " (or CPU)"
        return what + (" under SLURM" if self.slurm else "")


class Milestone(_Strict):
    id: str
    title: str = Field(min_length=1)
    goal: str = Field(min_length=1)  # markdown
    context: list[ContextFile] = Field(default_factory=list)
    editable: list[_Glob] = Field(min_length=1)
    protected: list[_Glob] = Field(default_factory=list)  # in addition to JUDGE_GLOBS and tests/**
    setup: str | None = None  # a patch (git apply) committed before the agent starts
    # A folder under milestones/ whose files (held-out acceptance tests, reference data) are copied over
    # the judged checkout for judging only: never in the agent's worktree. They are protected like tests.
    hidden: str | None = None
    binary: list[_Glob] = Field(default_factory=list)  # editable paths where binary content is allowed
    requires: Requires = Field(default_factory=Requires)
    # What each judging draws from its secret (harness/judge/draws.py): {name: DrawVar table, or a DRAW_KINDS word}.
    # `seed` is drawn ("any") when not named. Job argv reads the values as {name} / {name.key}, hidden tests
    # from the file TEMPER_JUDGE_DRAW names.
    draw: dict[str, DrawVar | Literal["small", "large", "any", "epoch-crossing"]] = Field(default_factory=dict)
    gates: list[Gate] = Field(min_length=1)
    budget: Budget

    _source: Path | None = PrivateAttr(default=None)
    _spec_hash: str = PrivateAttr(default="")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", value):
            raise ValueError(f"id {value!r} must be lower case letters, digits, '-' and '_' (op names: op-gemm_fc1)")
        return value

    @field_validator("context", mode="before")
    @classmethod
    def _context(cls, value: Any) -> Any:
        # A bare string is a pointer: `context = ["engine/config.py", {path = "...", include = true}]`.
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: str | None) -> str | None:
        return None if value is None else _check_relpath(value, "setup")

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _check_relpath(value, "hidden")
        if not value.startswith("milestones/"):
            raise ValueError(f"hidden {value!r} must be a folder under milestones/ (part of the judge, never editable)")
        return value.rstrip("/")

    # -- derived, set by load_milestone
    @property
    def source(self) -> Path | None:
        """The TOML file this milestone was loaded from."""
        return self._source

    @property
    def spec_hash(self) -> str:
        """sha256 of the TOML bytes, the setup patch and the hidden material: what a run was judged against."""
        return self._spec_hash

    # -- protection
    @property
    def editable_test_globs(self) -> tuple[str, ...]:
        return tuple(g for g in self.editable if g.startswith("tests/"))

    @property
    def protected_globs(self) -> tuple[str, ...]:
        """Every glob the protected gate hashes: judge, tests, and the milestone's own list."""
        return JUDGE_GLOBS + (TEST_GLOB,) + tuple(self.protected)

    def is_protected(self, path: str) -> bool:
        if any(glob_match(g, path) for g in JUDGE_GLOBS + tuple(self.protected)):
            return True
        if glob_match(TEST_GLOB, path):
            return not any(glob_match(g, path) for g in self.editable_test_globs)
        return False

    def is_editable(self, path: str) -> bool:
        return not self.is_protected(path) and any(glob_match(g, path) for g in self.editable)

    def allows_new_test(self, path: str) -> bool:
        """A new file an agent may add beside its change: `tests/**/test_*.py`, never a conftest or plugin."""
        return glob_match(NEW_TEST_GLOB, path) and not glob_match("**/conftest.py", path)

    def allows_binary(self, path: str) -> bool:
        return any(glob_match(g, path) for g in self.binary)

    # -- gates
    def job_gates(self) -> list[JobGate]:
        return [g for g in self.gates if isinstance(g, JobGate)]

    def gate(self, name: str) -> Gate:
        for gate in self.gates:
            if gate.name == name:
                return gate
        raise KeyError(f"milestone {self.id} has no gate {name!r}; gates: {[g.name for g in self.gates]}")

    def missing_files(self, root: str | Path) -> list[str]:
        """Repo-relative files the spec names that do not exist under `root` (context, refs, setup)."""
        root = Path(root)
        named = [c.path for c in self.context]
        named += [r.ref for g in self.gates if isinstance(g, MetricsGate) for r in g.rules if r.ref]
        named += [self.setup] if self.setup else []
        named += [self.hidden] if self.hidden else []
        return [p for p in named if not (root / p).exists()]


# ---------------------------------------------------------------- loading


def _loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        # Pydantic inserts the discriminator value after a gate's index: gates.2.metrics.rules -> drop it.
        if (i >= 2 and loc[i - 2] == "gates" and isinstance(loc[i - 1], int) and item in GATE_KINDS):
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _pydantic_problems(err: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        path = _loc(tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path = f"{path}.kind"
            msg = f"must be one of: {', '.join(GATE_KINDS)}" + (
                f" (got {e['input'].get('kind')!r})" if isinstance(e.get("input"), dict) and "kind" in e["input"] else ""
            )
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (a typo?)"
        elif e["type"] not in ("missing", "value_error") and not isinstance(e.get("input"), (dict, list, type(None))):
            msg = f"{msg} (got {e['input']!r})"
        problems.append((path, msg))
    return problems


def _fill_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Name unnamed gates and give each metric rule its job, so later stages never guess."""
    seen: dict[str, int] = {}
    jobs_so_far: list[str] = []
    gates = []
    for gate in data["gates"]:
        gate = dict(gate)
        kind = gate["kind"]
        seen[kind] = seen.get(kind, 0) + 1
        if not gate.get("name"):
            gate["name"] = kind if seen[kind] == 1 else f"{kind}-{seen[kind]}"
        if kind == "job":
            jobs_so_far.append(gate["name"])
        if kind == "metrics" and len(jobs_so_far) == 1:
            gate["rules"] = [r if r.get("job") else {**r, "job": jobs_so_far[0]} for r in gate["rules"]]
        gates.append(gate)
    return {**data, "gates": gates}


def _cross_checks(m: Milestone) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if not isinstance(m.gates[0], ProtectedGate):
        problems.append(("gates[0].kind", "the first gate must be kind = \"protected\" (judge integrity runs before anything else)"))
    names: dict[str, int] = {}
    jobs: dict[str, JobGate] = {}
    for i, gate in enumerate(m.gates):
        where = f"gates[{i}]"
        if gate.name in names:
            problems.append((f"{where}.name", f"duplicate gate name {gate.name!r} (also gates[{names[gate.name]}])"))
        names[gate.name] = i
        if isinstance(gate, ProtectedGate) and i > 0:
            problems.append((f"{where}.kind", "only the first gate may be \"protected\""))
        if isinstance(gate, JobGate):
            problems += _job_checks(gate, where, jobs, m.draw)
            problems += _hardware_checks(m.requires, gate, where)
            jobs[gate.name] = gate
        if isinstance(gate, MetricsGate):
            if not jobs:
                problems.append((f"{where}.kind", "a metrics gate needs a job gate before it"))
                continue
            for j, rule in enumerate(gate.rules):
                problems += _rule_checks(m, rule, f"{where}.rules[{j}]", jobs)
    problems += _state_twins(m)
    problems += _draw_checks(m.draw)
    for i, glob in enumerate(m.editable):
        prefix = _literal_prefix(glob)
        if prefix and not prefix.startswith("tests/") and any(
            glob_match(j, prefix) or glob_match(j, prefix.rstrip("/") + "/x") for j in JUDGE_GLOBS
        ):
            problems.append((f"editable[{i}]", f"{glob!r} lies in the judge ({', '.join(JUDGE_GLOBS[:5])}, ...), which is never editable"))
    return problems


def _state_twins(m: Milestone) -> list[tuple[str, str]]:
    """A printed-number comparison of two jobs needs a checkpoint comparison of the same two jobs beside it: bit
    for bit (`state_bitwise_diff == 0`) where the printed claim is exact, else `state_rel_diff` (or bitwise)."""
    rules = [(f"gates[{i}].rules[{j}]", r) for i, g in enumerate(m.gates) if isinstance(g, MetricsGate)
             for j, r in enumerate(g.rules)]
    state = {(r.job, r.ref_job, r.metric) for _, r in rules if r.metric in STATE_METRICS}
    problems = []
    for where, r in rules:
        if r.metric not in PRINTED_DIFFS or r.ref_job is None:
            continue
        exact = r.op in ("==", "<=") and r.value == 0
        wanted = ("state_bitwise_diff",) if exact else STATE_METRICS
        if not any((r.job, r.ref_job, metric) in state for metric in wanted):
            twin = (f'{{ job = "{r.job}", metric = "state_bitwise_diff", op = "==", value = 0, ref_job = "{r.ref_job}" }}'
                    if exact else f'{{ job = "{r.job}", metric = "state_rel_diff", op = "<=", value = ..., ref_job = "{r.ref_job}" }}')
            problems.append((f"{where}.metric", f"{r.metric} of job {r.job} against job {r.ref_job} claims "
                                                f"{'bit-for-bit ' if exact else ''}agreement from printed numbers alone: "
                                                f"add {twin} (the judge compares the two jobs' checkpoints)"))
    return problems


def _hardware_checks(requires: Requires, gate: JobGate, where: str) -> list[tuple[str, str]]:
    """A job may use only the hardware the milestone declares, so `temper milestones` and the judge's
    "needs ..." answer tell the truth."""
    problems = []
    if gate.gpus and requires.device == "cpu":
        problems.append((f"{where}.gpus", f"the job uses {gate.gpus} GPU(s) but requires.device is \"cpu\"; "
                                          "set [requires] device = \"cuda\" (or \"any\") and gpus"))
    elif gate.gpus > max(requires.gpus, 0) and requires.device != "cpu":
        problems.append((f"{where}.gpus", f"the job uses {gate.gpus} GPUs per node, requires.gpus is {requires.gpus}"))
    if gate.launcher == "slurm" and not requires.slurm:
        problems.append((f"{where}.launcher", "a SLURM job needs [requires] slurm = true"))
    if gate.kill_at_step is not None and gate.task != "train":
        problems.append((f"{where}.kill_at_step", "only train jobs print the [LOSS] step lines it waits for"))
    return problems


def _draw_checks(draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = []
    for name, entry in draw.items():
        if not re.fullmatch(_DRAW_NAME, name) or name in _FIXED_PLACEHOLDERS and name != "seed":
            problems.append((f"draw.{name}", f"a drawn name matches {_DRAW_NAME} and is none of {', '.join(_FIXED_PLACEHOLDERS[:2])}, "
                                             f"{', '.join(_FIXED_PLACEHOLDERS[3:])}"))
        elif (entry == "epoch-crossing") != (name == "corpus"):
            problems.append((f"draw.{name}", "corpus = \"epoch-crossing\" is the one corpus entry; seeds are \"small\", "
                                             "\"large\" or \"any\""))
    return problems


def _drawn_names(draw: Mapping[str, Any]) -> set[str]:
    """The placeholders a [draw] table offers: {name}, {name.key} of table choices, {seed} always."""
    names = {"seed"}
    for name, entry in draw.items():
        names.add(name)
        if isinstance(entry, DrawVar):
            names |= {f"{name}.{key}" for key in entry.keys()}
    return names


def _drawn_nproc(gate: JobGate, where: str, draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A drawn nproc names a drawn value whose every choice is a process count the judge can start here."""
    if isinstance(gate.nproc, int):
        return []
    name, _, key = gate.nproc.strip("{}").partition(".")
    entry = draw.get(name)
    if not isinstance(entry, DrawVar) or (key and key not in entry.keys()) or (not key and entry.keys()):
        return [(f"{where}.nproc", f"{gate.nproc} names no drawn number of the [draw] table")]
    if gate.gpus or gate.launcher != "local":
        return [(f"{where}.nproc", "a drawn process count is for local CPU jobs")]
    if not all(isinstance(v, int) and 1 <= v <= 8 for v in entry.values_of(key)):
        return [(f"{where}.nproc", f"{gate.nproc} must draw whole numbers 1..8, not {entry.values_of(key)}")]
    return []


def _job_checks(gate: JobGate, where: str, earlier: dict[str, JobGate], draw: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = _drawn_nproc(gate, where, draw)
    if gate.task in OP_TASKS:
        if gate.bench is None:
            problems.append((f"{where}.bench", f"a {gate.task} job needs a bench table: op, shape (and version, reps, ...)"))
        elif missing := [k for k in _op_shape_keys(gate.bench.op) if k not in gate.bench.shape]:
            problems.append((f"{where}.bench.shape", f"a {gate.bench.op} shape needs {', '.join(missing)}"))
        if gate.argv:
            problems.append((f"{where}.argv", f"a {gate.task} job runs the judge's own op bench (harness/opbench.py): "
                                              "leave argv out and describe the work in its bench table"))
        if gate.nproc != 1 or gate.nodes != 1 or gate.launcher != "local" or gate.gpus > 1:
            problems.append((f"{where}.nproc", f"a {gate.task} job is one local process on at most one GPU"))
        return problems
    if gate.bench is not None:
        problems.append((f"{where}.bench", f"only bench and stress jobs take a bench table (this is a {gate.task} job)"))
    expected = _TASK_COMMAND[gate.task]
    if not gate.argv or gate.argv[0] != expected:
        got = repr(gate.argv[0]) if gate.argv else "nothing"
        problems.append((f"{where}.argv[0]", f"a {gate.task} job runs `engine {expected}`: argv must start with {expected!r} (got {got})"))
    if gate.gpus and gate.nproc != gate.gpus:
        problems.append((f"{where}.nproc", f"one process per GPU: nproc {gate.nproc} != gpus {gate.gpus}"))
    if gate.partition and gate.launcher != "slurm":
        problems.append((f"{where}.partition", "partition applies to launcher = \"slurm\" only"))
    if gate.task == "train":
        try:
            run_dir = gate.argv[gate.argv.index("--run-dir") + 1]
        except (ValueError, IndexError):
            run_dir = ""
        if run_dir != "{job_dir}":
            problems.append((f"{where}.argv", "train jobs must pass \"--run-dir\", \"{job_dir}\" so the metrics land in the job's folder"))
    drawn = _drawn_names(draw)
    for k, arg in enumerate(gate.argv):
        for name in _placeholders(arg):
            if name in _FIXED_PLACEHOLDERS or name in drawn:
                continue
            if name.startswith("job_dir:") and name[len("job_dir:"):] in earlier:
                continue
            problems.append((f"{where}.argv[{k}]", f"unknown placeholder {{{name}}}: use {{job_dir}}, {{worktree}}, {{seed}}, {{device}}, {{data}}, {{job_dir:NAME}} of an earlier job ({', '.join(earlier) or 'none'}) or a name of the [draw] table ({', '.join(sorted(drawn))})"))
    return problems


def _op_shape_keys(op: str) -> tuple[str, ...]:
    return SHAPE_KEYS[op]


def _rule_checks(m: Milestone, rule: MetricRule, where: str, jobs: dict[str, JobGate]) -> list[tuple[str, str]]:
    problems = []
    info = METRICS[rule.metric]
    if not rule.job:
        problems.append((f"{where}.job", f"several jobs run before this gate ({', '.join(jobs)}): name one"))
    elif rule.job not in jobs:
        problems.append((f"{where}.job", f"no job gate named {rule.job!r} before this gate (earlier jobs: {', '.join(jobs)})"))
    elif jobs[rule.job].task not in info.tasks:
        problems.append((f"{where}.metric", f"{rule.metric} comes from {'/'.join(info.tasks)} jobs; job {rule.job!r} is a {jobs[rule.job].task} job"))
    if info.needs_ref and (rule.ref is None) == (rule.ref_job is None):
        problems.append((f"{where}.ref", f"{rule.metric} compares against a reference: give exactly one of ref (a file) or ref_job (an earlier job)"))
    if not info.needs_ref and (rule.ref is not None or rule.ref_job is not None):
        problems.append((f"{where}.ref", f"{rule.metric} takes no reference"))
    if rule.ref_job is not None:
        if rule.ref_job not in jobs:
            problems.append((f"{where}.ref_job", f"no job gate named {rule.ref_job!r} before this gate"))
        elif rule.ref_job == rule.job:
            problems.append((f"{where}.ref_job", "a job cannot be its own reference"))
    if rule.metric in STATE_METRICS:
        if rule.ref is not None:
            problems.append((f"{where}.ref", f"{rule.metric} compares two jobs' checkpoints: give ref_job, not a file"))
        for name in (rule.job, rule.ref_job):
            if name in jobs and not jobs[name].verify:
                problems.append((f"{where}.job", f"{rule.metric} reads job {name!r}'s checkpoints, which the judge makes "
                                                 f"a job save only when it verifies it: job {name!r} has verify = false"))
    if rule.ref is not None and not m.is_protected(rule.ref):
        problems.append((f"{where}.ref", f"{rule.ref!r} is not protected, so the agent could edit its own reference: keep references under milestones/"))
    if rule.from_step is not None and rule.to_step is not None and rule.from_step > rule.to_step:
        problems.append((f"{where}.to_step", f"to_step {rule.to_step} is before from_step {rule.from_step}"))
    return problems


def load_milestone(path: str | Path, root: str | Path | None = None) -> Milestone:
    """Read and validate one milestone file. `root` is the repository root the spec's paths are
    relative to (default: the folder above milestones/). Raises SpecError naming file and field path."""
    path = Path(path)
    root = Path(root) if root is not None else path.resolve().parent.parent
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(path, [("", "file not found")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise SpecError(path, [("", f"not valid TOML: {err}")]) from None
    try:
        milestone = Milestone.model_validate(data)
    except ValidationError as err:
        raise SpecError(path, _pydantic_problems(err)) from None
    milestone = Milestone.model_validate(_fill_defaults(milestone.model_dump(mode="python", exclude_unset=False)))
    problems = _cross_checks(milestone)
    if milestone.id != path.stem:
        problems.insert(0, ("id", f"{milestone.id!r} must equal the file name {path.stem!r} (so `temper run {path.stem}` finds it)"))
    digest = hashlib.sha256(raw)
    if milestone.setup is not None:
        setup_file = root / milestone.setup
        if not setup_file.is_file():
            problems.append(("setup", f"patch {milestone.setup!r} not found under {root}"))
        else:
            digest.update(b"\0setup\0" + setup_file.read_bytes())
    if milestone.hidden is not None:
        folder = root / milestone.hidden
        if not folder.is_dir():
            problems.append(("hidden", f"folder {milestone.hidden!r} not found under {root}"))
        else:
            for file in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                digest.update(b"\0hidden\0" + file.relative_to(folder).as_posix().encode() + b"\0" + file.read_bytes())
    if problems:
        raise SpecError(path, problems)
    milestone._source = path
    milestone._spec_hash = digest.hexdigest()
    return milestone


def load_milestones(directory: str | Path, root: str | Path | None = None) -> list[Milestone]:
    """Every `*.toml` in `directory`, sorted by id; the first bad file raises."""
    return [load_milestone(p, root) for p in sorted(Path(directory).glob("*.toml"))]


def find_milestone(name: str, home: str | Path | None = None) -> Path:
    """`demo-tiny` -> <home>/milestones/demo-tiny.toml; an existing path is returned as is."""
    as_path = Path(name)
    if as_path.suffix == ".toml" and as_path.is_file():
        return as_path
    if home is None:
        from harness.settings import temper_home

        home = temper_home()
    candidate = Path(home) / "milestones" / f"{name}.toml"
    if not candidate.is_file():
        known = sorted(p.stem for p in (Path(home) / "milestones").glob("*.toml"))
        raise SpecError(candidate, [("", f"no milestone {name!r}; known: {', '.join(known) or 'none'}")])
    return candidate
