"""The HTML report: self-contained, well-formed, with the plots, the numbers of the jobs and every verdict."""

import base64
import html
import html.parser
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from harness.protocol import AgentTurn, ToolCall, ToolResult, Usage
from harness.records import RunRecord, read_events
from harness.report import render_report, write_report
from harness.verdict import GateResult, Verdict

REPO = Path(__file__).resolve().parents[2]
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "embed", "source", "track", "wbr"}


def loss_curve(step: int, scale: float = 1.0) -> float:
    return 5.55 * scale * math.exp(-step / 15) + 2.0


def loss_line(step: int, scale: float = 1.0) -> str:
    # The wire format of DESIGN.md section 3, written by a real process below.
    return (f"[LOSS] step={step} global_loss={loss_curve(step, scale):.9e} grad_norm={1.0 / step:.9e} lr={3e-4:.6e} "
            f"tokens=2048 time_s={0.25 + step * 0.001:.6f} mfu={0.40 + step * 0.002:.4f}")


def build_run(root: Path) -> RunRecord:
    """A two-attempt run: attempt 1 fails pytest, attempt 2 passes every gate; two training jobs."""
    record = RunRecord.create(
        milestone_id="demo-tiny", spec_hash="5e" * 32, agent={"backend": "anthropic", "model": "claude-sonnet-4-5"},
        base_commit="1234567890abcdef1234567890abcdef12345678", branch="temper/demo-tiny/r1", worktree=root / "wt",
        runs_root=root / "runs", run_id="20250101-120000-demo-tiny-abc123", system_prompt="You are a senior ML systems engineer.",
    )
    record.user_message("# Milestone `demo-tiny`: Add an inverse-square-root learning-rate schedule\n...")
    read = ToolCall("t1", "read", {"path": "engine/config.py", "start": 30, "end": 40})
    record.llm_call(AgentTurn("I'll read the config first.", (read,), "tool_use", Usage(2400, 120, 0, 2200, 0.0123), "claude-sonnet-4-5"))
    record.tool_call(read)
    record.tool_result(ToolResult("t1", 'LR_SCHEDULES = ("cosine", "wsd", "constant", "linear")\n<script>alert(1)</script>'))
    patch = ToolCall("t2", "apply_patch", {"patch": "--- a/engine/config.py\n+++ b/engine/config.py\n"})
    record.llm_call(AgentTurn("Adding the schedule.", (patch, ToolCall("t3", "submit", {"summary": "done"})), "tool_use",
                              Usage(3100, 400, 2200, 0, 0.0201), "claude-sonnet-4-5"))
    record.tool_call(patch)
    record.tool_result(ToolResult("t2", "patch failed: hunk 1 does not apply; closest lines: 33", is_error=True))
    record.tool_result(ToolResult("t3", "submitted", submitted=True))

    diff1 = "diff --git a/engine/config.py b/engine/config.py\n--- a/engine/config.py\n+++ b/engine/config.py\n@@ -33 +33 @@\n-LR_SCHEDULES = (\"cosine\", \"wsd\", \"constant\", \"linear\")\n+LR_SCHEDULES = (\"cosine\", \"wsd\", \"constant\", \"linear\", \"inverse_sqrt\")\n"
    gates1 = (GateResult("protected", "protected", True, "64 protected files unchanged", duration_s=0.4),
              GateResult("guards", "guards", True, "no findings", duration_s=1.2),
              GateResult("pytest", "pytest", False, "2 failed, 2 passed (4 collected)",
                         failing_tests=("tests/milestones/test_demo_tiny.py::test_decay_is_inverse_square_root",),
                         log_tail="E   assert 0.005 == 0.00447 ± 4.5e-09", duration_s=31.0),
              GateResult("train", "job", False, "not run", skipped=True),
              GateResult("metrics", "metrics", False, "not run", skipped=True))
    for g in gates1[:3]:
        record.gate_started(1, g.name, g.kind)
        record.gate_result(1, g)
    record.attempt(Verdict(1, False, gates1, commit="a1" * 20, reason="gate pytest failed"), diff1)
    record.user_message("Attempt 1 was rejected: gate `pytest` (pytest) failed ...")
    record.llm_call(AgentTurn("The decay branch was missing.", (ToolCall("t4", "submit", {}),), "tool_use",
                              Usage(5200, 300, 5000, 0, None), "claude-sonnet-4-5"))  # price unknown -> cost unknown
    record.tool_call(ToolCall("t4", "submit", {}))
    record.tool_result(ToolResult("t4", "submitted", submitted=True))

    for name, scale in (("train", 1.0), ("train-ref", 1.01)):
        job_dir = record.job_dir(name)
        record.job_started(name, ["pretrain", "--preset", "tiny", "--run-dir", str(job_dir)], attempt=2, log=job_dir / "log")
        lines = "\n".join(loss_line(s, scale) for s in range(1, 21))
        with (job_dir / "log").open("w") as log:
            subprocess.run([sys.executable, "-c", f"print('engine 0.1 / torch x'); print({lines!r})"], stdout=log, check=True)
        record.job_finished(name, attempt=2, exit_code=0, duration_s=5.5)
    # A job that only left its JSONL twin (the launcher's log was lost).
    twin_dir = record.job_dir("twin-only")
    (twin_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "global_loss": loss_curve(s), "mfu": 0.5}) + "\n" for s in range(1, 6))
                                            + '{"step": 6, "global_lo')  # killed mid-line

    diff2 = diff1 + "diff --git a/engine/optim/schedule.py b/engine/optim/schedule.py\n--- a/engine/optim/schedule.py\n+++ b/engine/optim/schedule.py\n@@ -40,0 +41,2 @@\n+    if name == \"inverse_sqrt\":\n+        return peak * min(step / w, math.sqrt(w / step))\n"
    gates2 = (GateResult("protected", "protected", True, "64 protected files unchanged"),
              GateResult("guards", "guards", True, "no findings"),
              GateResult("pytest", "pytest", True, "4 passed (4 collected)"),
              GateResult("train", "job", True, "exit 0 in 5.5 s"),
              GateResult("metrics", "metrics", True, "2 of 2 rules hold", metrics={"train.steps": 20.0, "train.final_loss": 2.73}))
    record.attempt(Verdict(2, True, gates2, commit="b2" * 20, flags=("speed-up 12x over baseline: check",)), diff2)
    record.finish("accepted")
    return record


