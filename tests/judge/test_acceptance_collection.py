"""Every milestone's acceptance tests collect behind the judge's import barrier, and collect the same tests there.

The judge's test process never imports candidate code (harness/judge/barrier.py): a pytest gate whose test module
imports the engine (at module level, or anything the milestone may edit) cannot be judged at all, and one that
swallows the refusal (an `importorskip`, a `try: import`) silently collects fewer tests. So every milestone's pytest
selectors are collected as the judge collects the base's tests (GateRunner.collect_ids: the judge's ini, plugin and
barrier, hidden material overlaid) and compared with a collection without the barrier: no collection error, and
the same test IDs. This is the guard that keeps acceptance tests in child style (harness/judge/candidate.py;
milestones/README.md says how to write one).

Cost (two pytest collections in all, side by side): every gate's files are collected in one process, behind a
barrier that refuses every file ANY milestone may edit, which is stricter than each milestone's own; and the
`-k` / `-m` selections are left out (they deselect after every module was imported, so they cannot hide an import).
A selection that collects here collects behind each milestone's barrier.
"""

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.judge.manifests import tree_manifest
from harness.judge.admit import overlay_hidden
from harness.judge.runner import GateRunner
from harness.records import RunRecord
from harness.spec import PytestGate, load_milestones
from tests.once import once_per_run

REPO = Path(__file__).resolve().parents[2]
MILESTONES = [m for m in load_milestones(REPO / "milestones", root=REPO) if any(isinstance(g, PytestGate) for g in m.gates)]


def _gates(milestone) -> list[PytestGate]:
    """The milestone's pytest gates without their deselecting args."""
    return [g.model_copy(update={"args": []}) for g in milestone.gates if isinstance(g, PytestGate)]


def _selected(test_id: str, selectors: list[str]) -> bool:
    return any(test_id == s or test_id.startswith(s.rstrip("/") + ("::" if s.endswith(".py") else "/")) for s in selectors)


@pytest.fixture(scope="session")
@once_per_run
def collections(tmp_path_factory) -> tuple:
    """(behind the barrier, without it): each a pytest process and its test IDs, over every gate's files, in one copy
    of this checkout (uncommitted work included) with every milestone's hidden material over it, as the judge's base
    checkout has its own."""
    tmp = tmp_path_factory.mktemp("collect")
    tree = tmp / "tree"
    for rel in tree_manifest(REPO):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tree / rel, follow_symlinks=False)
    runner = None
    for m in MILESTONES:
        record = RunRecord.create(milestone_id=m.id, spec_hash=m.spec_hash, agent={"spec": "none"}, base_commit="0" * 40,
                                  branch="", worktree="", runs_root=tmp / "runs")
        runner = GateRunner(milestone=m, repo=REPO, base="HEAD", record=record)
        overlay_hidden(m, REPO, tree)
    everything = _gates(MILESTONES[0])[0].model_copy(
        update={"selectors": sorted({s for m in MILESTONES for g in _gates(m) for s in g.selectors})})
    editable_anywhere = lambda rel: any(m.is_editable(rel) for m in MILESTONES)  # noqa: E731
    with ThreadPoolExecutor(2) as pool:
        return tuple(pool.map(lambda barrier: runner.collect_ids(tree, tmp, everything, barrier=barrier,
                                                                 is_candidate=editable_anywhere), (True, False)))


def test_every_gate_file_collects_without_the_barrier(collections):
    _, (proc, ids) = collections
    assert proc.returncode == 0 and ids, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("milestone", MILESTONES, ids=[m.id for m in MILESTONES])
def test_acceptance_tests_collect_behind_the_import_barrier(milestone, collections):
    (proc, ids), (_, plain_ids) = collections
    for gate in _gates(milestone):
        want = {i for i in plain_ids if _selected(i, gate.selectors)}
        got = {i for i in ids if _selected(i, gate.selectors)}
        assert got == want, (f"{milestone.id} / {gate.name}: behind the import barrier it collects {len(got)} tests, "
                             f"without it {len(want)}; missing: {sorted(want - got)[:10]}\n"
                             f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
