"""`temper report`: one self-contained HTML page per run (no network: inline CSS, plots as inline SVG).

Reads only the run folder (run.json, events.jsonl, attempts/, jobs/), so a report can be written for
a run that crashed, is still going, or was copied from another machine. Sections: header and totals,
final verdict, per-job loss and MFU plots with a summary table, attempts with their gates and
collapsible diffs, and the event timeline.

Job metrics come from the `[LOSS]` wire lines of each job's log, else from its metrics.jsonl twin.
The MFU plotted is the engine-reported value (Megatron count: 6 x matmul params incl. the LM head +
causal attention, embeddings 0); the MFU the judge used is the harness-recomputed one in the verdict.
"""

import base64
import html
import json
import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.records import read_events, scrub_text, write_atomic
from harness.svgplot import line_chart
from harness.verdict import GateResult, Verdict

__all__ = ["write_report", "render_report"]

_LOSS_LINE = re.compile(r"\[LOSS\]\s+(.*)$")
_PAIR = re.compile(r"(\w+)=(\S+)")
_MAX_TEXT = 600  # characters of a message / tool output shown inline in the timeline
_MAX_DETAIL = 8000  # characters inside a collapsed block
_MAX_DIFF = 400_000


# ---------------------------------------------------------------- job metrics


def _number(text: str) -> float | int | None:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def _parse_loss_lines(text: str) -> list[dict[str, float]]:
    """`[LOSS] step=N global_loss=... grad_norm=... lr=... tokens=N time_s=... mfu=...` -> one dict per line.

    A stand-in for harness/judge/logparse.py; unparseable values are skipped, not guessed.
    """
    rows = []
    for line in text.splitlines():
        match = _LOSS_LINE.search(line)
        if not match:
            continue
        row = {k: v for k, raw in _PAIR.findall(match.group(1)) if (v := _number(raw)) is not None}
        if "step" in row:
            rows.append(row)
    return rows


