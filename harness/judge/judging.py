"""One judging's state, and how a gate starts a candidate process inside it.

`Context` holds what stays the same across the judgings of one runner (milestone, base commit, records, facts of
the base read once); `Judging` is one judging: the admitted tree, the draw, and what earlier gates left for later
ones. Every gate is `run(gate, judging)`: it reads and adds to the judging and never reaches the runner.
"""

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.jobs import JobResult, Sandbox
from harness.judge.baseconfig import load_base
from harness.judge.draws import DRAW_FILE_ENV, Draw
from harness.judge.manifests import python_env
from harness.judge.policy import PolicyResult
from harness.progress import Progress
from harness.records import RunRecord
from harness.settings import data_dir, torch_caches_while
from harness.spec import JobGate, Milestone

__all__ = ["GateError", "Context", "Judging", "JobOutcome", "JUDGE_ROOT", "LOG_TAIL_LINES", "tail", "read_text",
           "neutral", "candidate_env", "cache_env", "job_env", "removed_after", "judge_caches"]

LOG_TAIL_LINES = 60
JUDGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this judge's `harness` package


class GateError(ValueError):
    """The candidate cannot be judged at all (its patch does not apply to the base, no sandbox)."""


@dataclass(frozen=True)
class JobOutcome:
    """One job gate's run during this judging: its folder under runs/<id>/jobs/ and how it ended."""

    gate: JobGate
    job_id: str
    job_dir: Path  # the job's own (writable, untrusted) folder
    result: JobResult
    argv: tuple[str, ...] = ()  # the argv the judge rendered for it
    evidence: dict[str, float] | None = None  # what the judge measured from the job's weights (judge_val_loss, ...)
    kept: tuple[Path, ...] = ()  # checkpoints the judge's keeper linked out of the job's sight (claims/keeper.py)


@dataclass
class Context:
    """What the judgings of one runner share: the milestone, the judge's base commit, the run's records, and the facts
    of the base the judge reads once (its config defaults and presets, its test IDs, its pytest ini)."""

    milestone: Milestone
    repo: Path
    base: str
    home: Path  # where the milestone's hidden material lives
    record: RunRecord
    progress: Progress
    unsandboxed: bool
    logs: dict[str, Path] = field(default_factory=dict)  # job id -> log, for the agent's read_log tool
    base_ids: dict[str, frozenset[str]] = field(default_factory=dict)  # pytest gate -> test IDs the base collects
    pytest_ini: str | None = None
    _base_config: tuple[dict[str, Any], dict[str, Any]] | None = None

    def base_config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(config defaults, presets) of the base commit's engine (harness/judge/baseconfig.py), read once."""
        if self._base_config is None:
            self._base_config = load_base(self.repo, self.base)
        return self._base_config


@dataclass
class Judging:
    """State of one judging: where it happens and what earlier gates left for later ones."""

    ctx: Context
    attempt: int
    label: str  # "a3" or "dry2": prefix of job folders in the records
    tree: Path
    holder: Path  # the neutral temp folder around the checkout: job folders, the judge's pytest ini
    live_tree: Path | None
    diff: str
    log_dir: Path
    env_overrides: dict[str, str]
    policy: PolicyResult
    expected: dict[str, str]  # the checkout's manifest once the patch is applied; must not move after
    seed: int
    device: str
    draw: Draw
    public: bool = False  # a dry run: the public draw, no held-out material (harness/judge/runner.py)
    jobs: dict[str, JobOutcome] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    new_tests_ran: bool = False
    saves: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # train job -> (SavePlan, CheckpointKeeper | None)
    batches: dict[tuple[str, ...], Any] = field(default_factory=dict)  # base `engine batches` argv -> its answer
    corpora: dict[int, Path] = field(default_factory=dict)  # training tokens -> the judge-cut corpus of that size
    scratch: list[Path] = field(default_factory=list)  # the judge's own temp folders, removed after the judging
    pycache: tuple[Path, ...] = ()  # the judge-compiled bytecode folders of the checkout (read-only in the sandbox)
    overlays: list[Path] = field(default_factory=list)  # what sandboxed processes wrote to the checkout, not yet checked

    @property
    def milestone(self) -> Milestone:
        return self.ctx.milestone

    def sandbox(self, *, writable: tuple[Path, ...], launcher: str = "local", readonly: tuple[Path, ...] = (),
                hidden: tuple[Path, ...] = (), cwd: Path | None = None) -> dict[str, Any]:
        """JobSpec fields that put a candidate process in the sandbox: everything read-only, the judge's temp
        folder too (it lives under /tmp, which is private inside) and the shared data folder, only `writable` writable, the judge's records
        and the home's milestones (hidden material, references) out of sight, no network. The judged checkout,
        when it is the process's `cwd` (the default), is seen writable as a user's is: an overlay whose changes
        the judge reads after the gate (any rejects, as a changed file does), its judge-compiled `__pycache__`
        folders read-only; the user's home likewise, its writes discarded. None when unsandboxed, and for SLURM
        jobs (run on other hosts)."""
        if self.ctx.unsandboxed or launcher != "local":
            return {}
        hidden = tuple(p for p in (self.ctx.record.dir.parent, self.ctx.home / "milestones", *hidden) if p.exists()
                       and not self.tree.is_relative_to(p))
        overlaid: tuple[tuple[Path, Path], ...] = ()
        if cwd is None or cwd == self.tree:
            changes = Path(tempfile.mkdtemp(dir=self.scratch[0]))  # out of the sandbox's sight (beside the holder)
            self.overlays.append(changes)
            overlaid, readonly = ((self.tree, changes),), (*readonly, *self.pycache)
        # The shared data folder (`{data}`) is read as a user's run reads it, also where it lies below /tmp (private inside).
        data = tuple(p for p in (data_dir(self.ctx.home),) if p.is_dir() and p != Path("/"))
        return {"sandbox": Sandbox(writable=writable, readonly=(self.holder, *data, *readonly), hidden=hidden, overlaid=overlaid,
                                   home=True, gpus=self.device == "cuda")}

    def caches(self, folder: Path) -> dict[str, str]:
        """The cache and temp variables of a candidate process (`cache_env`), unsandboxed only: in the sandbox its
        home is writable and /tmp private, both gone with it, so its caches go where a user's run puts them."""
        return {} if not self.ctx.unsandboxed else cache_env(folder)


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace") if path.is_file() else ""


