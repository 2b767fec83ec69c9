"""A bounded shell for the agent: `bash -c` in the worktree, a deadline, and a kill that reaches every process
the command started (the harness's one process runner, harness.jobs.process: a new process group, SIGTERM then
SIGKILL to whatever is left in it, so `sleep 100 &` cannot outlive the call; a process that leaves the group is
bounded by the attempt's budget, or a `sandbox`'s pid namespace). Output is kept as a bounded head and tail
while it streams, so a command printing gigabytes cannot exhaust memory.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.jobs.process import Process, group_members as _group_members
from harness.jobs.sandbox import Sandbox

__all__ = ["ShellResult", "run_shell", "group_members"]


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
    """A process sink keeping the first and last limit // 2 bytes."""

    def __init__(self, limit: int):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, chunk: bytes, t: float = 0.0) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:  # trim in batches, not on every chunk
                del self.tail[: len(self.tail) - self.half]

    def close(self) -> None:
        pass

    def text(self) -> tuple[str, int]:
        tail = self.tail[-self.half :] if len(self.tail) > self.half else self.tail
        omitted = self.total - len(self.head) - len(tail)
        if omitted <= 0:
            return (bytes(self.head) + bytes(tail)).decode("utf-8", errors="replace"), 0
        head = bytes(self.head).decode("utf-8", errors="replace")
        return head + f"\n[... {omitted} bytes omitted ...]\n" + bytes(tail).decode("utf-8", errors="replace"), omitted


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) processes of a process group from /proc."""
    return _group_members(pgid)


def run_shell(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    output_limit: int,
    env: Mapping[str, str] | None = None,
    grace_s: float = 2.0,
    sandbox: Sandbox | None = None,
) -> ShellResult:
    """Run `bash -c command` in `cwd` (inside `sandbox` when given); kill its whole process group at
    the deadline."""
    sink = _HeadTail(output_limit)
    argv = ["bash", "-c", command]
    if sandbox is not None:
        argv = sandbox.wrap(argv, cwd=cwd)
    proc = Process(argv, cwd=cwd, env=env, stdout=sink, timeout_s=timeout_s, grace_s=grace_s,
                   spare_depth=2 if sandbox is not None else 0)  # bwrap and its init exit with bash
    res = proc.wait()
    assert res is not None
    output, omitted = sink.text()
    code = res.returncode if res.returncode is not None else -9
    if sandbox is not None and 128 < code < 128 + 65 and res.timed_out:
        code = -(code - 128)  # bwrap reports a command killed by signal N as 128 + N
    return ShellResult(
        exit_code=code,
        output=output,
        timed_out=res.timed_out,
        omitted_bytes=omitted,
        killed_leftovers=bool(res.leftovers),
        pipe_held=res.pipe_held,
        elapsed_s=res.elapsed_s,
    )