class _Checker(html.parser.HTMLParser):
    """Parses the page and checks that every non-void tag is closed in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.imgs: list[str] = []
        self.urls: list[str] = []
        self.tags: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.imgs.append(attrs.get("src", ""))
        for key in ("src", "href"):
            if key in attrs and not attrs[key].startswith(("data:", "#")):
                self.urls.append(attrs[key])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    record = build_run(root)
    path = write_report(record.dir)
    return record, path, path.read_text()


def test_report_is_readable_by_others_as_the_umask_allows(report):
    """A page to share: what the umask gives a new file (0644 under 022), not the records' private 0600."""
    umask = os.umask(0o022)
    os.umask(umask)
    assert report[1].stat().st_mode & 0o777 == 0o666 & ~umask, oct(report[1].stat().st_mode)


def test_report_is_wellformed_and_self_contained(report):
    record, path, page = report
    assert path == record.dir / "report.html" and page.startswith("<!DOCTYPE html>")
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.problems == [] and checker.stack == []
    assert checker.urls == []  # nothing is fetched: no external src / href
    assert "<link" not in page and "<script" not in page and "url(" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # tool output is escaped, never executed


def test_report_embeds_real_svg_plots(report):
    """The plots are inline SVG (the report's one plotting path): well-formed, readable size, one polyline point
    per logged step of each job (20 steps for train and train-ref, 5 in twin-only's metrics.jsonl)."""
    _, _, page = report
    checker = _Checker()
    checker.feed(page)
    # overlay of the three jobs + one loss/MFU figure per job
    assert len(checker.imgs) == 4
    counts = []
    for src in checker.imgs:
        assert src.startswith("data:image/svg+xml;base64,")
        svg = ElementTree.fromstring(base64.b64decode(src.split(",", 1)[1], validate=True))
        assert float(svg.get("width")) > 400 and float(svg.get("height")) > 150
        counts.append([len(p.get("points").split()) for p in svg.iter("{http://www.w3.org/2000/svg}polyline")])
    assert counts == [[20, 20, 5], [20, 20], [20, 20], [5, 5]]  # loss and MFU per job


