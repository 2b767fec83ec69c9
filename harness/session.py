"""Agent runs as the CLI starts them: a new run, a resumed run, and pruning what finished runs left.

`start_run`: load the milestone, create the record (runs/<id>/) and the workspace (harness/workspace.py),
commit the setup patch (the judge's base), drive the loop, write the report. The user's checkout is never
touched, except by `merge=True` after an accepted verdict. `resume_run` reads all it needs from the records
(milestone file and hash, agent spec, the `workspace` event); a replay skips the turns they already hold.
"""

import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.progress import Progress
from harness.records import FINAL_STATUSES, RecordError, RunRecord, new_run_id, read_events
from harness.spec import Milestone, SpecError, find_milestone, load_milestone
from harness.workspace import Workspace, WorkspaceError
from harness.workspace import repo_head as git_head

__all__ = ["UsageError", "RunOutcome", "BUDGET_FIELDS", "repo_head", "load_spec", "with_budget", "setup_base",
           "start_run", "resume_run", "active_seconds", "prune_runs"]

BUDGET_FIELDS = ("max_turns", "max_tokens", "max_cost_usd", "max_wall_s", "max_attempts")


class UsageError(ValueError):
    """Bad input from the user (milestone, agent spec, repository, run id): exit code 2, one line."""


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: str
    reason: str
    run_dir: Path
    report: Path | None
    merged: str | None = None
    merge_error: str = ""
    discarded: bool = False  # it did no work, so its worktree, branch and records were removed


def repo_head(repo: Path) -> str:
    """HEAD's sha of the git checkout at `repo` (harness.workspace.repo_head), as a UsageError when there is none."""
    try:
        return git_head(repo)
    except WorkspaceError as err:
        raise UsageError(str(err)) from None


def load_spec(name: str, home: Path) -> Milestone:
    try:
        return load_milestone(find_milestone(name, home), root=home)
    except SpecError as err:
        raise UsageError(str(err)) from None


