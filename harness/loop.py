"""The agent loop: prompt, model turn, tools, submit, gates, feedback; until accepted or out of budget.

mini-swe-agent's shape, with control flow by exception: `Submitted` (submit, or a turn without tool calls),
`FormatError` (a turn cut off at max_tokens: the model is told) and `LimitsExceeded` (checked before every
model call). Every step is on disk before the next starts, so `Loop.run` on a reopened record picks up where
the records end (`_settle`). A ChatAgent (API, replay) gets the tools; a SubprocessAgent (Claude Code, Codex)
edits the worktree itself, one CLI session per attempt. An attempt: the worktree's diff against the judge's
base, judged in the judge's own checkout, then committed on the run's branch with the verdict in its trailers.
"""

import json
import time
from dataclasses import replace

from harness.agents import ChatAgent, SubprocessAgent
from harness.judge import GateError, GateRunner, verdict_text
from harness.progress import Progress
from harness.prompts import gate_failure_prompt, milestone_prompt, system_prompt
from harness.protocol import (LoopOptions, AgentError, AgentTurn, FormatError, LimitsExceeded, Message, Submitted, ToolCall,
                              ToolResult, Usage)
from harness.records import RunRecord
from harness.settings import child_env
from harness.spec import Milestone
from harness.tools import ToolContext, ToolError, execute, tool_specs
from harness.verdict import GateResult, Verdict
from harness.workspace import Workspace

__all__ = ["Loop", "check_limits", "count_submissions"]

CUT_OFF_CALL = ("Not run: your reply hit the output limit (max_tokens = {limit}) and this tool call may be cut off. "
                "Send it again, smaller: split big patches or files into several calls.")
CUT_OFF_TEXT = ("Your reply was cut off at the output limit (max_tokens = {limit}). Continue with shorter replies, "
                "and make changes with tool calls.")
AFTER_SUBMIT = "Not run: you called submit earlier in this turn; the harness is judging that submission."


def check_limits(milestone: Milestone, record: RunRecord, wall_s: float) -> None:
    """Raise LimitsExceeded naming the first spent budget. An unknown cost never counts as spent."""
    b, t = milestone.budget, record.totals
    if t.turns >= b.max_turns:
        raise LimitsExceeded(f"turn budget spent: {t.turns} of {b.max_turns} turns")
    if t.tokens >= b.max_tokens:
        raise LimitsExceeded(f"token budget spent: {t.tokens:,} of {b.max_tokens:,} tokens")
    if b.max_cost_usd is not None and t.usage.cost_usd is not None and t.usage.cost_usd >= b.max_cost_usd:
        raise LimitsExceeded(f"cost budget spent: ${t.usage.cost_usd:.4f} of ${b.max_cost_usd:.2f}")
    if wall_s >= b.max_wall_s:
        raise LimitsExceeded(f"wall-time budget spent: {wall_s:.0f} s of {b.max_wall_s:g} s")
    if t.attempts >= b.max_attempts:
        raise LimitsExceeded(f"attempt budget spent: {t.attempts} of {b.max_attempts} attempts")


def count_submissions(messages: list[Message]) -> int:
    """Submissions in a conversation: turns with a successful `submit`, and turns that ended without tools."""
    n = 0
    for m in messages:
        if m.role == "tool":
            n += any(r.submitted for r in m.results)
        elif m.role == "assistant" and m.turn is not None and not m.turn.tool_calls \
                and m.turn.stop_reason in ("end_turn", "refusal"):
            n += 1
    return n


def _first_line(text: str, limit: int = 110) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _brief(result: ToolResult) -> str:
    """What the progress view says about a tool result: its first line, and a shell's exit code."""
    lines = [line for line in result.content.splitlines() if line.strip()]
    status = lines[-1].split(";")[0].strip("[") if len(lines) > 1 and lines[-1].startswith("[exit code") else ""
    return ("ERROR " if result.is_error else "") + _first_line(result.content, 80) + (f" ({status})" if status else "")