def test_report_job_table_matches_the_logged_numbers(report):
    _, _, page = report
    rows = dict(re.findall(r"<tr data-job='([^']+)'>(.*?)</tr>", page))
    assert set(rows) == {"train", "train-ref", "twin-only"}
    cells = re.findall(r"<td[^>]*>(.*?)</td>", rows["train"])
    # Independent reference: the generator's own formula, rounded as the table prints (.6g).
    assert cells[1] == "20"
    assert cells[2] == f"{loss_curve(1):.6g}" and cells[3] == f"{loss_curve(20):.6g}" and cells[4] == f"{loss_curve(20):.6g}"
    mfus = sorted(0.40 + s * 0.002 for s in range(1, 21))
    assert cells[5] == f"{(mfus[9] + mfus[10]) / 2 * 100:.2f} %"
    assert cells[7] == "2,048"
    assert cells[8] == "log"
    twin = re.findall(r"<td[^>]*>(.*?)</td>", rows["twin-only"])
    assert twin[1] == "5" and twin[5] == "50.00 %"
    assert twin[8] == "metrics.jsonl (1 unreadable line skipped)"


def test_report_shows_header_verdicts_attempts_and_timeline(report):
    record, _, page = report
    assert "demo-tiny" in page and "claude-sonnet-4-5" in page and ">accepted<" in page
    assert "<b>cost</b>unknown" in page  # one call had no price
    assert "<b>tokens in</b>10,700" in page and "<b>tokens out</b>820" in page and "<b>cache read</b>7,200" in page
    final = page[page.index("<h2>Final verdict</h2>"):page.index("<h2>Jobs</h2>")]
    assert "ACCEPTED" in final and "attempt 2" in final and "every gate passed" in final
    assert "flag: speed-up 12x over baseline: check" in final and "train.final_loss = 2.73" in final
    attempts = page[page.index("<h2>Attempts</h2>"):page.index("<h2>Timeline</h2>")]
    assert "id='attempt-1'" in attempts and "id='attempt-2'" in attempts
    assert "failed gate <b>pytest</b>" in attempts and "test_decay_is_inverse_square_root" in attempts
    assert attempts.count("<details><summary>diff:") == 2 and "diff: 2 files, +3 / -1" in attempts
    assert "<span class=\"add\">+    if name == &quot;inverse_sqrt&quot;:</span>" in attempts
    timeline = page[page.index("<h2>Timeline</h2>"):]
    events = read_events(record.dir / "events.jsonl").events
    assert timeline.count("<tr><td>") == len(events)
    for kind in ("run_started", "user_message", "llm_call", "tool_call", "tool_result", "gate_started", "gate_result",
                 "job_started", "job_finished", "attempt", "run_finished"):
        assert f"<td>{kind}</td>" in timeline, kind
    assert timeline.count(">FAIL<") == 1 and "patch failed: hunk 1 does not apply" in timeline


