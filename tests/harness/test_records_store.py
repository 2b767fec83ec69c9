"""Run records: layout, crash safety under SIGKILL, rebuild for resume, listing, and no secret on disk."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.protocol import AgentTurn, Message, ToolCall, ToolResult, Usage
from harness.records import (
    REDACTED,
    RecordError,
    RunRecord,
    list_runs,
    read_events,
    scrub,
    scrub_text,
)
from harness.report import write_report
from harness.verdict import GateResult, Verdict

REPO = Path(__file__).resolve().parents[2]
FAKE_ANTHROPIC = "sk-ant-api03-FAKEfakeFAKEfake0123456789abcdefXYZ_-AA"
FAKE_OPENAI = "sk-proj-FAKEopenaiKEY0123456789abcdefghij"
# A key that is not in the environment and has no provider prefix: only the literal env match finds it.
FAKE_PLAIN = "plainsecretvalue-7f3a9c2e41"


def new_record(root: Path, **overrides) -> RunRecord:
    args = dict(
        milestone_id="demo-tiny", spec_hash="ab" * 32, agent={"backend": "anthropic", "model": "claude-x", "max_output_tokens": 8000},
        base_commit="c0ffee" * 6 + "abcd", branch="temper/demo-tiny/r1", worktree=root / "wt", system_prompt="You are ...",
        milestone_path="milestones/demo-tiny.toml", runs_root=root / "runs",
    )
    args.update(overrides)
    return RunRecord.create(**args)


def turn(text: str, calls=(), cost: float | None = 0.01, inp=1000, out=200, cread=0, cwrite=0) -> AgentTurn:
    return AgentTurn(
        text=text, tool_calls=tuple(calls), stop_reason="tool_use" if calls else "end_turn",
        usage=Usage(input_tokens=inp, output_tokens=out, cache_read_tokens=cread, cache_write_tokens=cwrite, cost_usd=cost),
        model="claude-x",
    )


def verdict(n: int, accepted: bool) -> Verdict:
    gates = (GateResult("protected", "protected", True, "unchanged"),
             GateResult("pytest", "pytest", accepted, "4 passed" if accepted else "2 failed",
                        failing_tests=() if accepted else ("tests/milestones/test_demo_tiny.py::test_x",)))
    return Verdict(attempt=n, accepted=accepted, gates=gates, commit=f"{n:040x}", reason="" if accepted else "gate pytest failed")


def play_session(record: RunRecord) -> list[Message]:
    """A realistic two-attempt session; returns the conversation as the agent loop would hold it."""
    expected: list[Message] = []
    record.user_message("# Milestone demo-tiny ...")
    expected.append(Message(role="user", text="# Milestone demo-tiny ..."))
    calls = [ToolCall("c1", "read", {"path": "engine/config.py"}), ToolCall("c2", "search", {"pattern": "LR_SCHEDULES"})]
    t1 = turn("Let me look.", calls, cread=500, cwrite=100)
    record.llm_call(t1, duration_s=1.5)
    expected.append(Message(role="assistant", turn=t1))
    results = (ToolResult("c1", "LR_SCHEDULES = (...)"), ToolResult("c2", "engine/config.py:33", is_error=False))
    for call, result in zip(calls, results):
        record.tool_call(call)
        record.tool_result(result, duration_s=0.01)
    expected.append(Message(role="tool", results=results))
    t2 = turn("Submitting.", [ToolCall("c3", "submit", {"summary": "added"})])
    record.llm_call(t2)
    expected.append(Message(role="assistant", turn=t2))
    record.tool_call(t2.tool_calls[0])
    record.tool_result(ToolResult("c3", "submitted", submitted=True))
    expected.append(Message(role="tool", results=(ToolResult("c3", "submitted", submitted=True),)))
    record.gate_started(1, "pytest", "pytest")
    record.gate_result(1, verdict(1, False).gates[1])
    record.attempt(verdict(1, False), "diff --git a/engine/x.py b/engine/x.py\n")
    record.user_message("Attempt 1 was rejected ...")
    expected.append(Message(role="user", text="Attempt 1 was rejected ..."))
    t3 = turn("Fixed.", [], cost=None)  # a backend without a price: cost becomes unknown
    record.llm_call(t3)
    expected.append(Message(role="assistant", turn=t3))
    return expected


# ---------------------------------------------------------------- layout


def test_create_writes_run_json_and_run_started(tmp_path):
    record = new_record(tmp_path, agent={"backend": "openai", "model": "gpt-x", "api_key": "should-not-be-stored-123", "base_url": "http://127.0.0.1:9"})
    meta = json.loads((record.dir / "run.json").read_text())
    assert record.dir.parent == tmp_path / "runs" and record.dir.name == record.id
    assert record.id.endswith(tuple("0123456789abcdef")) and "-demo-tiny-" in record.id
    assert meta["status"] == "running" and meta["ended"] is None
    assert meta["milestone"] == {"id": "demo-tiny", "spec_hash": "ab" * 32, "path": "milestones/demo-tiny.toml"}
    assert meta["agent"] == {"backend": "openai", "model": "gpt-x", "base_url": "http://127.0.0.1:9"}
    assert meta["totals"] == {"turns": 0, "tool_calls": 0, "attempts": 0, "tokens": 0, "input_tokens": 0, "output_tokens": 0,
                              "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": 0.0}
    events = read_events(record.dir / "events.jsonl").events
    assert [e["type"] for e in events] == ["run_started"] and events[0]["seq"] == 0
    assert events[0]["ts"].endswith("Z") and events[0]["system_prompt"] == "You are ..."
    assert "should-not-be-stored" not in (record.dir / "events.jsonl").read_text()
    with pytest.raises(RecordError, match="already exists"):
        new_record(tmp_path, run_id=record.id)


def test_events_attempt_files_and_totals(tmp_path):
    record = new_record(tmp_path)
    play_session(record)
    events = read_events(record.dir / "events.jsonl").events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "run_started", "user_message", "llm_call", "tool_call", "tool_result", "tool_call", "tool_result", "llm_call",
        "tool_call", "tool_result", "gate_started", "gate_result", "attempt", "user_message", "llm_call",
    ]
    llm = events[2]
    assert (llm["input_tokens"], llm["output_tokens"], llm["cache_read_tokens"], llm["cache_write_tokens"], llm["cost_usd"]) == (1000, 200, 500, 100, 0.01)
    assert AgentTurn.from_json(llm["turn"]).tool_calls[0].arguments == {"path": "engine/config.py"}
    attempt = events[12]
    assert attempt["diff"] == "attempts/1/diff.patch" and attempt["failed_gate"] == "pytest" and attempt["accepted"] is False
    assert (record.dir / "attempts/1/diff.patch").read_text() == "diff --git a/engine/x.py b/engine/x.py\n"
    assert Verdict.from_json(json.loads((record.dir / "attempts/1/verdict.json").read_text())) == verdict(1, False)
    totals = json.loads((record.dir / "run.json").read_text())["totals"]
    # Independent sums of what play_session sent: 3 calls of 1000 in / 200 out, one with 500/100 cache.
    assert totals == {"turns": 3, "tool_calls": 3, "attempts": 1, "tokens": 3600, "input_tokens": 3000, "output_tokens": 600,
                      "cache_read_tokens": 500, "cache_write_tokens": 100, "cost_usd": None}
    record.finish("rejected", reason="no attempts left")
    meta = json.loads((record.dir / "run.json").read_text())
    assert meta["status"] == "rejected" and meta["ended"] and meta["reason"] == "no attempts left"
    assert meta["verdict"] == {"attempt": 1, "accepted": False, "failed_gate": "pytest", "commit": f"{1:040x}"}
    assert not [p for p in record.dir.rglob("*") if ".tmp-" in p.name]  # atomic writes leave no temp files
    with pytest.raises(ValueError, match="finish status 'running'"):
        record.finish("running")
    with pytest.raises(ValueError, match="unknown event type"):
        record._log.append("bogus", {})


def test_open_rebuilds_conversation_and_totals_and_continues_seq(tmp_path):
    record = new_record(tmp_path)
    expected = play_session(record)
    assert record.messages() == expected
    again = RunRecord.open(record.id, runs_root=tmp_path / "runs")
    assert again.messages() == expected
    assert again.system_prompt == "You are ..."
    assert again.totals.to_json() == record.totals.to_json()
    assert again.totals.usage.cost_usd is None and again.totals.turns == 3 and again.totals.attempts == 1
    again.resume()
    again.note("after resume")
    events = read_events(record.dir / "events.jsonl").events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert events[-2]["type"] == "resumed" and events[-2]["previous_status"] == "running"
    again.finish("accepted")
    with pytest.raises(RecordError, match="already ended as accepted"):
        RunRecord.open(record.dir).resume()


def test_ctrl_c_during_the_fsync_does_not_reuse_a_seq(tmp_path, monkeypatch):
    """Ctrl-C while an event's line is being fsynced (the `temper demo` interrupt test hit this under load): the line
    is in the file, so the event that records the interruption takes the next seq and the file stays readable."""
    record = new_record(tmp_path)
    real_fsync = os.fsync

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        record.gate_started(1, "guards", "guards")
    monkeypatch.setattr(os, "fsync", real_fsync)
    record.finish("interrupted", "interrupted")
    events = read_events(record.dir / "events.jsonl").events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[-2:]] == ["gate_started", "run_finished"]


def test_pending_tool_results_survive_reopen(tmp_path):
    record = new_record(tmp_path)
    t = turn("reading", [ToolCall("a", "read", {"path": "x"})])
    record.llm_call(t)
    record.tool_call(t.tool_calls[0])
    record.tool_result(ToolResult("a", "content"))
    # The process dies here, before the next model call.
    reopened = RunRecord.open(record.dir)
    assert reopened.messages() == [Message(role="assistant", turn=t), Message(role="tool", results=(ToolResult("a", "content"),))]


# ---------------------------------------------------------------- crash safety

CHILD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from harness.protocol import AgentTurn, ToolResult, Usage
    from harness.records import RunRecord
    record = RunRecord.create(milestone_id="demo-tiny", spec_hash="0" * 64, agent={{"backend": "replay"}}, base_commit="0" * 40,
                              branch="b", worktree="/w", runs_root=Path(sys.argv[1]), run_id="crash")
    print(0, flush=True)
    for i in range(1, 100000):
        event = record.tool_result(ToolResult(f"c{{i}}", "x" * (i % 300)))
        print(event["seq"], flush=True)  # printed only after the call returned
        if {mid_write} and i == 25:
            fd = os.open(record.dir / "events.jsonl", os.O_WRONLY | os.O_APPEND)
            os.write(fd, b'{{"seq": 26, "ts": "2025-01-01T00:00:00Z", "type": "tool_res')  # half an event
            os.kill(os.getpid(), 9)
""")


