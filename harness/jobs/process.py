"""The one process runner of the harness: jobs (harness.jobs.local), the agent's shell tool
(harness.tools.shell) and CLI agents (harness.agents.cli_agents) all start processes through it.

- The child leads a new session, so its process group id is its pid: a group signal reaches
  `sleep 100 &` and grandchildren, and Ctrl-C in the terminal reaches only the harness, which then
  stops the child itself.
- Output goes through pipes the harness owns, read by pump threads that hand each chunk, with its
  arrival time on the harness's monotonic clock (seconds since start), to sinks: `LineLog` (a log
  file plus `<log>.times`, one arrival time per line, and an optional per-line callback), `Lines`
  (decoded lines), or any object with write(chunk, t) / close(). stdout and stderr share one
  pipe unless a separate stderr sink is given.
- The process's *members* are its process group plus every descendant of the leader, even one in a
  session of its own (torchrun starts each worker with start_new_session, so the group alone would
  miss the workers), plus every process once seen as a member (same pid and start time) after it
  was orphaned. Members are looked up in /proc when signalling and at most every 0.5 s while
  polling.
- Stopping (timeout, cancel, leftovers): SIGTERM to every member, up to `grace_s` for them to be
  gone, then SIGKILL. After the leader exits by itself, members still alive are stopped the same
  way and reported (`leftovers`).
- The leader is not reaped until the group has been dealt with (waitid WNOWAIT): as an unreaped
  zombie it keeps its pid, the group id, from being reused by an unrelated process while we signal.
- `spare_depth=n` sends every signal but SIGKILL only to members n or more levels below the leader:
  the launcher's own processes are spared (bwrap, which dies of SIGTERM and then SIGKILLs the job
  through --die-with-parent, and its init: 2 levels; torchrun's agent, which dies of SIGTERM and
  fails a job whose workers checkpointed and exited 0: 1 more), and exit when their children do,
  with their children's status.

A process that leaves the group and is orphaned before the runner first sees it (a double-forked
daemon started between two looks) escapes; it is reported when it still holds the output pipe
(`pipe_held`). Inside the sandbox nothing escapes: the sandbox's pid namespace dies with bwrap.
"""

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = [
    "Process",
    "ProcessResult",
    "Sink",
    "LineLog",
    "Tee",
    "FileTail",
    "Lines",
    "group_members",
    "signal_name",
    "parse_signal",
]

_POLL_S = 0.05
_KILL_WAIT_S = 5.0  # after SIGKILL, how long the kernel may take to reap
_DRAIN_S = 5.0
_LOOK_S = 0.5  # while running, how often poll() looks up the members (to remember descendants)  # after the group is gone, how long the pumps may take to reach end of file


@dataclass(frozen=True)
class _Proc:
    ppid: int
    pgrp: int
    start: int  # start time in clock ticks since boot: with the pid, identifies the process
    live: bool  # not a zombie


def _proc_table() -> dict[int, _Proc]:
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as fh:
                stat = fh.read()
        except OSError:  # guard: allow fail-fast -- it exited while we looked: not a process any more
            continue
        # "pid (comm) state ppid pgrp session ... starttime(22nd)": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 19:
            table[int(entry.name)] = _Proc(ppid=int(fields[1]), pgrp=int(fields[2]), start=int(fields[19]),
                                           live=fields[0] not in ("Z", "X"))
    return table


