"""`temper gate`: judge the checkout's uncommitted changes, or a patch, with no agent (the judge's own entry)."""

import shutil
from pathlib import Path

from harness.progress import Progress
from harness.records import RunRecord, new_run_id
from harness.session import UsageError, load_spec, repo_head, setup_base
from harness.verdict import Verdict
from harness.workspace import Workspace, WorkspaceError, resolve_commit

__all__ = ["gate_candidate"]


def gate_candidate(milestone_name: str, *, patch: Path | None = None, base: str = "HEAD", home: Path | None = None,
                   runs_root: Path | None = None, progress: Progress | None = None,
                   unsandboxed: bool = False, judge_seed: int | None = None,
                   draw: str | None = None) -> tuple[Verdict, Path]:
    """Judge the checkout's uncommitted changes, or `patch`, on base (+ the milestone's setup), no agent.
    `judge_seed` / `draw` replay a recorded judging (harness/judge/draws.py): its secret, the values it drew.

    Recorded as a run (`<id>-gate`, attempt 1) so its job logs and report live where every run's do.
    """
    from harness.judge import NeedsHardware, check_data, check_requires
    from harness.settings import data_dir, runs_dir, temper_home

    home = Path(home or temper_home())
    progress = progress or Progress()
    milestone = load_spec(milestone_name, home)
    check_requires(milestone.requires)  # NeedsHardware before anything is created (or the judge's pipeline imported)
    check_data(milestone, data_dir(home))
    from harness.judge import GateError, GateRunner
    from harness.report import write_report

    override = None
    if draw is not None:
        from harness.judge.draws import DrawError, load_override

        try:
            override = load_override(draw)
        except DrawError as err:
            raise UsageError(str(err)) from None
    repo_head(home)
    try:
        base_sha = resolve_commit(home, base)
    except WorkspaceError:
        raise UsageError(f"--base {base!r} is not a commit of {home}") from None
    if patch is not None:
        if not patch.is_file():
            raise UsageError(f"patch file {patch} does not exist")
        diff = patch.read_text(encoding="utf-8", errors="surrogateescape")
        source = str(patch)
    else:
        diff = Workspace(repo=home, worktree=home, base=base_sha, branch=None, run_id="checkout").diff()
        source = f"uncommitted changes of {home}"
    run_id = new_run_id(f"{milestone.id}-gate")
    record = RunRecord.create(milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent={"spec": "none", "backend": "gate"},
                              base_commit=base_sha, branch="", worktree="", milestone_path=str(milestone.source),
                              run_id=run_id, runs_root=runs_root or runs_dir())
    progress("run", f"{run_id}: judging {source} against milestone {milestone.id} at {base_sha[:12]}")
    try:
        with Workspace.scratch(home, base_sha) as scratch:
            judge_base = setup_base(scratch, milestone, home, run_id)
        record.workspace_ready(repo=str(home), judge_base=judge_base, source=source)
        verdict = GateRunner(milestone=milestone, repo=home, base=judge_base, record=record, progress=progress, home=home,
                             unsandboxed=unsandboxed, judge_seed=judge_seed, draw=override).judge(diff, attempt=1)
    except NeedsHardware:  # refused, nothing judged: no record of it
        shutil.rmtree(record.dir)
        raise
    except (GateError, UsageError, WorkspaceError) as err:
        record.finish("error", str(err))
        raise UsageError(f"{source} cannot be judged: {err}") from None
    record.attempt(verdict, diff)
    record.finish("accepted" if verdict.accepted else "rejected", verdict.reason)
    write_report(record.dir)
    return verdict, record.dir
