"""The protected gate (MODEL = ProtectedGate): the diff policy, before any candidate code runs.

The policy was decided when the patch was admitted (harness/judge/admit.py); this gate reports it, and adds the
protected files of the agent's live worktree that differ from the base on disk (found by walking the disk, never
by asking git, which the agent's shell can blind).
"""

from harness.judge.judging import Judging
from harness.judge.manifests import base_manifest, disk_manifest, manifest_changes
from harness.spec import ProtectedGate, glob_match
from harness.verdict import GateResult
from harness.workspace import HELD_OUT_GLOB

__all__ = ["MODEL", "run"]

MODEL = ProtectedGate


def run(gate: ProtectedGate, judging: Judging) -> GateResult:
    ctx = judging.ctx
    violations = list(judging.policy.violations)
    if judging.live_tree is not None:
        is_protected = ctx.milestone.is_protected
        # Held-out material is left out of the agent's worktree on purpose (Workspace: sparse checkout).
        base = {p: h for p, h in base_manifest(ctx.repo, ctx.base, is_protected).items()
                if not glob_match(f"{HELD_OUT_GLOB}/**", p)}
        live = {p: h for p, h in disk_manifest(judging.live_tree, is_protected).items() if p not in judging.policy.new_tests}
        violations += [f"{v} (in your worktree, hidden from git: ignored, excluded or marked unchanged)"
                       for v in manifest_changes(base, live)]
    if violations:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(dict.fromkeys(violations)),
                          summary=f"{len(violations)} change(s) outside the editable globs or to a protected file "
                                  f"(the diff policy of milestone {ctx.milestone.id})")
    changed = judging.policy.changed
    summary = f"{len(changed)} file(s) changed, all editable"
    if judging.policy.new_tests:
        summary += f"; {len(judging.policy.new_tests)} new test file(s): {', '.join(judging.policy.new_tests)}"
    return GateResult(name=gate.name, kind=gate.kind, passed=True, summary=summary)
