"""The guards gate (MODEL = GuardsGate): `temper guards check` over the gate's paths, read by the judge's process.

The guards read files, never run them, so they run in the judge's own process on the judged checkout, with the
checkout's guards.toml. Every `# guard: allow` the candidate's files have beyond the base's fails the gate too:
a red line the candidate lifted for itself is a reviewer's decision.
"""

from harness.judge.baseconfig import base_file
from harness.judge.judging import Judging
from harness.spec import GuardsGate
from harness.verdict import GateResult

__all__ = ["MODEL", "run"]

MODEL = GuardsGate


def run(gate: GuardsGate, judging: Judging) -> GateResult:
    # Imported here, not at load: every process that imports harness.judge (the judge's pytest plugin, the op
    # bench) would otherwise load the guards too.
    from guards.config import GuardsConfigError, load_config
    from guards.report import summary as guards_summary
    from guards.runner import check_paths

    try:
        config = load_config(judging.tree / "guards.toml")
    except GuardsConfigError as err:
        return GateResult(name=gate.name, kind=gate.kind, passed=False, summary="guards.toml is unusable", violations=(str(err),))
    paths = [judging.tree / p for p in gate.paths]
    missing = [p for p, full in zip(gate.paths, paths, strict=True) if not full.exists()]
    violations = [f"{p}: no such file or folder" for p in missing]
    result = check_paths([p for p in paths if p.exists()], config, list(gate.rules), cwd=judging.tree)
    violations += [f.to_text() for f in result.findings]
    violations += _new_suppressions(gate, judging)
    if violations:
        found = len(violations)
        return GateResult(name=gate.name, kind=gate.kind, passed=False, violations=tuple(violations),
                          summary=f"{found} finding{'' if found == 1 else 's'} in {' '.join(gate.paths)} "
                                  f"({result.files} files checked)")
    return GateResult(name=gate.name, kind=gate.kind, passed=True,
                      summary=f"{guards_summary(0, 0, result.files)} ({', '.join(gate.rules)})")


def _new_suppressions(gate: GuardsGate, judging: Judging) -> list[str]:
    """Every `# guard: allow` the candidate's files have beyond the base's, read from the files (never
    from one diff dialect's text)."""
    from guards.suppression import new_suppressions

    in_scope = [p for p, kind in judging.policy.changed.items() if kind != "deleted" and p.endswith(".py")
                and any(p == s or p.startswith(s.rstrip("/") + "/") for s in gate.paths)]
    candidate = {p: (judging.tree / p).read_bytes().decode("utf-8", "replace") for p in in_scope}
    ctx = judging.ctx
    base = {p: raw.decode("utf-8", "replace") for p in in_scope if (raw := base_file(ctx.repo, ctx.base, p)) is not None}
    return new_suppressions(base, candidate)