def with_budget(milestone: Milestone, overrides: dict[str, Any]) -> Milestone:
    """The milestone with some budget fields replaced (validated like the spec's own)."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if not overrides:
        return milestone
    from pydantic import ValidationError

    try:
        budget = type(milestone.budget).model_validate({**milestone.budget.model_dump(), **overrides})
    except ValidationError as err:
        first = err.errors()[0]
        raise UsageError(f"budget.{first['loc'][0]}: {first['msg']}") from None
    return milestone.model_copy(update={"budget": budget})


def setup_base(ws: Workspace, milestone: Milestone, home: Path, run_id: str) -> str:
    """Apply and commit the milestone's setup patch in `ws`; its commit is the judge's base.

    A base that already contains the setup (a checkout that merged an earlier run) is used as is.
    """
    if milestone.setup is None:
        return ws.head()
    patch = (home / milestone.setup).resolve()
    try:
        ws.apply_patch_file(patch)
    except WorkspaceError as err:
        if ws.contains_patch(patch):
            return ws.head()
        raise UsageError(f"the setup patch {milestone.setup} does not apply to {ws.base[:12]}: {err}") from None
    return ws.commit_attempt(0, milestone=milestone.id, run_id=run_id, verdict="setup", mfu=None,
                             message=f"setup of milestone {milestone.id}: {milestone.setup}")


def _agent_meta(spec: str, options: dict[str, Any]) -> dict[str, Any]:
    kind, _, rest = spec.partition(":")
    model = rest.rpartition("#")[2] if kind == "openai-compatible" else Path(rest).name if kind == "replay" else rest
    meta: dict[str, Any] = {"spec": spec, "backend": kind, "model": str(options.get("model", model))}
    return {**meta, "options": options} if options else meta


def _make_agent(spec: str, options: dict[str, Any], played: int = 0) -> Any:
    """The agent of `spec`; a replay resumed after `played` recorded turns starts at the next one."""
    from harness.agents import make_agent
    from harness.protocol import AgentError

    if spec.startswith("replay:") and played:
        from harness.agents.replay import ReplayAgent, load_turns

        return ReplayAgent(load_turns(Path(spec[len("replay:"):]))[played:], name=spec)
    from harness.agents import SubprocessAgent

    try:
        agent = make_agent(spec, **options)
        if isinstance(agent, SubprocessAgent):
            agent.resolve()  # a CLI that is not installed is refused before the run creates anything
    except (ValueError, AgentError) as err:
        raise UsageError(str(err)) from None
    return agent


def _discard(record: RunRecord, repo: Path, runs_root: Path) -> None:
    """Remove everything a run that did no work left: its worktree, its branch and its records."""
    Workspace.discard(repo, run_id=record.id, root=runs_root)
    shutil.rmtree(record.dir)


def active_seconds(events: list[dict[str, Any]]) -> float:
    """Wall time a run has been active: event spans between resumes (a day-long pause does not count)."""
    total, first, last = 0.0, None, None
    for event in events:
        try:
            ts = datetime.fromisoformat(str(event.get("ts", "")).replace("Z", "+00:00"))
        except ValueError:
            continue
        if event.get("type") == "resumed" and first is not None and last is not None:
            total += (last - first).total_seconds()
            first = None
        first = first or ts
        last = ts
    if first is not None and last is not None:
        total += (last - first).total_seconds()
    return total


def _drive(*, milestone: Milestone, record: RunRecord, ws: Workspace, agent: Any, judge_base: str, repo: Path,
           progress: Progress, home: Path, unsandboxed: bool, wall_offset_s: float, options: Any, merge: bool,
           discard_idle: bool = False) -> RunOutcome:
    """Run the loop; with `discard_idle`, a run that failed before its agent answered once or any attempt was
    judged (an unreachable server) leaves nothing behind: no worktree, branch or record."""
    from harness.judge import GateRunner
    from harness.loop import Loop
    from harness.report import write_report

    gates = GateRunner(milestone=milestone, repo=repo, base=judge_base, record=record, progress=progress, home=home,
                       unsandboxed=unsandboxed)
    loop = Loop(milestone=milestone, record=record, workspace=ws, agent=agent, gates=gates, judge_base=judge_base,
                progress=progress, wall_offset_s=wall_offset_s, options=options)
    try:
        status = loop.run()
    finally:
        report = write_report(record.dir)
    if discard_idle and status == "error" and record.totals.turns == 0 and record.totals.attempts == 0:
        reason = record.meta.get("reason", "")
        _discard(record, repo, record.dir.parent)
        return RunOutcome(run_id=record.id, status=status, reason=reason, run_dir=record.dir, report=None, discarded=True)
    merged, merge_error = None, ""
    if merge and status == "accepted":
        try:
            merged = ws.merge_into_user(repo)
            record.note("merged into the user's checkout", head=merged)
        except WorkspaceError as err:
            merge_error = str(err)
    elif merge:
        merge_error = f"not merged: the run ended {status}"
    return RunOutcome(run_id=record.id, status=status, reason=record.meta.get("reason", ""), run_dir=record.dir,
                      report=report, merged=merged, merge_error=merge_error)


def start_run(milestone_name: str, agent_spec: str, *, home: Path | None = None, runs_root: Path | None = None,
              budget: dict[str, Any] | None = None, options: Any = None, merge: bool = False,
              progress: Progress | None = None, run_id: str | None = None,
              agent_options: dict[str, Any] | None = None, unsandboxed: bool = False) -> RunOutcome:
    """A new run of `milestone_name` by `agent_spec` on a worktree of the checkout's HEAD.

    `agent_options` are keyword arguments of the backend (e.g. executable= for a CLI agent); they are
    recorded (minus anything named like a key or token) so `resume_run` rebuilds the same agent.
    """
    from harness.protocol import LoopOptions
    from harness.prompts import system_prompt
    from harness.settings import runs_dir, temper_home
    from harness.tools import tool_specs

    home = Path(home or temper_home())
    runs_root = Path(runs_root or runs_dir())
    progress = progress or Progress()
    options = options or LoopOptions()
    milestone = with_budget(load_spec(milestone_name, home), budget or {})
    from harness.judge import check_data, check_requires
    from harness.settings import data_dir

    check_requires(milestone.requires)  # NeedsHardware before anything is created or spent
    check_data(milestone, data_dir(home))
    head = repo_head(home)
    if agent_spec.startswith("replay:"):  # recorded absolute, so `temper resume` works from any folder
        agent_spec = "replay:" + str(Path(agent_spec[len("replay:"):]).resolve())
    agent_options = dict(agent_options or {})
    agent = _make_agent(agent_spec, agent_options)
    from harness.agents import ChatAgent

    run_id = run_id or new_run_id(milestone.id)
    worktree = runs_root.resolve() / run_id / "worktree"
    tools = tool_specs() if isinstance(agent, ChatAgent) else []
    record = RunRecord.create(
        milestone_id=milestone.id, spec_hash=milestone.spec_hash, agent=_agent_meta(agent_spec, agent_options), base_commit=head,
        branch=f"temper/{run_id}", worktree=worktree, system_prompt=system_prompt(milestone, worktree, tools),
        milestone_path=str(milestone.source), run_id=run_id, runs_root=runs_root,
    )
    progress("run", f"{run_id}: milestone {milestone.id}, agent {agent_spec}")
    try:
        ws = Workspace.create(home, base=head, run_id=run_id, root=runs_root)
    except WorkspaceError as err:  # nothing of ours in git (an existing branch is another run's): the record goes
        shutil.rmtree(record.dir)
        raise UsageError(str(err)) from None
    try:
        judge_base = setup_base(ws, milestone, home, run_id)
    except (WorkspaceError, UsageError) as err:
        _discard(record, home, runs_root)
        raise UsageError(str(err)) from None
    record.workspace_ready(repo=str(ws.repo), judge_base=judge_base, budget=milestone.budget.model_dump(),
                max_output_tokens=options.max_output_tokens, shell_timeout_s=options.shell_timeout_s, unsandboxed=unsandboxed)
    progress("run", f"worktree {ws.worktree} on {ws.branch}, base {head[:12]}" +
             (f", judge base {judge_base[:12]} (setup {milestone.setup})" if judge_base != head else ""))
    return _drive(milestone=milestone, record=record, ws=ws, agent=agent, judge_base=judge_base, repo=ws.repo,
                  progress=progress, home=home, unsandboxed=unsandboxed, wall_offset_s=0.0, options=options, merge=merge,
                  discard_idle=True)


def resume_run(run: str, *, runs_root: Path | None = None, merge: bool = False, progress: Progress | None = None) -> RunOutcome:
    """Continue a run that stopped (killed, interrupted, crashed) from its records."""
    from harness.protocol import LoopOptions

    progress = progress or Progress()
    try:
        record = RunRecord.open(run, runs_root)
    except RecordError as err:
        raise UsageError(str(err)) from None
    if record.status in FINAL_STATUSES:
        raise UsageError(f"run {record.id} already ended as {record.status}; start a new run instead")
    if record.meta["agent"].get("backend") == "gate":
        raise UsageError(f"run {record.id} is a `temper gate` judgement, not an agent run; run temper gate again")
    events = read_events(record.dir / "events.jsonl").events
    ready = next((e for e in events if e["type"] == "workspace"), None)
    if ready is None:
        raise UsageError(f"run {record.id} stopped before its workspace was ready; start a new run instead")
    meta = record.meta
    source = Path(meta["milestone"]["path"])
    try:
        milestone = load_milestone(source, root=source.resolve().parent.parent)
    except SpecError as err:
        raise UsageError(str(err)) from None
    if milestone.spec_hash != meta["milestone"]["spec_hash"]:
        raise UsageError(f"{source} changed since run {record.id} started (spec hash differs); start a new run instead")
    milestone = milestone.model_copy(update={"budget": type(milestone.budget).model_validate(ready["budget"])})
    played = sum(1 for e in events if e["type"] == "llm_call")
    agent = _make_agent(meta["agent"]["spec"], dict(meta["agent"].get("options") or {}), played)
    previous = record.status
    offset = active_seconds(events)
    record.resume()
    repo = Path(ready["repo"])
    try:
        ws = Workspace.open(repo, run_id=record.id, root=record.dir.parent)
    except WorkspaceError as err:
        record.finish("error", f"workspace: {err}")
        raise UsageError(str(err)) from None
    progress("run", f"resuming {record.id} (was {previous}; {record.totals.turns} turns, {record.totals.attempts} attempts, "
                    f"{offset:.0f} s so far)" + ("; dropped a partial event line" if record.truncated_tail else ""))
    options = LoopOptions(max_output_tokens=int(ready.get("max_output_tokens", LoopOptions.max_output_tokens)),
                          shell_timeout_s=float(ready.get("shell_timeout_s", LoopOptions.shell_timeout_s)))
    return _drive(milestone=milestone, record=record, ws=ws, agent=agent, judge_base=ready["judge_base"], repo=repo,
                  progress=progress, home=source.resolve().parent.parent, unsandboxed=bool(ready.get("unsandboxed", False)),
                  wall_offset_s=offset, options=options, merge=merge)


def prune_runs(runs_root: Path | None = None) -> list[str]:
    """Remove the worktrees and `temper/<id>` branches of finished runs (accepted, rejected, out of budget); their
    records stay (each attempt's diff is under attempts/). Runs that can still be resumed are left alone.
    Returns one line per thing removed."""
    from harness.records import list_runs
    from harness.settings import runs_dir

    root = Path(runs_root or runs_dir()).resolve()
    removed = []
    for run in list_runs(root):
        ws_record = run.path / "workspace.json"
        if run.status not in FINAL_STATUSES or not ws_record.is_file():
            continue
        repo = Path(json.loads(ws_record.read_text(encoding="utf-8"))["repo"])
        try:
            what = Workspace.discard(repo, run_id=run.id, root=root)
        except WorkspaceError as err:
            removed.append(f"{run.id}: not pruned: {err}")
            continue
        if what:
            removed.append(f"{run.id} ({run.status}): removed {' and '.join(what)}")
    return removed
