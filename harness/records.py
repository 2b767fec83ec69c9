"""Run records: `runs/<run-id>/` holds everything a run did, written so that a crash loses nothing.

Layout:
    run.json                 summary (id, milestone + spec hash, agent, base commit, branch, worktree,
                             status, started / ended, totals); rewritten atomically after each change
    events.jsonl             append-only; one JSON object per line with seq, ts (UTC) and type
    attempts/<n>/diff.patch  the attempt's diff against the base commit
    attempts/<n>/verdict.json
    jobs/<job>/log           what the launcher captured (the engine's --run-dir is this folder too)

Why this shape (mini-swe-agent saves after every step; so do we, per event): every event is written
with one `write` to an O_APPEND file and fsynced before the call returns, so a SIGKILL or power cut
costs at most a partial last line. The reader tolerates and reports exactly that; anything else
corrupt is an error. events.jsonl is the source of truth: `RunRecord.open` rebuilds the conversation
and the totals from it (for `temper resume`) and rewrites run.json.

Secrets never reach disk: every string written under the run folder goes through `scrub`
(harness/scrub.py), and job logs are scrubbed in place when the job finishes.
"""

import json
import os
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.atomic import fsync_dir, write_atomic
from harness.protocol import AgentTurn, Message, ToolCall, ToolResult, Usage
from harness.scrub import REDACTED, scrub, scrub_file, scrub_text, without_secret_fields
from harness.verdict import GateResult, Verdict

__all__ = [
    "RecordError",
    "RunRecord",
    "RunSummary",
    "RunTotals",
    "EventsRead",
    "STATUSES",
    "FINAL_STATUSES",
    "EVENT_TYPES",
    "REDACTED",
    "scrub",
    "scrub_text",
    "scrub_file",
    "read_events",
    "list_runs",
    "new_run_id",
    "write_atomic",
    "utc_now",
]

SCHEMA = 1
STATUSES = ("running", "accepted", "rejected", "budget_exhausted", "error", "interrupted")
# A run in one of these ended for good; `resume` refuses it (start a new run instead).
FINAL_STATUSES = ("accepted", "rejected", "budget_exhausted")
EVENT_TYPES = (
    "run_started",
    "user_message",  # harness -> agent text (milestone prompt, gate feedback): needed to rebuild the conversation
    "llm_call",
    "tool_call",
    "tool_result",
    "gate_started",
    "gate_result",
    "job_started",
    "job_finished",
    "attempt",
    "run_finished",
    "workspace",  # where the run's worktree, repository and judge base are (resume reads it)
    "resumed",  # the run was reopened after a stop
    "note",  # free text for people; nothing reads it back
)
# Files in a job folder that may carry text (logs, metrics); checkpoints and binaries are left alone.
_TEXT_SUFFIXES = {".log", ".txt", ".out", ".err", ".json", ".jsonl", ".toml", ".yaml", ".yml", ".sh", ".sbatch"}