def group_members(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in group `pgid`, read from /proc.

    A zombie cannot do anything, but it stays in its group until reaped, and orphans are reaped by
    pid 1, which in a container may never do it; so `killpg(pgid, 0)` alone would wait forever.
    """
    return [pid for pid, p in _proc_table().items() if p.pgrp == pgid and p.live]


def parse_signal(name: str | int) -> signal.Signals:
    """signal.SIGTERM for "SIGTERM", "TERM", "term" or 15."""
    if isinstance(name, int):
        return signal.Signals(name)
    text = name.strip().upper()
    try:
        return signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except KeyError:
        raise ValueError(f"{name!r} is not a signal name such as 'SIGTERM' or 'SIGKILL'") from None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# ---------------------------------------------------------------- sinks


class Sink(Protocol):
    """Where a pump delivers output: `write(chunk, t)` per chunk read (t: seconds since start on
    the harness's clock), `close()` once at end of file."""

    def write(self, chunk: bytes, t: float) -> None: ...

    def close(self) -> None: ...


class LineLog:
    """Append output to `path` (flushed per chunk: readable while the job runs, partial lines
    included) and, for each finished line, its arrival time to `times_path` (row i = line i).
    `on_line(line, number, t)` (number from 1) is called for each finished line; the last line
    without a newline is passed at close."""

    def __init__(self, path: Path, times_path: Path | None = None,
                 on_line: Callable[[bytes, int, float], None] | None = None):
        self.path = path
        self.times_path = times_path
        self._log: BinaryIO = open(path, "wb")
        self._times = open(times_path, "w") if times_path is not None else None
        self._on_line = on_line
        self._partial = b""
        self._count = 0
        self._last_t = 0.0

    def write(self, chunk: bytes, t: float) -> None:
        self._last_t = t
        self._log.write(chunk)
        self._log.flush()
        if lines := chunk.count(b"\n"):
            if self._times is not None:
                self._times.write(f"{t:.6f}\n" * lines)
                self._times.flush()
            if self._on_line is not None:
                *done, self._partial = (self._partial + chunk).split(b"\n")
                for line in done:
                    self._count += 1
                    self._on_line(line, self._count, t)
                return
            self._count += lines
        if self._on_line is not None:
            self._partial += chunk

    def close(self) -> None:
        self._log.close()
        if self._times is not None:
            self._times.close()
        if self._on_line is not None and self._partial:
            self._count += 1
            self._on_line(self._partial, self._count, self._last_t)
            self._partial = b""


class Lines:
    """Decoded lines (newline kept; the last one may lack it), optionally copied to a file as they come."""

    def __init__(self, path: Path | None = None):
        self.lines: list[str] = []
        self._partial = b""
        self._file: BinaryIO | None = open(path, "wb") if path is not None else None

    def write(self, chunk: bytes, t: float = 0.0) -> None:
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
        *done, self._partial = (self._partial + chunk).split(b"\n")
        self.lines.extend(line.decode("utf-8", errors="replace") + "\n" for line in done)

    def close(self) -> None:
        if self._partial:
            self.lines.append(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""
        if self._file is not None:
            self._file.close()


class Tee:
    """Deliver to several sinks."""

    def __init__(self, *sinks: Sink):
        self.sinks = sinks

    def write(self, chunk: bytes, t: float) -> None:
        for sink in self.sinks:
            sink.write(chunk, t)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class FileTail:
    """Follow a log that another process writes (slurmd for SLURM jobs) and stamp each new line with
    the harness's clock: row i of `times_path` = arrival time of line i, in seconds since `t0` (a
    time.monotonic() value), as seen by polling every `interval_s`; the resolution is that interval.
    A file that shrinks (rewritten from the start) is followed from its new start; `restarts` counts
    that. `on_line(text)` gets each finished line, decoded (a progress view)."""

    def __init__(self, path: Path, times_path: Path, *, t0: float, interval_s: float = 0.2,
                 on_line: Callable[[str], None] | None = None):
        self.path = path
        self.times_path = times_path
        self.t0 = t0
        self.interval_s = interval_s
        self.lines = 0
        self.restarts = 0
        self._on_line = on_line
        self._partial = b""
        self._offset = 0
        self._times = open(times_path, "w")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"tail-{path.name}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_new()

    def read_new(self) -> int:
        """Stamp the lines that arrived since the last look; returns how many."""
        with self._lock:
            if self._times.closed:
                return 0
            try:
                with open(self.path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size < self._offset:
                        self._offset, self.restarts, self._partial = 0, self.restarts + 1, b""
                    fh.seek(self._offset)
                    data = fh.read(size - self._offset)
            except FileNotFoundError:  # guard: allow fail-fast -- not created yet (the job is still queued)
                return 0
            t = time.monotonic() - self.t0
            self._offset += len(data)
            if n := data.count(b"\n"):
                self._times.write(f"{t:.6f}\n" * n)
                self._times.flush()
                self.lines += n
            if self._on_line is not None:
                *done, self._partial = (self._partial + data).split(b"\n")
                for line in done:
                    self._on_line(line.decode("utf-8", errors="replace"))
            return n

    def close(self) -> None:
        """Stop following, after one last look."""
        self._stop.set()
        self._thread.join(5.0)
        self.read_new()
        with self._lock:
            self._times.close()


# ---------------------------------------------------------------- the runner


@dataclass(frozen=True)
class ProcessResult:
    """How the process ended.

    returncode: Popen's convention, -N when signal N ended the leader; None when it survived SIGKILL.
    reason: "exited", "timeout" or "cancelled". leftovers: pids that were still in the group after
    the leader exited by itself (they were stopped). pipe_held: a process outside the group kept an
    output pipe open, so output after the end is lost. sent: signals sent by `send_signal`, with
    the time (seconds since start) they were sent.
    """

    returncode: int | None
    reason: str
    leftovers: tuple[int, ...]
    pipe_held: bool
    elapsed_s: float
    survived_kill: bool = False

    @property
    def timed_out(self) -> bool:
        return self.reason == "timeout"


class Process:
    """Start `argv` in its own session with its output pumped into `stdout` (and `stderr`, else
    merged into stdout). Non-blocking: `poll()` enforces the timeout; `wait()` blocks; `stop()`
    ends it. Thread-safe."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        stdout: Sink | None = None,
        stderr: Sink | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        grace_s: float = 10.0,
        spare_depth: int = 0,
    ):
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.spare_depth = spare_depth
        self.result: ProcessResult | None = None
        self._lock = threading.RLock()  # poll / stop / finish
        self._sig_lock = threading.Lock()  # signals vs reaping the leader (pump threads signal too)
        self._reaped = False
        self._seen: dict[int, int] = {}  # pid -> start time of every process seen as a member
        self._members_lock = threading.Lock()  # members() runs on pump threads too (kill_pattern)
        self._last_look = 0.0
        self._pumps: list[threading.Thread] = []
        self.t0 = time.monotonic()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe() if stderr is not None else (None, None)
        try:
            self._proc = subprocess.Popen(
                self.argv, cwd=cwd, env=dict(env) if env is not None else None,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out_w, stderr=err_w if err_w is not None else out_w, start_new_session=True,
            )
        except BaseException:
            for fd in (out_r, err_r):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w):  # the child holds its own copies; ours would keep the pipes open
                if fd is not None:
                    os.close(fd)
        self.pid = self._proc.pid
        self.pgid = self._proc.pid
        self._start_pump(out_r, stdout)
        if err_r is not None:
            self._start_pump(err_r, stderr)
        if stdin is not None:
            threading.Thread(target=self._feed, args=(stdin,), daemon=True, name=f"stdin-{self.pid}").start()

    def _feed(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.close()
        except (BrokenPipeError, OSError):  # guard: allow fail-fast -- the child exited without reading; its exit code tells why
            pass

    def _start_pump(self, fd: int, sink: Sink | None) -> None:
        def pump() -> None:
            try:
                while chunk := os.read(fd, 1 << 16):
                    if sink is not None:
                        sink.write(chunk, time.monotonic() - self.t0)
            finally:
                os.close(fd)
                if sink is not None:
                    sink.close()

        thread = threading.Thread(target=pump, daemon=True, name=f"pump-{self.pid}")
        thread.start()
        self._pumps.append(thread)

    # -- signals ---------------------------------------------------------------------------

    def members(self) -> dict[int, "_Proc"]:
        """The live members by pid (see the module docstring); remembers them."""
        with self._members_lock:
            return self._look()

    def _look(self) -> dict[int, "_Proc"]:
        table = _proc_table()
        keep = {pid for pid, p in table.items() if p.pgrp == self.pgid}
        keep |= {pid for pid, start in self._seen.items() if pid in table and table[pid].start == start}
        children: dict[int, list[int]] = {}
        for pid, p in table.items():
            children.setdefault(p.ppid, []).append(pid)
        todo = [self.pid, *keep]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in keep:
                    keep.add(child)
                    todo.append(child)
        self._seen.update((pid, table[pid].start) for pid in keep)
        self._last_look = time.monotonic()
        return {pid: table[pid] for pid in keep if table[pid].live}

    def send_signal(self, sig: int, *, spare_depth: int | None = None) -> None:
        """Signal the whole group; a no-op once the process has been reaped.

        spare_depth n > 0 signals every member but the first n levels of the process tree under the
        leader (1: the leader; 2: the leader and its children, ...), e.g. bwrap and torchrun's agent,
        which would die of SIGTERM instead of letting their children end as they choose. The default
        is the constructor's. SIGKILL always goes to every member."""
        depth = self.spare_depth if spare_depth is None else spare_depth
        with self._sig_lock:
            if self._reaped:
                return
            members = self.members()
            if depth > 0 and sig != signal.SIGKILL:
                parents = {pid: p.ppid for pid, p in members.items()}
                targets = [pid for pid in members if _depth(pid, self.pid, parents) >= depth]
            else:
                try:
                    os.killpg(self.pgid, sig)
                except ProcessLookupError:  # guard: allow fail-fast -- the group is already empty
                    pass
                targets = [pid for pid, p in members.items() if p.pgrp != self.pgid]  # e.g. torchrun's workers
            for pid in targets:
                _kill(pid, sig)

    def _leader_exited(self) -> bool:
        # WNOWAIT: learn that it exited without reaping it, so its pid (= the group id) stays reserved.
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def _stop_group(self) -> bool:
        """SIGTERM, up to grace_s for the group to empty, then SIGKILL; True if something survived SIGKILL."""
        self.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and self.members():
            time.sleep(_POLL_S)
        if not self.members():
            return False
        self.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT_S
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.02)
        return bool(self.members())

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def poll(self) -> ProcessResult | None:
        """The result once the process has ended (stopping it on timeout), else None."""
        with self._lock:
            if self.result is not None:
                return self.result
            if not self._leader_exited():
                if time.monotonic() - self._last_look > _LOOK_S:
                    self.members()  # remember descendants before they can be orphaned
                if self.timeout_s is not None and self.elapsed_s > self.timeout_s:
                    return self.stop("timeout")
                return None
            leftovers = tuple(sorted(self.members()))
            if leftovers:
                self._stop_group()
            return self._finish("exited", leftovers)

    def stop(self, reason: str = "cancelled") -> ProcessResult:
        """Stop the whole group (SIGTERM, grace, SIGKILL) and return the result; idempotent."""
        with self._lock:
            if self.result is not None:
                return self.result
            survived = self._stop_group()
            return self._finish(reason, (), survived=survived)

    def wait(self, timeout_s: float | None = None) -> ProcessResult | None:
        """Block until the process ends (or `timeout_s` passes: then None; the process runs on)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while (result := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(_POLL_S)
        return result

    def _finish(self, reason: str, leftovers: tuple[int, ...], survived: bool = False) -> ProcessResult:
        with self._sig_lock:
            try:
                code: int | None = self._proc.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): say so, do not hang
                code, survived = None, True
            self._reaped = code is not None
        elapsed = self.elapsed_s
        end = time.monotonic() + _DRAIN_S
        for pump in self._pumps:
            pump.join(max(0.0, end - time.monotonic()))
        held = any(p.is_alive() for p in self._pumps)
        self.result = ProcessResult(returncode=code, reason=reason, leftovers=leftovers, pipe_held=held,
                                    elapsed_s=elapsed, survived_kill=survived)
        return self.result


def _depth(pid: int, root: int, parents: dict[int, int]) -> int:
    """Levels between `pid` and `root` (0: pid is root); members whose chain does not reach the root
    (orphans) count as deep."""
    depth = 0
    while pid != root:
        if pid not in parents:
            return 1 << 30
        pid, depth = parents[pid], depth + 1
    return depth


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # guard: allow fail-fast -- it exited meanwhile
        pass
