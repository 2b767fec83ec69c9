"""A bounded shell for the agent: `bash -c` in the worktree, a deadline, and a kill that reaches
every process the command started.

The command runs as the leader of a new session and process group. Whether it finishes or times
out, every process still in that group afterwards is sent SIGTERM, then SIGKILL after a grace
period, so `sleep 100 &` cannot outlive the tool call. The leader is not reaped until then: as an
unreaped zombie it keeps the group id from being reused by an unrelated process while we signal it.
A process that deliberately leaves the group (`setsid`, a daemon) escapes this; only the attempt's
wall-time budget and the job launcher bound those.

Output (stdout and stderr merged, in order) is kept as a head and a tail of bounded size while it
streams, so a command printing gigabytes cannot exhaust memory.
"""

import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.tools.text import omitted_marker

__all__ = ["ShellResult", "run_shell", "group_members"]

_POLL_S = 0.05


@dataclass(frozen=True)
class ShellResult:
    """exit_code is the shell's status, or -N when signal N ended it."""

    exit_code: int
    output: str
    timed_out: bool
    omitted_bytes: int
    killed_leftovers: bool  # background processes were still running after the command ended
    pipe_held: bool  # a process outside the group kept the output pipe open; later output is lost
    elapsed_s: float


class _HeadTail:
    def __init__(self, limit: int):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:  # trim in batches, not on every chunk
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> tuple[str, int]:
        tail = self.tail[-self.half :] if len(self.tail) > self.half else self.tail
        omitted = self.total - len(self.head) - len(tail)
        if omitted <= 0:
            return (bytes(self.head) + bytes(tail)).decode("utf-8", errors="replace"), 0
        head = bytes(self.head).decode("utf-8", errors="replace")
        return head + omitted_marker(omitted) + bytes(tail).decode("utf-8", errors="replace"), omitted


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes of a process group from /proc; None where /proc is missing."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # guard: allow fail-fast -- the process exited while we looked: not a member
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _leader_exited(pid: int) -> bool:
    # WNOWAIT: learn that it exited without reaping it, so its pid (= the group id) stays reserved.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # guard: allow fail-fast -- nobody left in the group: nothing to signal
        return


def run_shell(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    output_limit: int,
    env: Mapping[str, str] | None = None,
    grace_s: float = 2.0,
) -> ShellResult:
    """Run `bash -c command` in `cwd`; kill its whole process group at the deadline."""
    start = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(env) if env is not None else None,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sink = _HeadTail(output_limit)
    eof = False

    def pump(wait_s: float) -> None:
        nonlocal eof
        if eof:
            time.sleep(wait_s)
            return
        ready, _, _ = select.select([fd], [], [], wait_s)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                sink.add(chunk)
            else:
                eof = True

    deadline = start + timeout_s
    timed_out = False
    while not _leader_exited(proc.pid):
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        pump(min(_POLL_S, deadline - now))

    pgid = proc.pid
    members = group_members(pgid)
    killed_leftovers = not timed_out and bool(members)
    if timed_out or members or members is None:
        _signal_group(pgid, signal.SIGTERM)
        grace_end = time.monotonic() + grace_s
        while time.monotonic() < grace_end:
            members = group_members(pgid)
            if members == [] or (members is None and not timed_out):
                break
            pump(_POLL_S)
        if group_members(pgid) != []:
            _signal_group(pgid, signal.SIGKILL)
    exit_code = proc.wait()

    # Drain what is left; writers are gone unless one escaped the group with our pipe.
    drain_end = time.monotonic() + 1.0
    while not eof and time.monotonic() < drain_end:
        pump(_POLL_S)
    proc.stdout.close()
    output, omitted = sink.text()
    return ShellResult(
        exit_code=exit_code,
        output=output,
        timed_out=timed_out,
        omitted_bytes=omitted,
        killed_leftovers=killed_leftovers,
        pipe_held=not eof,
        elapsed_s=time.monotonic() - start,
    )
