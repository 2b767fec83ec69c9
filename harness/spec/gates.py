"""The gate declarations of a milestone's TOML (`[[gates]]`), one pydantic model per kind.

The judge runs each kind with its own module under harness/judge/gates/ (`MODEL = PytestGate` there); the models
live here, in the spec layer, because the spec is read agent-side (prompts, reports) and never imports the judge.
"""

import math
import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from harness.spec.vocab import (GUARD_RULES, METRICS, OPS, NAME_PATTERN, RelPath, Selector, Strict, check_relpath)

__all__ = ["ProtectedGate", "GuardsGate", "PytestGate", "OpBench", "JobGate", "MetricRule", "MetricsGate", "Gate"]


class _GateBase(Strict):
    name: str = ""  # filled by the loader: the kind for the first gate of a kind, else "<kind>-<n>"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value and not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(f"name {value!r} must match {NAME_PATTERN} (lower case, digits, '-', '_')")
        return value


class ProtectedGate(_GateBase):
    """Judge integrity, before any candidate code runs: the diff policy (every touched path editable, or a
    new test file; no binaries, no symlinks) and no protected file changed in the agent's worktree."""

    kind: Literal["protected"]


class GuardsGate(_GateBase):
    """`temper guards check` over `paths` with the named rules (all by default)."""

    kind: Literal["guards"]
    paths: list[RelPath] = Field(default_factory=lambda: ["engine"], min_length=1)
    rules: list[Literal["ssot", "dag", "public-surface", "fail-fast", "isolation", "exec-route", "recognition"]] = Field(
        default_factory=lambda: list(GUARD_RULES), min_length=1
    )


class PytestGate(_GateBase):
    """pytest on `selectors`; fails when fewer than `min_collected` tests are collected (a deleted test
    file or a skip-everything conftest must not pass)."""

    kind: Literal["pytest"]
    selectors: list[Selector] = Field(min_length=1)
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


class OpBench(Strict):
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
    # and the lr the judge fits from every pair of checkpoints it holds must follow it (harness/judge/claims/contract.py).
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
        return check_relpath(value, "file")


# What a [draw] entry may say besides a DrawVar table: how a seed is drawn, and the judge-cut training corpus.
# "small": 0..100, the seeds people type; "large": 2**32 .. 2**63 - 1; "any": either, at even odds.
# "epoch-crossing" (the entry `corpus` only): {corpus} is a prepared dataset the judge cuts from the base's


class MetricRule(Strict):
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
        return None if value is None else check_relpath(value, "ref")

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