def _cost(usage: Usage) -> str:
    return "cost unknown" if usage.cost_usd is None else f"${usage.cost_usd:.4f}"


class Loop:
    """Drives one run's agent. Build it on a created or reopened RunRecord; `run()` returns the final status."""

    def __init__(self, *, milestone: Milestone, record: RunRecord, workspace: Workspace, agent: ChatAgent | SubprocessAgent,
                 gates: GateRunner, judge_base: str, progress: Progress | None = None, wall_offset_s: float = 0.0,
                 options: LoopOptions | None = None):
        self.milestone = milestone
        self.record = record
        self.ws = workspace
        self.agent = agent
        self.gates = gates
        self.judge_base = judge_base
        self.progress = progress or Progress(quiet=True)
        self.options = options or LoopOptions()
        self._t0 = time.monotonic() - wall_offset_s
        self.tools = tool_specs()
        self.ctx = ToolContext(root=workspace.worktree, shell_timeout_s=self.options.shell_timeout_s,
                               run_gates=self._dry_run, read_job_log=gates.read_log, env=child_env())

    def run(self) -> str:
        """Run until a final status (accepted, rejected, budget_exhausted, error); Ctrl-C records interrupted."""
        try:
            if isinstance(self.agent, ChatAgent):
                return self._run_chat()
            return self._run_cli()
        except LimitsExceeded as err:
            return self._finish("budget_exhausted", str(err))
        except AgentError as err:
            return self._finish("error", f"agent failed: {err}")
        except KeyboardInterrupt:
            self._finish("interrupted", f"interrupted; `temper resume {self.record.id}` continues it")
            raise
        except BaseException as err:
            self._finish("error", f"harness error: {type(err).__name__}: {err}")
            raise

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self._t0

    def _finish(self, status: str, reason: str) -> str:
        self.record.finish(status, reason)
        self.progress("run", f"{status}: {reason}")
        return status

    def _tell(self, text: str) -> None:
        self.record.user_message(text)
        self.progress("message", f"to agent: {_first_line(text)}")

    def _ensure_prompt(self) -> None:
        if not any(m.role == "user" for m in self.record.messages()):
            self._tell(milestone_prompt(self.milestone, self.ws.worktree))

    def _run_chat(self) -> str:
        self._ensure_prompt()
        status = self._settle()
        while status is None:
            check_limits(self.milestone, self.record, self.wall_s)
            status = self._handle(self._call(), {})
        return status

    def _call(self) -> AgentTurn:
        started = time.monotonic()
        assert isinstance(self.agent, ChatAgent)
        turn = self.agent.step(self.record.system_prompt, self.record.messages(), self.tools, self.options.max_output_tokens)
        self.record.llm_call(turn, duration_s=round(time.monotonic() - started, 3))
        u = turn.usage
        calls = ", ".join(c.name for c in turn.tool_calls) or f"({turn.stop_reason})"
        self.progress("turn", f"{self.record.totals.turns:>3}  {turn.model or self.agent.name}  {u.input_tokens:,} in / "
                              f"{u.output_tokens:,} out  {_cost(u)}  -> {calls}")
        return turn

    def _handle(self, turn: AgentTurn, done: dict[str, ToolResult]) -> str | None:
        """Run a turn's remaining tool calls; judge a submission; tell the model what it cannot do."""
        try:
            self._execute(turn, done)
        except FormatError as err:
            pending = [c for c in turn.tool_calls if c.id not in done]
            for call in pending:
                self.record.tool_call(call)
                self.record.tool_result(ToolResult(call.id, str(err), is_error=True))
            if not pending:
                self._tell(str(err))
            self.progress("format", _first_line(str(err)))
        except Submitted as sub:
            return self._judge(str(sub.args[0]) if sub.args else "")
        return None

    def _execute(self, turn: AgentTurn, done: dict[str, ToolResult]) -> None:
        limit = self.options.max_output_tokens
        if turn.stop_reason == "max_tokens":
            raise FormatError(CUT_OFF_CALL.format(limit=limit) if turn.tool_calls else CUT_OFF_TEXT.format(limit=limit))
        if not turn.tool_calls:
            if turn.stop_reason == "pause_turn":
                return  # the server paused a long turn: calling again continues it
            raise Submitted(turn.text)
        submitted: str | None = next((self._submit_message(turn, r.call_id) for r in done.values() if r.submitted), None)
        for call in turn.tool_calls:
            if call.id in done:
                continue
            self.record.tool_call(call)
            started = time.monotonic()
            result = ToolResult(call.id, AFTER_SUBMIT, is_error=True) if submitted is not None else execute(call, self.ctx)
            self.record.tool_result(result, duration_s=round(time.monotonic() - started, 3))
            self.progress("tool", f"{call.name}{self._tool_arg(call)}: {_brief(result)}")
            if result.submitted:
                submitted = str(call.arguments.get("message", ""))
        if submitted is not None:
            raise Submitted(submitted)

    @staticmethod
    def _tool_arg(call: ToolCall) -> str:
        for key in ("command", "job_id"):
            if isinstance(call.arguments.get(key), str):
                return f" {_first_line(call.arguments[key], 60)}"
        return ""

    @staticmethod
    def _submit_message(turn: AgentTurn, call_id: str) -> str:
        call = next((c for c in turn.tool_calls if c.id == call_id), None)
        return str(call.arguments.get("message", "")) if call else ""

    def _settle(self) -> str | None:
        """Finish what the records say is half-done (after a crash or a kill), so the loop can go on."""
        messages = self.record.messages()
        last = messages[-1]
        if last.role == "assistant" and last.turn is not None and last.turn.tool_calls:
            return self._handle(last.turn, {})  # none of its calls ran
        if last.role == "assistant" and last.turn is not None and last.turn.stop_reason == "max_tokens":
            self._tell(CUT_OFF_TEXT.format(limit=self.options.max_output_tokens))  # the cut-off was never answered
            return None
        if last.role == "tool" and len(messages) >= 2 and messages[-2].turn is not None:
            turn = messages[-2].turn
            done = {r.call_id: r for r in last.results}
            if any(c.id not in done for c in turn.tool_calls):
                return self._handle(turn, done)
        return self._pending_judgement()

    def _pending_judgement(self) -> str | None:
        """A submission the records hold but no attempt judged yet, or a rejection whose feedback was not sent."""
        messages = self.record.messages()
        last = max((i for i, m in enumerate(messages) if count_submissions([m])), default=-1)
        if last < 0 or any(m.role == "user" for m in messages[last + 1:]):
            return None
        attempts = self.record.totals.attempts
        if count_submissions(messages) > attempts:
            return self._judge(self._submission_text(messages, last))
        verdict_file = self.record.attempt_dir(attempts) / "verdict.json"
        return self._after_verdict(Verdict.from_json(json.loads(verdict_file.read_text(encoding="utf-8"))))

    def _submission_text(self, messages: list[Message], index: int) -> str:
        message = messages[index]
        if message.role == "assistant" and message.turn is not None:
            return message.turn.text
        turn = messages[index - 1].turn if index > 0 else None
        for result in message.results:
            if result.submitted and turn is not None:
                return self._submit_message(turn, result.call_id)
        return ""

    def _run_cli(self) -> str:
        assert isinstance(self.agent, SubprocessAgent)
        self._ensure_prompt()
        status = self._pending_judgement()
        while status is None:
            check_limits(self.milestone, self.record, self.wall_s)
            n = self.record.totals.attempts + 1
            folder = self.record.dir / "agent"
            folder.mkdir(exist_ok=True)
            self.progress("turn", f"attempt {n}: {self.agent.name} works in {self.ws.worktree} ...")
            started = time.monotonic()
            outcome = self.agent.attempt(self.ws.worktree, self._cli_prompt(), log_path=folder / f"attempt-{n}.jsonl",
                                         timeout_s=max(60.0, self.milestone.budget.max_wall_s - self.wall_s))
            usage = outcome.usage or Usage(cost_usd=None)
            turn = AgentTurn(text=outcome.final_text or f"({self.agent.name} exited {outcome.exit_code})", usage=usage,
                             model=self.agent.name, stop_reason="end_turn")
            self.record.llm_call(turn, duration_s=round(time.monotonic() - started, 3))
            if outcome.timed_out or outcome.exit_code != 0:
                self.record.note(f"{self.agent.name} exited {outcome.exit_code}" + (" (timed out)" if outcome.timed_out else ""),
                                 transcript=str(outcome.transcript_path))
            self.progress("turn", f"attempt {n}: {self.agent.name} exited {outcome.exit_code} after "
                                  f"{time.monotonic() - started:.0f} s, {usage.input_tokens:,} in / {usage.output_tokens:,} out, {_cost(usage)}")
            status = self._judge(outcome.final_text)
        return status

    def _cli_prompt(self) -> str:
        """System prompt (no tools: the CLI brings its own), milestone, and the latest gate feedback."""
        users = [m.text for m in self.record.messages() if m.role == "user"]
        parts = [system_prompt(self.milestone, self.ws.worktree), users[0]]
        if len(users) > 1:
            parts.append("# Your previous attempt was rejected\n\nYour changes so far are still in the working tree.\n\n" + users[-1])
        return "\n\n---\n\n".join(parts)

    def _dry_run(self) -> str:
        """The agent's run_gates: the public gates (no held-out tests, the public draw), never an attempt. Dry runs are
        unlimited, so they must not let the agent probe what it is judged on (harness/judge/runner.py)."""
        self.progress("gate", "dry run of the public gates requested by the agent (run_gates)")
        try:
            verdict = self.gates.judge(self.ws.diff(base=self.judge_base), attempt=0, live_tree=self.ws.worktree, public=True)
        except GateError as err:
            raise ToolError(f"the worktree's diff cannot be judged: {err}") from None
        return ("Dry run of the public gates (nothing recorded as an attempt; held-out tests run only when you submit, "
                "and a submission is judged on a secret draw of the configurations, not this public one):\n"
                + verdict_text(verdict))

    def _judge(self, message: str) -> str | None:
        n = self.record.totals.attempts + 1
        self.progress("attempt", f"{n} of {self.milestone.budget.max_attempts}: judging the worktree's diff")
        diff = self.ws.diff(base=self.judge_base)
        try:
            verdict = self.gates.judge(diff, attempt=n, live_tree=self.ws.worktree)
        except GateError as err:
            failed = GateResult(name="apply", kind="patch", passed=False, summary=str(err))
            verdict = Verdict(attempt=n, accepted=False, gates=(failed,), reason=f"the attempt cannot be judged: {err}")
        mfu = next((v for g in verdict.gates for k, v in g.metrics.items() if k.endswith(".mfu")), None)
        sha = self.ws.commit_attempt(n, milestone=self.milestone.id, run_id=self.record.id,
                                     verdict="accepted" if verdict.accepted else "rejected", mfu=mfu,
                                     message=message.strip() or f"attempt {n}")
        verdict = replace(verdict, commit=sha)
        self.record.attempt(verdict, diff)
        self.progress("verdict", f"attempt {n} " + ("ACCEPTED: every gate passed" if verdict.accepted else f"REJECTED: {verdict.reason}"))
        return self._after_verdict(verdict)

    def _after_verdict(self, verdict: Verdict) -> str | None:
        budget = self.milestone.budget
        if verdict.accepted:
            return self._finish("accepted", f"attempt {verdict.attempt}: every gate passed")
        left = budget.max_attempts - verdict.attempt
        if left <= 0:
            return self._finish("rejected", f"attempt {verdict.attempt} of {budget.max_attempts} rejected: {verdict.reason}")
        self._tell(gate_failure_prompt(verdict, left))
        return None
