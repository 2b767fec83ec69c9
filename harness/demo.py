"""`temper demo`: the README's first command. A recorded agent works milestone demo-tiny through the
real loop, tools, workspace, gates and jobs, on CPU, in a few minutes.

The recording (milestones/demo/trajectory.jsonl, replayed by `replay:`) adds an `inverse_sqrt`
learning-rate schedule. Its first attempt reads an environment variable outside engine/env.py: the
guards gate rejects it and the feedback goes back to the agent as its next message. The second
attempt removes the read and passes the protected, guards and pytest gates (held-out acceptance
tests that run the engine), a 20-step CPU training job of the `tiny` preset, and the metric rules the
harness computes from that job's log. Then the report is written.

The demo works on a worktree of the checkout at HEAD (runs/<id>/worktree, branch temper/<id>): the
checkout itself, its branch and its uncommitted changes are never touched, and the worktree and the branch
are removed when the demo ends, however it ends (Ctrl-C included). What stays is the run's records in
runs/<id>/ (git-ignored), which `temper runs` and `temper report` read. No LLM SDK, no network.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from harness.progress import Progress
from harness.verdict import Verdict

__all__ = ["run_demo", "DEMO_MILESTONE", "DEMO_TRAJECTORY"]

DEMO_MILESTONE = "demo-tiny"
DEMO_TRAJECTORY = "milestones/demo/trajectory.jsonl"


def run_demo(progress: Progress | None = None) -> int:
    """Run the demo; 0 when the replayed agent's second attempt is accepted, as it should be."""
    from harness.records import new_run_id
    from harness.session import UsageError, repo_head, start_run
    from harness.settings import runs_dir, temper_home
    from harness.workspace import Workspace

    progress = progress or Progress()
    home = temper_home()
    if not (home / "milestones" / f"{DEMO_MILESTONE}.toml").is_file():
        print(f"temper demo: no milestones/{DEMO_MILESTONE}.toml under {home}; the demo runs in a checkout of the Temper "
              "repository (pip install -e .), or set TEMPER_HOME to one", file=sys.stderr)
        return 2
    try:
        head = repo_head(home)
    except UsageError as err:
        print(f"temper demo: {err}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("pytest") is None:
        print("temper demo: the demo's pytest gate runs the held-out acceptance tests with pytest, which is not "
              "installed here: pip install pytest", file=sys.stderr)
        return 2
    trajectory = home / DEMO_TRAJECTORY
    if not trajectory.is_file():
        print(f"temper demo: the recorded trajectory {trajectory} is missing; reinstall from a full checkout", file=sys.stderr)
        return 2
    progress("run", f"demo: a recorded agent adds an inverse_sqrt LR schedule to the engine at {head[:12]} "
                    f"(milestone {DEMO_MILESTONE}); it works in a worktree under {runs_dir()}, your checkout stays as it is")
    dirty = subprocess.run(["git", "-C", str(home), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        progress("run", "note: your uncommitted changes are not part of the demo; it starts from HEAD")
    run_id = new_run_id(DEMO_MILESTONE)
    try:
        outcome = start_run(DEMO_MILESTONE, f"replay:{trajectory}", progress=progress, run_id=run_id)
    finally:  # also on Ctrl-C and errors: the repository keeps no branch or worktree of the demo
        Workspace.discard(home, run_id=run_id, root=runs_dir())
        progress("run", f"removed the demo's worktree and branch temper/{run_id}; its records stay in "
                        f"{runs_dir() / run_id}")
    print(f"demo run {outcome.run_id}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
    for verdict in _verdicts(outcome.run_dir):
        failed = verdict.failed_gate
        print(f"  attempt {verdict.attempt}: " + ("accepted, every gate passed" if verdict.accepted else
                                              f"rejected by gate {failed.name}: {failed.summary}" if failed else f"rejected: {verdict.reason}"))
    print(f"  records:  {outcome.run_dir}  (events.jsonl, attempts/<n>/diff.patch + verdict.json, jobs/)")
    if outcome.report is not None:
        print(f"  report:   {outcome.report}")
    print(f"  left:     only the run's records in {outcome.run_dir}; the demo's worktree and branch were removed "
          f"(rm -rf {outcome.run_dir} removes the records too)")
    print(f"  next:     temper runs | temper report {outcome.run_id} | temper run demo-tiny --agent anthropic:<model>")
    return 0 if outcome.status == "accepted" else 1


def _verdicts(run_dir: Path) -> list[Verdict]:
    files = sorted((run_dir / "attempts").glob("*/verdict.json"), key=lambda p: int(p.parent.name))
    return [Verdict.from_json(json.loads(f.read_text(encoding="utf-8"))) for f in files]