def run_child(tmp_path: Path, mid_write: bool) -> tuple[list[int], Path]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(mid_write=mid_write), str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    returned = []
    for line in proc.stdout:
        returned.append(int(line))
        if not mid_write and len(returned) == 40:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return returned, tmp_path / "crash"


def test_sigkill_loses_no_returned_event(tmp_path):
    returned, run = run_child(tmp_path, mid_write=False)
    read = read_events(run / "events.jsonl")
    seqs = [e["seq"] for e in read.events]
    assert seqs[: len(returned)] == returned  # every event whose call returned is there, in order
    assert seqs == list(range(len(seqs)))
    RunRecord.open(run)  # and the run reopens


def test_partial_last_line_is_reported_cut_and_noted(tmp_path):
    returned, run = run_child(tmp_path, mid_write=True)
    assert returned[-1] == 25
    read = read_events(run / "events.jsonl")
    assert [e["seq"] for e in read.events] == list(range(26))
    assert read.truncated_tail is not None and read.truncated_tail.startswith('{"seq": 26')
    record = RunRecord.open(run)
    assert record.truncated_tail == read.truncated_tail
    clean = read_events(run / "events.jsonl")
    assert clean.truncated_tail is None
    assert clean.events[-1]["type"] == "note" and clean.events[-1]["seq"] == 26 and clean.events[-1]["bytes"] == len(read.truncated_tail)
    assert len(record.messages()[-1].results) == 25