class RecordError(RuntimeError):
    """A run folder is missing, corrupt beyond a truncated last line, or used out of order."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- files


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@dataclass(frozen=True)
class EventsRead:
    """The events of a run, and the partial last line a crash left behind (None when clean)."""

    events: list[dict[str, Any]]
    truncated_tail: str | None = None
    good_bytes: int = 0  # length of the file up to the end of the last complete event


def read_events(path: str | Path) -> EventsRead:
    """Parse events.jsonl. One unreadable last line is reported (a crash mid-write); an unreadable line
    anywhere else, or a seq that does not increase, raises RecordError.

    The writer ends every event with its newline in the same write, so a last line without one is a
    cut-off write: it is reported as truncated even if what is there happens to parse.
    """
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    *complete, partial = data.split(b"\n")
    events: list[dict[str, Any]] = []
    offset = 0
    for i, raw in enumerate(complete):
        if raw.strip():
            try:
                event = json.loads(raw)
                if not isinstance(event, dict) or not isinstance(event.get("seq"), int) or "type" not in event:
                    raise ValueError("not an event object (needs seq and type)")
            except ValueError as err:
                if i == len(complete) - 1 and not partial:
                    return EventsRead(events, raw.decode("utf-8", errors="replace"), offset)
                raise RecordError(f"{path}:{i + 1}: corrupt event line before the last one: {err}") from None
            if events and event["seq"] <= events[-1]["seq"]:
                raise RecordError(f"{path}:{i + 1}: seq {event['seq']} does not follow {events[-1]['seq']}")
            events.append(event)
        offset += len(raw) + 1
    return EventsRead(events, partial.decode("utf-8", errors="replace") if partial else None, offset)


class _EventLog:
    """Appends events: one os.write per line on an O_APPEND descriptor, fsynced before returning."""

    def __init__(self, path: Path, next_seq: int):
        self.path = path
        self.next_seq = next_seq
        self._lock = threading.Lock()

    def append(self, type_: str, data: Mapping[str, Any]) -> dict[str, Any]:
        if type_ not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type_!r}; expected one of {EVENT_TYPES}")
        with self._lock:
            event = {"seq": self.next_seq, "ts": utc_now(), "type": type_, **scrub(dict(data))}
            line = (_dumps(event) + "\n").encode("utf-8")
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
                self.next_seq += 1  # the line is in the file: a Ctrl-C during the fsync must not reuse its seq
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_dir(self.path.parent)
            return event


# ---------------------------------------------------------------- state


@dataclass
class RunTotals:
    """Sums over the run. `usage.cost_usd` is None as soon as one call's price was unknown."""

    turns: int = 0
    tool_calls: int = 0
    attempts: int = 0
    usage: Usage = field(default_factory=lambda: Usage(cost_usd=0.0))

    @property
    def tokens(self) -> int:
        """Input + output tokens (what the budget's max_tokens counts); cache reads / writes are reported apart."""
        return self.usage.input_tokens + self.usage.output_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "attempts": self.attempts,
            "tokens": self.tokens,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "cache_read_tokens": self.usage.cache_read_tokens,
            "cache_write_tokens": self.usage.cache_write_tokens,
            "cost_usd": self.usage.cost_usd,
        }


@dataclass(frozen=True)
class RunSummary:
    """One row of `temper runs`. `problem` is set (and the rest best-effort) when run.json is unreadable."""

    id: str
    path: Path
    milestone_id: str = ""
    status: str = ""
    agent: str = ""
    started: str = ""
    ended: str | None = None
    turns: int = 0
    tokens: int = 0
    cost_usd: float | None = None
    attempts: int = 0
    verdict: str = ""  # the last judged attempt: "accepted (attempt 2)", "rejected at guards (attempt 1)"; "" if none
    problem: str = ""


def _verdict_label(verdict: Mapping[str, Any] | None) -> str:
    if not verdict:
        return ""
    if verdict.get("accepted"):
        return f"accepted (attempt {verdict.get('attempt')})"
    gate = verdict.get("failed_gate")
    return f"rejected{f' at {gate}' if gate else ''} (attempt {verdict.get('attempt')})"


def new_run_id(milestone_id: str) -> str:
    """Sortable and unique: 20250101-120000-demo-tiny-3fa9c1."""
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{milestone_id}-{secrets.token_hex(3)}"


def _agent_label(agent: Mapping[str, Any]) -> str:
    backend, model = str(agent.get("backend", "")), str(agent.get("model", ""))
    return ":".join(p for p in (backend, model) if p) or "unknown"


def _runs_root(runs_root: str | Path | None) -> Path:
    if runs_root is not None:
        return Path(runs_root)
    from harness.settings import runs_dir

    return runs_dir()