def test_report_of_a_crashed_running_run(tmp_path):
    record = RunRecord.create(milestone_id="demo-tiny", spec_hash="0" * 64, agent={"backend": "replay"}, base_commit="0" * 40,
                              branch="b", worktree="/w", runs_root=tmp_path)
    record.user_message("go")
    with (record.dir / "events.jsonl").open("ab") as fh:
        fh.write(b'{"seq": 2, "ts": "2025-')  # the crash
    page = render_report(record.dir)
    assert "truncated line" in page and "no attempt was judged" in page and "No job ran." in page
    assert ">running<" in page
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        render_report(tmp_path)


def test_chart_alt_text_names_what_the_chart_shows(tmp_path):
    """A CPU job prints mfu=0.0000 (no peak to hold it against): its chart shows step time, and its alt text says so
    instead of naming an MFU it does not have. A GPU job's chart and alt text name MFU."""
    record = RunRecord.create(milestone_id="demo-tiny", spec_hash="0" * 64, agent={"backend": "replay"}, base_commit="0" * 40,
                              branch="b", worktree="/w", runs_root=tmp_path)
    for name, mfu in (("cpu-train", 0.0), ("gpu-train", 0.42)):
        job_dir = record.job_dir(name)
        (job_dir / "log").write_text("".join(
            f"[LOSS] step={s} global_loss={loss_curve(s):.9e} grad_norm={1.0:.9e} lr={3e-4:.6e} tokens=2048 "
            f"time_s={0.25:.6f} mfu={mfu:.4f}\n" for s in range(1, 6)))
    alts = re.findall(r"<img alt='([^']*)'", render_report(record.dir))
    assert alts == ["loss of every job", "cpu-train: loss and step time (no MFU: CPU job)",
                    "gpu-train: loss and MFU (engine-reported, Megatron count)"]


_BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
# A page beside the report that loads it in a frame and measures what the browser rendered: the report itself is
# tested unchanged (it carries no script of its own).
_PROBE = """<!DOCTYPE html><html><body><pre id="probe">not loaded</pre>
<iframe id="report" src="report.html" style="width:1280px;height:4000px"></iframe>
<script>
document.getElementById("report").addEventListener("load", function () {
  var doc = this.contentDocument;
  var imgs = Array.prototype.map.call(doc.images, function (img) {
    var box = img.getBoundingClientRect();
    return {alt: img.alt, complete: img.complete, natural: [img.naturalWidth, img.naturalHeight],
            shown: [box.width, box.height], display: getComputedStyle(img).display};
  });
  var h2 = Array.prototype.map.call(doc.querySelectorAll("h2"), function (h) { return h.textContent; });
  document.getElementById("probe").textContent = JSON.stringify({title: doc.title, h2: h2, imgs: imgs});
});
</script></body></html>"""


@pytest.mark.skipif(_BROWSER is None, reason="no headless Chromium on this machine (apt-get install chromium)")
def test_report_renders_in_a_real_browser_with_visible_charts_and_no_console_errors(report, tmp_path):
    record, path, _ = report
    probe = path.parent / "browser-probe.html"
    probe.write_text(_PROBE, encoding="utf-8")
    try:
        proc = subprocess.run(
            [_BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0",
             "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    finally:
        probe.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.DOTALL).group(1)))
    assert seen["title"] == f"Temper run {record.id} (accepted)"
    assert seen["h2"][-4:] == ["Final verdict", "Jobs", "Attempts", "Timeline"]
    # The overlay and one figure per job (as in the SVG test above), each decoded and laid out at a readable size.
    assert [i["alt"] for i in seen["imgs"]] == ["loss of every job", "train: loss and MFU (engine-reported, Megatron count)",
                                               "train-ref: loss and MFU (engine-reported, Megatron count)",
                                               "twin-only: loss and MFU (engine-reported, Megatron count)"]
    for img in seen["imgs"]:
        assert img["complete"] and img["natural"][0] > 400 and img["natural"][1] > 150, img
        assert img["display"] != "none" and img["shown"][0] > 400 and img["shown"][1] > 100, img
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
