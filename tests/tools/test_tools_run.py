"""The run tool: exit codes, merged output, head+tail truncation, and killing whole process groups."""

import os
import time
from pathlib import Path

from harness.tools import ToolContext
from harness.tools.shell import group_members, run_shell
from tests.tools.tools_helpers import call
from tests.proc_helpers import alive




def _wait_dead(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_exit_code_and_merged_output_in_order(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "run", command="echo out; echo err >&2; pwd; exit 7")
    assert not res.is_error
    lines = res.content.splitlines()
    assert lines[:3] == ["out", "err", str(tree)]
    assert lines[-1].startswith("[exit code 7;")


def test_environment_comes_from_the_context(tree: Path) -> None:
    ctx = ToolContext(root=tree, env={"PATH": os.defpath + ":/usr/bin:/bin", "ONLY_THIS": "yes"})
    res = call(ctx, "run", command="echo ${ONLY_THIS}-${HOME:-nohome}")
    assert res.content.startswith("yes-nohome")


def test_timeout_kills_the_process_group_including_grandchildren(ctx: ToolContext, tree: Path) -> None:
    # The shell starts a background sleep, and a subshell that starts another one (a grandchild).
    cmd = "sleep 100 & echo $! > bg.pid; (sleep 100 & echo $! > grand.pid; wait) & sleep 100"
    start = time.monotonic()
    res = call(ctx, "run", command=cmd, timeout_s=3)
    assert res.is_error and "timed out after 3 s" in res.content and "killed" in res.content
    assert time.monotonic() - start < 30  # generous: it returned, it did not wait 100 s
    for name in ("bg.pid", "grand.pid"):
        pid = int((tree / name).read_text())
        assert _wait_dead(pid), f"{name} {pid} survived the timeout"


def test_background_processes_do_not_outlive_a_finished_command(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "run", command="sleep 100 & echo $! > bg.pid; echo done")
    assert not res.is_error and res.content.startswith("done")
    assert "background processes" in res.content
    assert _wait_dead(int((tree / "bg.pid").read_text()))


def test_sigterm_ignoring_process_gets_sigkill(ctx: ToolContext, tree: Path) -> None:
    res = call(ctx, "run", command="trap '' TERM; echo $$ > me.pid; while true; do sleep 0.1; done", timeout_s=3)
    assert res.is_error and "timed out" in res.content
    assert _wait_dead(int((tree / "me.pid").read_text()))


def test_output_truncation_keeps_head_and_tail(tree: Path) -> None:
    res = run_shell("seq 1 200000", cwd=tree, timeout_s=60, output_limit=1000)
    total = sum(len(f"{i}\n") for i in range(1, 200001))
    assert res.exit_code == 0 and res.omitted_bytes == total - 1000
    assert res.output.startswith("1\n2\n3\n")
    assert res.output.rstrip().endswith("199999\n200000")
    assert f"[... {total - 1000} bytes omitted ...]" in res.output
    ctx = ToolContext(root=tree, output_limit=1000)
    text = call(ctx, "run", command="seq 1 200000").content
    assert "bytes omitted" in text and text.startswith("1\n") and "[exit code 0;" in text


def test_group_members_sees_a_running_group(tree: Path) -> None:
    members = group_members(os.getpgid(0))
    assert members is not None and os.getpid() in members


def test_timeout_is_capped_by_the_context(tree: Path) -> None:
    ctx = ToolContext(root=tree, max_shell_timeout_s=5)
    res = call(ctx, "run", command="echo hi", timeout_s=100)
    assert "lowered from 100 to the maximum of 5 s" in res.content and "hi" in res.content