def _parse_jsonl(path: Path) -> tuple[list[dict[str, float]], int]:
    """Rows of a metrics.jsonl twin, and how many lines could not be read (shown in the report)."""
    rows, unreadable = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            unreadable += 1  # e.g. the partial last line of a killed job
            continue
        if isinstance(data, dict) and isinstance(data.get("step"), int):
            if "global_loss" not in data and "loss" in data:
                data["global_loss"] = data["loss"]
            rows.append({k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return rows, unreadable


@dataclass(frozen=True)
class _JobSeries:
    rows: list[dict[str, float]]
    source: str  # "log", the metrics.jsonl path under the job folder, or "" when neither had data
    unreadable: int = 0


def _job_series(run_dir: Path) -> dict[str, _JobSeries]:
    """Every folder under jobs/ holding a `log` or a metrics.jsonl, labelled by its path under jobs/."""
    jobs_root = run_dir / "jobs"
    out: dict[str, _JobSeries] = {}
    if not jobs_root.is_dir():
        return out
    folders = sorted({p.parent for p in jobs_root.rglob("log") if p.is_file()} |
                     {p.parent for p in jobs_root.rglob("metrics.jsonl") if p.is_file()})
    for folder in folders:
        if any(folder != other and folder.is_relative_to(other) for other in folders):
            continue  # the engine's own subfolder of a job we already list
        name = str(folder.relative_to(jobs_root))
        rows = _parse_loss_lines((folder / "log").read_text(encoding="utf-8", errors="replace")) if (folder / "log").is_file() else []
        if rows:
            out[name] = _JobSeries(rows, "log")
            continue
        twins = sorted(folder.rglob("metrics.jsonl"))
        if twins:
            rows, unreadable = _parse_jsonl(twins[0])
            out[name] = _JobSeries(rows, str(twins[0].relative_to(folder)), unreadable)
        else:
            out[name] = _JobSeries([], "")
    return out


def _right_panel(name: str, rows: list[dict[str, float]]) -> tuple[str, str, list[tuple[float, float]]]:
    """The second plot of a job: MFU when the engine measured one, else step time (CPU jobs have no MFU
    peak, and a flat 0 % line says nothing)."""
    mfu = [(r["step"], r["mfu"] * 100) for r in rows if "mfu" in r]
    if any(v > 0 for _, v in mfu) or not any("time_s" in r for r in rows):
        return f"{name}: MFU (engine-reported, Megatron count)", "MFU %", mfu
    return f"{name}: step time (no MFU: CPU job)", "time_s (s)", [(r["step"], r["time_s"]) for r in rows if "time_s" in r]


def _job_alt(name: str, rows: list[dict[str, float]]) -> str:
    """The chart's alt text names what it shows: `train: loss and MFU ...`, or step time on a CPU job that has no MFU."""
    title, _, _ = _right_panel(name, rows)
    return f"{name}: loss and {title[len(name) + 2:]}"


def _svg_src(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _svg_job(name: str, rows: list[dict[str, float]]) -> str:
    """Loss and MFU (or step time) side by side as one SVG."""

    loss = line_chart([("loss", [(r["step"], r["global_loss"]) for r in rows if "global_loss" in r])],
                      title=f"{name}: loss", xlabel="step", ylabel="global_loss")
    title, ylabel, right = _right_panel(name, rows)
    mfu = line_chart([("right", right)], title=title, xlabel="step", ylabel=ylabel)
    both = (f"<svg xmlns='http://www.w3.org/2000/svg' width='1100' height='300'>"
            f"<g>{loss}</g><g transform='translate(560 0)'>{mfu}</g></svg>")
    return _svg_src(both)


def _svg_overlay(series: dict[str, list[dict[str, float]]]) -> str:
    return _svg_src(line_chart([(name, [(r["step"], r["global_loss"]) for r in rows if "global_loss" in r])
                                for name, rows in series.items()],
                               title="loss of every job", xlabel="step", ylabel="global_loss", width=1100, height=320))


# ---------------------------------------------------------------- html helpers

_CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1f2328;margin:0;background:#f6f8fa}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
section,.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:14px 16px;margin-bottom:14px}
table{border-collapse:collapse;width:100%;font-size:13px}table.gates{table-layout:fixed}td{overflow-wrap:anywhere}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.kv{display:grid;grid-template-columns:repeat(4,minmax(0,1fr));gap:8px 16px}.kv div{min-width:0;overflow-wrap:anywhere}.kv b{display:block;font-size:11px;color:#656d76;font-weight:600;text-transform:uppercase}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;white-space:nowrap}
.ok{background:#1a7f37}.bad{background:#cf222e}.warn{background:#bc4c00}.info{background:#0969da}.muted{background:#6e7781}
pre{background:#f6f8fa;border:1px solid #eaeef2;border-radius:4px;padding:8px;overflow:auto;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;max-height:480px}
pre.diff{white-space:pre}.add{color:#116329;background:#dafbe1;display:block}.del{color:#82071e;background:#ffebe9;display:block}.hunk{color:#0550ae;display:block}.file{font-weight:700;display:block}.ctx{display:block}
details{margin:6px 0}summary{cursor:pointer}img{max-width:100%;display:block;margin:8px 0}
.ev td:nth-child(1),.ev td:nth-child(2){color:#656d76;white-space:nowrap;font-variant-numeric:tabular-nums}.ev td:nth-child(3){white-space:nowrap;font-weight:600}
.small{color:#656d76;font-size:12px}.banner{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:8px 12px;margin-bottom:14px}
"""

_STATUS_CLASS = {"accepted": "ok", "rejected": "bad", "error": "bad", "budget_exhausted": "warn", "running": "info", "interrupted": "muted"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _badge(text: str, cls: str) -> str:
    return f'<span class="badge {cls}">{_e(text)}</span>'


def _pass_badge(result: GateResult) -> str:
    if result.skipped:
        return _badge("skipped", "muted")
    return _badge("pass", "ok") if result.passed else _badge("FAIL", "bad")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def _fmt_int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def _cost(value: Any) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def _parse_ts(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def _duration(start: str, end: str | None) -> str:
    a, b = _parse_ts(start), _parse_ts(end or "")
    if a is None or b is None:
        return "-"
    seconds = int((b - a).total_seconds())
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m {seconds % 60:02d}s"


def _diff_html(diff: str) -> str:
    lines = []
    for line in _clip(diff, _MAX_DIFF).splitlines():
        cls = ("file" if line.startswith(("diff --git", "+++ ", "--- ")) else "add" if line.startswith("+")
               else "del" if line.startswith("-") else "hunk" if line.startswith("@@") else "ctx")
        lines.append(f'<span class="{cls}">{_e(line) or " "}</span>')
    # One block-level span per line, so no newline between them (it would render as an empty line).
    return '<pre class="diff">' + "".join(lines) + "</pre>"


def _diff_stat(diff: str) -> tuple[int, int, int]:
    files = sum(1 for line in diff.splitlines() if line.startswith("diff --git"))
    added = sum(1 for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff.splitlines() if line.startswith("-") and not line.startswith("---"))
    return files, added, removed


# ---------------------------------------------------------------- sections


def _header(meta: dict[str, Any]) -> str:
    totals = meta.get("totals", {})
    agent = meta.get("agent", {})
    status = meta.get("status", "unknown")
    agent_text = " / ".join(_e(f"{k}={v}") for k, v in agent.items()) or "unknown"
    milestone = meta.get("milestone", {})
    cells = [
        ("milestone", f"{_e(milestone.get('id', '?'))} <span class='small'>spec {_e(str(milestone.get('spec_hash', ''))[:12])}</span>"),
        ("status", _badge(status, _STATUS_CLASS.get(status, "muted")) + (f" <span class='small'>{_e(meta.get('reason', ''))}</span>" if meta.get("reason") else "")),
        ("started", _e(meta.get("started", "-"))),
        ("duration", _e(_duration(meta.get("started", ""), meta.get("ended"))) if meta.get("ended") else "running / unknown"),
        ("turns", _fmt_int(totals.get("turns"))),
        ("tool calls", _fmt_int(totals.get("tool_calls"))),
        ("attempts", _fmt_int(totals.get("attempts"))),
        ("cost", _e(_cost(totals.get("cost_usd")))),
        ("tokens in", _fmt_int(totals.get("input_tokens"))),
        ("tokens out", _fmt_int(totals.get("output_tokens"))),
        ("cache read", _fmt_int(totals.get("cache_read_tokens"))),
        ("cache write", _fmt_int(totals.get("cache_write_tokens"))),
        ("base commit", f"<code>{_e(str(meta.get('base_commit', ''))[:12])}</code>"),
        ("branch", f"<code>{_e(meta.get('branch', ''))}</code>"),
        ("agent", f"<span class='small'>{agent_text}</span>"),
        ("worktree", f"<span class='small'>{_e(meta.get('worktree', ''))}</span>"),
    ]
    grid = "".join(f"<div><b>{_e(k)}</b>{v}</div>" for k, v in cells)
    return (f"<h1>Temper run {_e(meta.get('id', '?'))}</h1>"
            f"<div class='small'>report of runs/{_e(meta.get('id', '?'))}</div>"
            f"<section><div class='kv'>{grid}</div></section>")


def _gates_table(verdict: Verdict) -> str:
    rows = []
    for g in verdict.gates:
        details = []
        if g.violations:
            details.append("<br>".join(_e(v) for v in g.violations[:10]) + (f"<br><span class='small'>... {len(g.violations) - 10} more</span>" if len(g.violations) > 10 else ""))
        if g.failing_tests:
            details.append("<br>".join(f"<code>{_e(t)}</code>" for t in g.failing_tests[:10]))
        if g.metrics:
            details.append(", ".join(f"{_e(k)} = {v:.6g}" for k, v in g.metrics.items()))
        if g.log_tail:
            details.append(f"<details><summary>log tail</summary><pre>{_e(_clip(g.log_tail, _MAX_DETAIL))}</pre></details>")
        rows.append(f"<tr><td>{_e(g.name)}</td><td>{_e(g.kind)}</td><td>{_pass_badge(g)}</td><td>{_e(g.summary)}"
                    f"{'<br>' + '<br>'.join(details) if details else ''}</td><td class='num'>{g.duration_s:.1f} s</td></tr>")
    return ("<table class='gates'><colgroup><col style='width:14%'><col style='width:10%'><col style='width:9%'><col><col style='width:8%'></colgroup>"
            "<tr><th>gate</th><th>kind</th><th>result</th><th>details</th><th>time</th></tr>" + "".join(rows) + "</table>")


def _verdict_section(meta: dict[str, Any], verdicts: list[tuple[Verdict, str]]) -> str:
    status = meta.get("status", "unknown")
    if not verdicts:
        return f"<h2>Final verdict</h2><section>{_badge(status, _STATUS_CLASS.get(status, 'muted'))} no attempt was judged.</section>"
    last, _ = verdicts[-1]
    failed = last.failed_gate
    word = "ACCEPTED" if last.accepted else "REJECTED"
    line = (f"{_badge(word, 'ok' if last.accepted else 'bad')} attempt {last.attempt}"
            + (f", commit <code>{_e(last.commit[:12])}</code>" if last.commit else "")
            + (f": gate <b>{_e(failed.name)}</b> failed" if failed else ": every gate passed")
            + (f" <span class='small'>({_e(last.reason)})</span>" if last.reason else "")
            + f" &middot; run status {_badge(status, _STATUS_CLASS.get(status, 'muted'))}")
    flags = "".join(f"<div class='banner'>flag: {_e(f)}</div>" for f in last.flags)
    return f"<h2>Final verdict</h2><section><p>{line}</p>{flags}{_gates_table(last)}</section>"


def _jobs_section(jobs: dict[str, _JobSeries]) -> str:
    if not jobs:
        return "<h2>Jobs</h2><section class='small'>No job ran.</section>"
    series = {name: job.rows for name, job in jobs.items()}
    parts = ["<h2>Jobs</h2><section>",
             "<table><tr><th>job</th><th>steps</th><th>first loss</th><th>last loss</th><th>min loss</th>"
             "<th>median MFU (engine)</th><th>median step time</th><th>tokens/step</th><th>source</th></tr>"]
    for name, rows in series.items():
        loss = [r["global_loss"] for r in rows if "global_loss" in r]
        mfu = [r["mfu"] for r in rows if "mfu" in r]
        times = [r["time_s"] for r in rows if "time_s" in r]
        tokens = [r["tokens"] for r in rows if "tokens" in r]
        cell = lambda v, fmt: f"<td class='num'>{format(v, fmt)}</td>" if v is not None else "<td class='num'>-</td>"  # noqa: E731
        parts.append(
            f"<tr data-job='{_e(name)}'><td>{_e(name)}</td><td class='num'>{len(rows)}</td>"
            + cell(loss[0] if loss else None, ".6g") + cell(loss[-1] if loss else None, ".6g") + cell(min(loss) if loss else None, ".6g")
            + (f"<td class='num'>{statistics.median(mfu) * 100:.2f} %</td>" if any(mfu) else
               "<td class='num'>n/a</td>" if mfu else "<td class='num'>-</td>")
            + (f"<td class='num'>{statistics.median(times):.4g} s</td>" if times else "<td class='num'>-</td>")
            + cell(int(statistics.median(tokens)) if tokens else None, ",")
            + f"<td class='small'>{_e(jobs[name].source or '-')}"
            + (f" ({jobs[name].unreadable} unreadable line{'s' if jobs[name].unreadable > 1 else ''} skipped)" if jobs[name].unreadable else "")
            + "</td></tr>")
    parts.append("</table><p class='small'>MFU as the engine reported it (Megatron count: 6 x matmul parameters incl. LM head "
                 "+ causal attention, embeddings 0, peak 989 TFLOP/s); the judge recomputes it, see the verdict's metrics.</p>")
    with_data = {k: v for k, v in series.items() if v}
    if len(with_data) > 1:
        parts.append(f"<img alt='loss of every job' src='{_svg_overlay(with_data)}'>")
    for name, rows in series.items():
        if rows:
            parts.append(f"<img alt='{_e(_job_alt(name, rows))}' src='{_svg_job(name, rows)}'>")
        else:
            parts.append(f"<p class='small'>{_e(name)}: no [LOSS] lines or metrics.jsonl.</p>")
    parts.append("</section>")
    return "".join(parts)


def _attempts_section(verdicts: list[tuple[Verdict, str]]) -> str:
    if not verdicts:
        return ""
    parts = ["<h2>Attempts</h2>"]
    for verdict, diff in verdicts:
        failed = verdict.failed_gate
        files, added, removed = _diff_stat(diff)
        head = (_badge("accepted", "ok") if verdict.accepted else _badge("rejected", "bad")) + f" attempt {verdict.attempt}" \
            + (f" &middot; failed gate <b>{_e(failed.name)}</b>" if failed else "") \
            + (f" &middot; <code>{_e(verdict.commit[:12])}</code>" if verdict.commit else "")
        parts.append(
            f"<section id='attempt-{verdict.attempt}'><div>{head}</div>{_gates_table(verdict)}"
            f"<details><summary>diff: {files} file{'s' if files != 1 else ''}, +{added} / -{removed}</summary>{_diff_html(diff)}</details></section>")
    return "".join(parts)


def _event_row(event: dict[str, Any], start: datetime | None) -> str:
    kind = event.get("type", "?")
    ts = _parse_ts(event.get("ts", ""))
    rel = f"+{int((ts - start).total_seconds()) // 60:d}:{int((ts - start).total_seconds()) % 60:02d}" if ts and start else ""
    desc = ""
    if kind == "run_started":
        desc = f"run started on <code>{_e(event.get('branch', ''))}</code> at <code>{_e(str(event.get('base_commit', ''))[:12])}</code>"
    elif kind == "user_message":
        text = event.get("text", "")
        desc = f"<details><summary>to agent: {_e(text.splitlines()[0] if text else '')[:160]}</summary><pre>{_e(_clip(text, _MAX_DETAIL))}</pre></details>"
    elif kind == "llm_call":
        turn = event.get("turn", {})
        calls = ", ".join(_e(c.get("name", "?")) for c in turn.get("tool_calls", []))
        desc = (f"{_e(event.get('model', ''))} &middot; {_fmt_int(event.get('input_tokens'))} in / {_fmt_int(event.get('output_tokens'))} out"
                f" / {_fmt_int(event.get('cache_read_tokens'))} cached &middot; {_e(_cost(event.get('cost_usd')))} &middot; {_e(event.get('stop_reason', ''))}"
                + (f" &middot; tools: {calls}" if calls else "")
                + (f"<pre>{_e(_clip(turn.get('text', ''), _MAX_TEXT))}</pre>" if turn.get("text") else ""))
    elif kind == "tool_call":
        call = event.get("call", {})
        args = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        desc = f"<code>{_e(call.get('name', '?'))}</code> {_e(_clip(args, 240))}" + (f" {_badge('bad arguments', 'bad')}" if call.get("parse_error") else "")
    elif kind == "tool_result":
        result = event.get("result", {})
        content = result.get("content", "")
        badge = _badge("error", "bad") if result.get("is_error") else _badge("submitted", "info") if result.get("submitted") else _badge("ok", "muted")
        desc = f"<details><summary>{badge} {_e(content[:160].replace(chr(10), ' '))}</summary><pre>{_e(_clip(content, _MAX_DETAIL))}</pre></details>"
    elif kind == "gate_started":
        desc = f"attempt {_e(event.get('attempt'))}: gate <b>{_e(event.get('gate'))}</b> ({_e(event.get('kind'))}) started"
    elif kind == "gate_result":
        result = GateResult.from_json(event["result"]) if isinstance(event.get("result"), dict) else None
        desc = (f"attempt {_e(event.get('attempt'))}: gate <b>{_e(result.name)}</b> {_pass_badge(result)} {_e(result.summary)}"
                if result else "gate result (unreadable)")
    elif kind == "job_started":
        desc = f"job <b>{_e(event.get('job'))}</b> ({_e(event.get('launcher'))}) <code>{_e(_clip(' '.join(event.get('argv', [])), 300))}</code>"
    elif kind == "job_finished":
        code = event.get("exit_code")
        desc = (f"job <b>{_e(event.get('job'))}</b> exit {_e(code)} after {event.get('duration_s', 0):.1f} s "
                + (_badge("timed out", "bad") if event.get("timed_out") else _badge("ok", "ok") if code == 0 else _badge("failed", "bad"))
                + (f" {_e(event.get('summary'))}" if event.get("summary") else ""))
    elif kind == "attempt":
        desc = (f"attempt {_e(event.get('attempt'))}: " + (_badge("accepted", "ok") if event.get("accepted") else _badge("rejected", "bad"))
                + (f" failed gate <b>{_e(event.get('failed_gate'))}</b>" if event.get("failed_gate") else "")
                + f" &middot; <a href='#attempt-{_e(event.get('attempt'))}'>diff</a>")
    elif kind == "run_finished":
        status = event.get("status", "?")
        desc = f"run finished: {_badge(status, _STATUS_CLASS.get(status, 'muted'))} {_e(event.get('reason', ''))}"
    elif kind == "note":
        desc = _e(event.get("text", ""))
    return f"<tr><td>{_e(event.get('seq'))}</td><td>{_e(rel)}</td><td>{_e(kind)}</td><td>{desc}</td></tr>"


def _timeline_section(events: list[dict[str, Any]]) -> str:
    start = _parse_ts(events[0].get("ts", "")) if events else None
    rows = "".join(_event_row(e, start) for e in events)
    return (f"<h2>Timeline</h2><section><table class='ev'><tr><th>#</th><th>time</th><th>event</th><th>what</th></tr>{rows}</table></section>")


def _load_verdicts(run_dir: Path) -> list[tuple[Verdict, str]]:
    out = []
    attempts = run_dir / "attempts"
    if not attempts.is_dir():
        return out
    for folder in sorted((p for p in attempts.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        verdict_file = folder / "verdict.json"
        if not verdict_file.is_file():
            continue  # an attempt still being judged
        verdict = Verdict.from_json(json.loads(verdict_file.read_text(encoding="utf-8")))
        diff_file = folder / "diff.patch"
        out.append((verdict, diff_file.read_text(encoding="utf-8", errors="replace") if diff_file.is_file() else ""))
    return out


def render_report(run_dir: str | Path) -> str:
    """The report page as a string (write_report writes it)."""
    run_dir = Path(run_dir)
    meta_file = run_dir / "run.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json)")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    read = read_events(run_dir / "events.jsonl")
    verdicts = _load_verdicts(run_dir)
    banner = ""
    if read.truncated_tail is not None:
        banner = (f"<div class='banner'>events.jsonl ends with a truncated line ({len(read.truncated_tail)} characters), "
                  "left by a crash; the events before it are shown.</div>")
    body = (_header(meta) + banner + _verdict_section(meta, verdicts) + _jobs_section(_job_series(run_dir))
            + _attempts_section(verdicts) + _timeline_section(read.events))
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Temper run {_e(meta.get('id', '?'))} ({_e(meta.get('status', '?'))})</title>"
            f"<style>{_CSS}</style></head><body><main>{body}"
            f"<p class='small'>Written by <code>temper report</code>; self-contained, no network.</p></main></body></html>\n")
    return scrub_text(page)  # the record is scrubbed already; this guards against anything read from elsewhere


def write_report(run_dir: str | Path) -> Path:
    """Write runs/<id>/report.html (atomically) and return its path."""
    path = Path(run_dir) / "report.html"
    write_atomic(path, render_report(run_dir), mode=0o666)  # a page to share, like any file (the umask applies)
    return path