class RunRecord:
    """The record of one run. Build with `create` (new run) or `open` (resume); every method that
    records something returns only after it is on disk."""

    def __init__(self, directory: Path, meta: dict[str, Any], log: _EventLog):
        self.dir = directory
        self._meta = meta
        self._log = log
        self.totals = RunTotals()
        self.conversation: list[Message] = []
        self.system_prompt = ""
        self.truncated_tail: str | None = None  # set by open() when a crash left a partial line
        self._pending_results: list[ToolResult] = []

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def create(
        cls,
        *,
        milestone_id: str,
        spec_hash: str,
        agent: Mapping[str, Any],
        base_commit: str,
        branch: str,
        worktree: str | Path,
        system_prompt: str = "",
        milestone_path: str | Path = "",
        run_id: str | None = None,
        runs_root: str | Path | None = None,
    ) -> "RunRecord":
        """Make runs/<run-id>/ (never reusing a folder), write run.json and the run_started event.

        `agent` describes the backend (backend, model, base_url, limits); fields named like keys or
        tokens are dropped and every value is scrubbed.
        """
        run_id = run_id or new_run_id(milestone_id)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run_id):
            raise ValueError(f"run id {run_id!r} must be letters, digits, '.', '_' and '-'")
        directory = _runs_root(runs_root) / run_id
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir()
        except FileExistsError:
            raise RecordError(f"run folder {directory} already exists; pick another run id") from None
        agent_spec = scrub(without_secret_fields(agent))
        meta = {
            "schema": SCHEMA,
            "id": run_id,
            "milestone": {"id": milestone_id, "spec_hash": spec_hash, "path": str(milestone_path)},
            "agent": agent_spec,
            "base_commit": base_commit,
            "branch": branch,
            "worktree": str(worktree),
            "status": "running",
            "started": utc_now(),
            "ended": None,
            "reason": "",
            "totals": RunTotals().to_json(),
            "verdict": None,
        }
        record = cls(directory, meta, _EventLog(directory / "events.jsonl", 0))
        record.system_prompt = system_prompt
        record._write_meta()
        record._log.append("run_started", {
            "run_id": run_id, "milestone": meta["milestone"], "agent": agent_spec, "base_commit": base_commit,
            "branch": branch, "worktree": str(worktree), "system_prompt": system_prompt,
        })
        return record

    @classmethod
    def open(cls, run: str | Path, runs_root: str | Path | None = None) -> "RunRecord":
        """Reopen a run to continue it: rebuild conversation and totals from events.jsonl.

        A partial last line (a crash mid-write) is cut off the file and reported in a `note` event and
        in `truncated_tail`; run.json is rewritten from what the events say.
        """
        directory = Path(run) if Path(run).is_dir() else _runs_root(runs_root) / str(run)
        meta_file = directory / "run.json"
        if not meta_file.is_file():
            raise RecordError(f"no run at {directory} (run.json missing)")
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except ValueError as err:
            raise RecordError(f"{meta_file}: unreadable ({err})") from None
        events_file = directory / "events.jsonl"
        read = read_events(events_file)
        if read.truncated_tail is not None:
            with events_file.open("r+b") as fh:
                fh.truncate(read.good_bytes)
                fh.flush()
                os.fsync(fh.fileno())
        next_seq = read.events[-1]["seq"] + 1 if read.events else 0
        record = cls(directory, meta, _EventLog(events_file, next_seq))
        for event in read.events:
            record._apply(event)
        record._flush_results()
        if read.truncated_tail is not None:
            record.truncated_tail = read.truncated_tail
            record.note("dropped a truncated final event line left by a crash",
                        bytes=len(read.truncated_tail.encode("utf-8")), head=read.truncated_tail[:200])
        record._meta["totals"] = record.totals.to_json()
        record._write_meta()
        return record

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "run_started":
            self.system_prompt = event.get("system_prompt", "")
        elif kind == "user_message":
            self._flush_results()
            self.conversation.append(Message(role="user", text=event["text"]))
        elif kind == "llm_call":
            self._flush_results()
            turn = AgentTurn.from_json(event["turn"])
            self.conversation.append(Message(role="assistant", turn=turn))
            self.totals.turns += 1
            self.totals.usage = self.totals.usage + turn.usage
        elif kind == "tool_call":
            self.totals.tool_calls += 1
        elif kind == "tool_result":
            self._pending_results.append(ToolResult(**event["result"]))
        elif kind == "attempt":
            self.totals.attempts = max(self.totals.attempts, int(event["attempt"]))
        elif kind == "run_finished":
            self._meta["status"] = event["status"]
            self._meta["ended"] = event["ts"]

    def _flush_results(self) -> None:
        if self._pending_results:
            self.conversation.append(Message(role="tool", results=tuple(self._pending_results)))
            self._pending_results = []

    def _write_meta(self) -> None:
        write_atomic(self.dir / "run.json", json.dumps(scrub(self._meta), indent=2, ensure_ascii=False) + "\n")

    # ------------------------------------------------------------ properties

    @property
    def id(self) -> str:
        return self._meta["id"]

    @property
    def status(self) -> str:
        return self._meta["status"]

    @property
    def meta(self) -> dict[str, Any]:
        """A copy of what run.json holds."""
        return json.loads(json.dumps(self._meta))

    def messages(self) -> list[Message]:
        """The conversation so far, tool results of the last turn included."""
        return self.conversation + ([Message(role="tool", results=tuple(self._pending_results))] if self._pending_results else [])

    def job_dir(self, name: str) -> Path:
        """runs/<id>/jobs/<name>/, created: the launcher writes `log` here, the engine its --run-dir."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
            raise ValueError(f"job name {name!r} must match [a-z0-9][a-z0-9_-]*")
        path = self.dir / "jobs" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def attempt_dir(self, n: int) -> Path:
        return self.dir / "attempts" / str(n)

    # ------------------------------------------------------------ events

    def user_message(self, text: str) -> dict[str, Any]:
        """Text the harness sends the agent (the milestone prompt, gate feedback)."""
        self._flush_results()
        event = self._log.append("user_message", {"text": text})
        self.conversation.append(Message(role="user", text=event["text"]))
        return event

    def llm_call(self, turn: AgentTurn, duration_s: float | None = None) -> dict[str, Any]:
        self._flush_results()
        u = turn.usage
        event = self._log.append("llm_call", {
            "model": turn.model, "stop_reason": turn.stop_reason,
            "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_read_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens,
            "cost_usd": u.cost_usd, "duration_s": duration_s, "turn": turn.to_json(),
        })
        # Keep in memory what is on disk (scrubbed), so a resumed conversation equals a live one.
        self.conversation.append(Message(role="assistant", turn=AgentTurn.from_json(event["turn"])))
        self.totals.turns += 1
        self.totals.usage = self.totals.usage + u
        self._save_totals()
        return event

    def tool_call(self, call: ToolCall) -> dict[str, Any]:
        event = self._log.append("tool_call", {"call": {
            "id": call.id, "name": call.name, "arguments": call.arguments,
            "raw_arguments": call.raw_arguments, "parse_error": call.parse_error,
        }})
        self.totals.tool_calls += 1
        self._save_totals()
        return event

    def tool_result(self, result: ToolResult, duration_s: float | None = None) -> dict[str, Any]:
        event = self._log.append("tool_result", {"result": {
            "call_id": result.call_id, "content": result.content, "is_error": result.is_error, "submitted": result.submitted,
        }, "duration_s": duration_s})
        self._pending_results.append(ToolResult(**event["result"]))
        return event

    def gate_started(self, attempt: int, gate: str, kind: str) -> dict[str, Any]:
        return self._log.append("gate_started", {"attempt": attempt, "gate": gate, "kind": kind})

    def gate_result(self, attempt: int, result: GateResult) -> dict[str, Any]:
        return self._log.append("gate_result", {"attempt": attempt, "result": result.to_json()})

    def job_started(self, name: str, argv: list[str], *, attempt: int, launcher: str = "local",
                    job_id: str = "", log: str | Path | None = None) -> dict[str, Any]:
        return self._log.append("job_started", {
            "attempt": attempt, "job": name, "argv": list(argv), "launcher": launcher, "job_id": job_id,
            "log": self._rel(log) if log else "",
        })

    def job_finished(self, name: str, *, attempt: int, exit_code: int | None, duration_s: float,
                     timed_out: bool = False, summary: str = "") -> dict[str, Any]:
        """Scrub the job's text files (the launched processes wrote them, not us), then record the event."""
        scrubbed = []
        job_dir = self.dir / "jobs" / name
        if job_dir.is_dir():
            for file in sorted(job_dir.rglob("*")):
                if file.is_file() and (file.suffix in _TEXT_SUFFIXES or file.name == "log") and scrub_file(file):
                    scrubbed.append(self._rel(file))
        return self._log.append("job_finished", {
            "attempt": attempt, "job": name, "exit_code": exit_code, "duration_s": duration_s,
            "timed_out": timed_out, "summary": summary, "scrubbed": scrubbed,
        })

    def attempt(self, verdict: Verdict, diff: str) -> Path:
        """Write attempts/<n>/diff.patch and verdict.json, then the `attempt` event. Returns the folder."""
        folder = self.attempt_dir(verdict.attempt)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "diff.patch", scrub_text(diff))
        write_atomic(folder / "verdict.json", json.dumps(scrub(verdict.to_json()), indent=2, ensure_ascii=False) + "\n")
        failed = verdict.failed_gate
        self._log.append("attempt", {
            "attempt": verdict.attempt, "accepted": verdict.accepted, "commit": verdict.commit,
            "failed_gate": failed.name if failed else None, "reason": verdict.reason,
            "diff": self._rel(folder / "diff.patch"), "verdict": self._rel(folder / "verdict.json"),
            "flags": list(verdict.flags),
        })
        self.totals.attempts = max(self.totals.attempts, verdict.attempt)
        self._meta["verdict"] = {"attempt": verdict.attempt, "accepted": verdict.accepted,
                                 "failed_gate": failed.name if failed else None, "commit": verdict.commit}
        self._save_totals()
        return folder

    def workspace_ready(self, **data: Any) -> dict[str, Any]:
        """The typed event `temper resume` rebuilds a run from: repository, judge base, budget, options."""
        return self._log.append("workspace", data)

    def note(self, text: str, **data: Any) -> dict[str, Any]:
        return self._log.append("note", {"text": text, **data})

    def finish(self, status: str, reason: str = "") -> dict[str, Any]:
        """End the run: accepted | rejected | budget_exhausted | error | interrupted."""
        if status not in STATUSES or status == "running":
            raise ValueError(f"finish status {status!r} must be one of {STATUSES[1:]}")
        self._flush_results()
        event = self._log.append("run_finished", {"status": status, "reason": reason, "totals": self.totals.to_json()})
        self._meta.update(status=status, ended=event["ts"], reason=scrub_text(reason))
        self._save_totals()
        return event

    def resume(self) -> dict[str, Any]:
        """Mark a reopened run as running again (after a crash, an interrupt or an error)."""
        if self.status in FINAL_STATUSES:
            raise RecordError(f"run {self.id} already ended as {self.status}; start a new run instead")
        previous = self.status
        event = self._log.append("resumed", {"previous_status": previous})
        self._meta.update(status="running", ended=None, reason="")
        self._write_meta()
        return event

    def _save_totals(self) -> None:
        self._meta["totals"] = self.totals.to_json()
        self._write_meta()

    def _rel(self, path: str | Path) -> str:
        path = Path(path)
        return str(path.relative_to(self.dir)) if path.is_absolute() and path.is_relative_to(self.dir) else str(path)


def list_runs(runs_root: str | Path | None = None) -> list[RunSummary]:
    """Every run folder under the runs directory, oldest first (`temper runs`)."""
    root = _runs_root(runs_root)
    if not root.is_dir():
        return []
    out = []
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta_file = directory / "run.json"
        if not meta_file.is_file():
            out.append(RunSummary(id=directory.name, path=directory, problem="no run.json"))
            continue
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            totals = meta["totals"]
            out.append(RunSummary(
                id=meta["id"], path=directory, milestone_id=meta["milestone"]["id"], status=meta["status"],
                agent=_agent_label(meta.get("agent", {})), started=meta["started"], ended=meta.get("ended"),
                turns=totals["turns"], tokens=totals["tokens"], cost_usd=totals["cost_usd"], attempts=totals["attempts"],
                verdict=_verdict_label(meta.get("verdict")),
            ))
        except (ValueError, KeyError, TypeError) as err:
            out.append(RunSummary(id=directory.name, path=directory, problem=f"run.json unreadable: {type(err).__name__}: {err}"))
    return sorted(out, key=lambda s: (s.started, s.id))
