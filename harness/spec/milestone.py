"""The milestone model: goal, context, what may be edited, hidden material, hardware, draws, gates and budget."""

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from harness.spec.gates import Gate, JobGate, MetricsGate
from harness.spec.vocab import JUDGE_GLOBS, NEW_TEST_GLOB, TEST_GLOB, Glob, Strict, check_relpath, glob_match

__all__ = ["ContextFile", "Budget", "DRAW_KINDS", "DRAW_NAME", "DrawVar", "Requires", "NeedsHardware", "Milestone"]


class ContextFile(Strict):
    """A file the prompt shows (`include = true`: an excerpt inlined) or only points to."""

    path: str
    include: bool = False
    lines: tuple[int, int] | None = None  # 1-based, inclusive; None: the whole file (up to the prompt's cap)
    why: str = ""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_relpath(value)

    @field_validator("lines")
    @classmethod
    def _lines(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1]:
            raise ValueError(f"lines {list(value)} must be [first, last] with 1 <= first <= last")
        return value


class Budget(Strict):
    """Limits checked before every model call; the first one spent ends the run as budget_exhausted."""

    max_turns: int = Field(gt=0)
    max_tokens: int = Field(gt=0)  # input + output tokens over the whole run
    max_cost_usd: float | None = Field(default=None, gt=0)  # None: no cost limit (unknown prices stay allowed)
    max_wall_s: float = Field(gt=0)
    max_attempts: int = Field(gt=0)



# "small": 0..100, the seeds people type; "large": 2**32 .. 2**63 - 1; "any": either, at even odds.
# "epoch-crossing" (the entry `corpus` only): {corpus} is a prepared dataset the judge cuts from the base's
# bundled corpus for each job, so small that the job's run crosses an epoch boundary (harness/judge/draws.py).
DRAW_KINDS = ("small", "large", "any", "epoch-crossing")
DRAW_NAME = r"[a-z][a-z0-9_]*"


class DrawVar(Strict):
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
                if not re.fullmatch(DRAW_NAME, key):
                    raise ValueError(f"choice key {key!r} must match {DRAW_NAME}")
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



class NeedsHardware(RuntimeError):
    """The milestone cannot be judged on this machine (its `requires`, or the shared data its jobs read); the message
    says what it needs. Nothing is judged. Raised by harness/judge/hardware.py; here, beside Requires, so that the
    CLI can name it without importing the judge."""


class Requires(Strict):
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


class Milestone(Strict):
    id: str
    title: str = Field(min_length=1)
    goal: str = Field(min_length=1)  # markdown
    context: list[ContextFile] = Field(default_factory=list)
    editable: list[Glob] = Field(min_length=1)
    protected: list[Glob] = Field(default_factory=list)  # in addition to JUDGE_GLOBS and tests/**
    setup: str | None = None  # a patch (git apply) committed before the agent starts
    # A folder under milestones/ whose files (held-out acceptance tests, reference data) are copied over
    # the judged checkout for judging only: never in the agent's worktree. They are protected like tests.
    hidden: str | None = None
    binary: list[Glob] = Field(default_factory=list)  # editable paths where binary content is allowed
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
        return None if value is None else check_relpath(value, "setup")

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_relpath(value, "hidden")
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

