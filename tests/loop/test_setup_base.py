"""A milestone's setup patch becomes the judge's base (harness/session.py setup_base): applied and committed on the
run's branch, reused when the checkout already contains it, refused by name when it does not apply. The end-to-end run
of a setup milestone (repair-data-order, replayed agent, bitwise-single's jobs accepted) is tests/loop/test_demo.py's
slow test_a_replayed_agent_repairs_the_data_order_and_passes_a_programme_milestone."""

from pathlib import Path

import pytest

from harness.session import UsageError, load_spec, setup_base
from harness.workspace import Workspace
from tests.loop.loop_helpers import git
from tests.loop.test_demo import checkout_copy

__all__: list[str] = []


def test_the_setup_patch_is_the_judges_base_and_a_base_that_holds_it_is_kept(tmp_path: Path) -> None:
    home = checkout_copy(tmp_path / "checkout")
    milestone = load_spec("repair-data-order", home)
    head = git(home, "rev-parse", "HEAD").strip()
    ws = Workspace.create(home, base=head, run_id="r1", root=tmp_path / "runs")
    base = setup_base(ws, milestone, home, "r1")
    assert base != head and git(ws.worktree, "rev-parse", "HEAD").strip() == base
    changed = git(ws.worktree, "diff", "--name-only", head, base).split()
    assert changed and all(name.startswith("engine/") for name in changed)  # the planted bug, nothing else
    assert git(home, "status", "--porcelain") == ""  # the user's checkout is not touched

    # A checkout that merged an earlier run of this milestone already holds the setup: its head is the base.
    git(home, "merge", "-q", "--ff-only", "temper/r1")
    again = Workspace.create(home, base=base, run_id="r2", root=tmp_path / "runs")
    assert setup_base(again, milestone, home, "r2") == base


def test_a_setup_patch_that_does_not_apply_is_refused_by_name(tmp_path: Path) -> None:
    home = checkout_copy(tmp_path / "checkout")
    milestone = load_spec("repair-data-order", home)
    loader = home / "engine/data/loader.py"  # the code the patch edits moved on since the patch was written
    loader.write_text(loader.read_text().replace('f"temper-data:{seed}:{epoch}"', 'f"temper-data/{seed}/{epoch}"'))
    git(home, "commit", "-q", "-am", "the data seed's text changed")
    ws = Workspace.create(home, base="HEAD", run_id="r1", root=tmp_path / "runs")
    with pytest.raises(UsageError, match=f"the setup patch {milestone.setup} does not apply"):
        setup_base(ws, milestone, home, "r1")