def test_corruption_before_the_last_line_is_an_error(tmp_path):
    record = new_record(tmp_path)
    record.note("one")
    record.note("two")
    path = record.dir / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "not json\n" + "".join(lines[2:]))
    with pytest.raises(RecordError, match=r"events.jsonl:2: corrupt event line before the last one"):
        read_events(path)
    path.write_text(lines[0] + lines[2] + lines[1])
    with pytest.raises(RecordError, match="seq 1 does not follow 2"):
        read_events(path)
    # A garbled final line that does end in a newline is the tolerated kind too.
    path.write_text("".join(lines[:2]) + "\x00\x00garbage\n")
    assert read_events(path).truncated_tail == "\x00\x00garbage"


# ---------------------------------------------------------------- listing


def test_list_runs_reports_each_run_and_unreadable_ones(tmp_path):
    first = new_record(tmp_path, run_id="20250101-000000-demo-tiny-aaaaaa")
    play_session(first)
    first.finish("rejected")
    second = new_record(tmp_path, run_id="20250102-000000-demo-tiny-bbbbbb", agent={"backend": "openai", "model": "gpt-x"})
    second.finish("interrupted")
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "run.json").write_text("{")
    (tmp_path / "runs" / "README.md").write_text("not a run")
    runs = {r.id: r for r in list_runs(tmp_path / "runs")}
    assert set(runs) == {first.id, second.id, "broken"}
    assert (runs[first.id].status, runs[first.id].turns, runs[first.id].tokens, runs[first.id].attempts) == ("rejected", 3, 3600, 1)
    assert runs[first.id].cost_usd is None and runs[first.id].agent == "anthropic:claude-x"
    assert runs[second.id].status == "interrupted" and runs[second.id].cost_usd == 0.0 and runs[second.id].agent == "openai:gpt-x"
    assert runs["broken"].problem.startswith("run.json unreadable")
    assert list_runs(tmp_path / "nowhere") == []