def neutral(parent: Path) -> Path:
    """A fresh folder with a random name: nothing in a path tells candidate code it is being judged."""
    path = parent / secrets.token_hex(6)
    path.mkdir(parents=True)
    return path


def candidate_env(tree: Path, holder: Path, seed: int, draw: Draw | None = None, *, sandboxed: bool = False,
                  base: bool = False) -> dict[str, str]:
    """Environment overrides of candidate processes: the checkout's code first, no pytest plugin unless the
    judge names it (-p) and nobody's PYTEST_ADDOPTS; the judge's seed and draw for tests (the draw's JSON in a
    file of the read-only holder). Bytecode: sandboxed, the judge compiled the checkout and its `__pycache__`
    folders are read-only (harness/judge/bytecode.py), so Python runs with its defaults, as a user's does;
    unsandboxed, it goes elsewhere; `base`: the judge's own checkout of the base (manifests.python_env)."""
    python = python_env(tree, None if base else neutral(holder))
    if sandboxed:
        python = {"PYTHONPATH": python["PYTHONPATH"]}
    env = {**python, "TEMPER_JUDGE_SEED": str(seed), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": ""}
    if draw is not None:
        path = neutral(holder) / "draw.json"
        path.write_text(json.dumps(draw.values, sort_keys=True), encoding="utf-8")
        env[DRAW_FILE_ENV] = str(path)
    return env


def cache_env(folder: Path) -> dict[str, str]:
    """Where a candidate process's caches and temp files go (compiled kernels, Triton, Inductor, anything under
    XDG, TMPDIR): its own writable folder, so the sandbox's read-only home is never needed, nothing compiled
    reaches another judging, and nothing is left in the user's TMPDIR when the judge runs unsandboxed (torchrun's
    torchelastic_* log folders stay behind; Inductor's default is $TMPDIR/torchinductor_$USER). The TMPDIR folder
    is made here: tempfile falls back to /tmp when it does not exist."""
    tmp = folder / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {"XDG_CACHE_HOME": str(folder / ".cache"), "TEMPER_KERNEL_CACHE": str(folder / ".kernels"),
            "TRITON_CACHE_DIR": str(folder / ".triton"), "TORCHINDUCTOR_CACHE_DIR": str(folder / ".inductor"),
            "TMPDIR": str(tmp)}


def job_env(overrides: dict[str, str], *, path: bool = True) -> dict[str, str]:
    """A job gets the checkout's code and no pytest or seed variables: its seed, if any, is in its argv. `path=False`:
    not the PYTHONPATH either, for a `python -m` run in the checkout, which puts it first on its path by itself, as a
    user's run does (sandboxed: no other folder of the user's can shadow it there)."""
    return {k: v for k, v in overrides.items() if not k.startswith(("PYTEST_", "TEMPER_JUDGE_")) and (path or k != "PYTHONPATH")}


@contextlib.contextmanager
def removed_after(folders: list[Path]) -> Iterator[None]:
    """Remove `folders` when the block ends, however it ends. The list is read at the end, so a folder the
    block appends to it (a job's checkpoint keeper, made as the job starts) is removed too."""
    try:
        yield
    finally:
        for folder in folders:
            for parent, dirs, _ in os.walk(folder):  # overlayfs leaves its work folder unreadable (mode 000)
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.chmod(os.path.join(parent, name), 0o700)
            shutil.rmtree(folder, ignore_errors=True)


def judge_caches(folder: Path) -> contextlib.AbstractContextManager:
    """The judge's own process keeps torch's caches in `folder` while it judges. Its reference model's activation
    recompute (torch.utils.checkpoint, on a large model) imports torch._dynamo, which makes Inductor's cache folder,
    by default the shared $TMPDIR/torchinductor_$USER: a judging leaves nothing behind, its own process included."""
    env = cache_env(folder)
    return torch_caches_while(env["TRITON_CACHE_DIR"], env["TORCHINDUCTOR_CACHE_DIR"])