def test_runs_dir_comes_from_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPER_RUNS_DIR", str(tmp_path / "elsewhere"))
    record = RunRecord.create(milestone_id="demo-tiny", spec_hash="0" * 64, agent={}, base_commit="0" * 40, branch="b", worktree="/w")
    assert record.dir.parent == tmp_path / "elsewhere"
    assert [r.id for r in list_runs()] == [record.id]
    assert RunRecord.open(record.id).id == record.id


# ---------------------------------------------------------------- secrets


def test_scrub_shapes_and_literals(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_PLAIN)
    monkeypatch.setenv("OPENAI_API_KEY", "short")  # too short to replace literally; shape rules still apply
    text = f"a {FAKE_ANTHROPIC} b {FAKE_OPENAI} c {FAKE_PLAIN} d Authorization: Bearer abcdefghijklmnop1234 e"
    assert scrub_text(text) == f"a {REDACTED} b {REDACTED} c {REDACTED} d Authorization: Bearer {REDACTED} e"
    # Not keys: short sk- words and words that merely contain "sk-".
    for keep in ("task-runner-with-long-name-0123456789", "sk-short", "disk-usage-report-2025-01-01-000000", "short"):
        assert scrub_text(keep) == keep
    assert scrub({"k": [FAKE_PLAIN, 1, 2.5, float("nan"), None, True], FAKE_OPENAI: "v"}) == {
        "k": [REDACTED, 1, 2.5, "nan", None, True], REDACTED: "v"}


def test_api_keys_never_reach_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_PLAIN)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_OPENAI)
    secrets_ = (FAKE_PLAIN, FAKE_OPENAI, FAKE_ANTHROPIC)
    record = new_record(tmp_path, agent={"backend": "anthropic", "model": "m", "api_key": FAKE_PLAIN,
                                         "headers": {"x-api-key": FAKE_PLAIN, "note": f"key {FAKE_OPENAI}"}},
                        system_prompt=f"never say {FAKE_PLAIN}", worktree=f"/tmp/{FAKE_PLAIN}")
    record.user_message(f"env says {FAKE_PLAIN}")
    call = ToolCall("c1", "shell", {"cmd": f"echo {FAKE_OPENAI}"}, raw_arguments=json.dumps({"cmd": f"echo {FAKE_OPENAI}"}))
    record.llm_call(turn(f"I found {FAKE_ANTHROPIC}", [call]))
    record.tool_call(call)
    record.tool_result(ToolResult("c1", f"{FAKE_OPENAI}\nANTHROPIC_API_KEY={FAKE_PLAIN}\n{FAKE_ANTHROPIC}"))
    job_dir = record.job_dir("train")
    record.job_started("train", ["pretrain", "--note", FAKE_PLAIN], attempt=1, log=job_dir / "log")
    # The job writes its own log and metrics (a real process, as the launcher's would).
    subprocess.run([sys.executable, "-c", "import os,sys; print('[LOSS] step=1 key=' + os.environ['ANTHROPIC_API_KEY']); "
                    "open(sys.argv[1], 'w').write('{\"k\": \"' + os.environ['OPENAI_API_KEY'] + '\"}\\n')", str(job_dir / "metrics.jsonl")],
                   stdout=(job_dir / "log").open("w"), check=True)
    (job_dir / "checkpoint.bin").write_bytes(b"\x00\x01binary")  # not text: left alone
    record.job_finished("train", attempt=1, exit_code=0, duration_s=1.0, summary=f"ok {FAKE_PLAIN}")
    v = Verdict(attempt=1, accepted=False, gates=(GateResult("train", "job", False, f"log mentions {FAKE_PLAIN}",
                                                             log_tail=f"... {FAKE_OPENAI} ...", violations=(FAKE_ANTHROPIC,)),),
                reason=f"x {FAKE_OPENAI}")
    record.gate_result(1, v.gates[0])
    record.attempt(v, f"+API_KEY = '{FAKE_ANTHROPIC}'\n+other = '{FAKE_PLAIN}'\n")
    record.note(f"note {FAKE_PLAIN}", extra={"deep": [FAKE_OPENAI]})
    record.finish("error", reason=f"crashed with {FAKE_OPENAI}")
    RunRecord.open(record.dir)  # rewrites run.json from events: still clean
    write_report(record.dir)  # and the report, built from all of it

    files = [p for p in record.dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"run.json", "events.jsonl", "diff.patch", "verdict.json", "log", "metrics.jsonl", "report.html"}
    for path in files:
        data = path.read_bytes()
        for secret in secrets_:
            assert secret.encode() not in data, f"{secret[:12]}... leaked into {path.relative_to(record.dir)}"
    assert REDACTED in (job_dir / "log").read_text() and REDACTED in (record.dir / "attempts/1/diff.patch").read_text()
    assert "x-api-key" not in (record.dir / "run.json").read_text()  # secret-named fields are dropped, not just masked
