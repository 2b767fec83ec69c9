"""The `temper` command. Each subcommand imports its module lazily so `temper guards check` stays fast
and `temper demo` needs no LLM SDK.

Exit codes: 0 success / accepted, 1 rejected or failed, 2 bad usage or bad spec (130: interrupted, 143: terminated).
"""

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from guards.cli import ParserStop, ReturningParser  # the same non-exiting argparse as `python -m guards`

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NEEDS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool whose reader closed the pipe
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (a timeout, the user's kill), raised like Ctrl-C's KeyboardInterrupt: every `finally` and `with` the
    command is in runs as for Ctrl-C (scratch worktrees of the user's repository, the judge's temp folders, the
    processes it started), where Python's default for SIGTERM would end the process with none of them."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises Terminated while the command runs; the previous handler is restored afterwards. Only the main
    thread can set a handler (main() called from another thread keeps Python's default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

_EPILOG = """examples:
  temper doctor --requires gpu                       what this machine can run: python, torch, GPU, kernels, SLURM, keys
  temper demo                                        the README demo: a replayed agent on CPU, a few minutes
  temper run demo-tiny --agent anthropic:claude-sonnet-4-5
  temper run demo-tiny --agent openai-compatible:http://localhost:8000/v1#qwen3-coder --max-turns 60
  temper gate demo-tiny --patch runs/<id>/attempts/2/diff.patch
  temper milestones                                  each milestone with the hardware it needs and its goal
  temper resume <run-id>
  temper runs
  temper report <run-id>

exit codes: 0 accepted / success, 1 rejected / failed, 2 bad usage or spec, 3 this machine lacks the
hardware or the shared data the milestone needs (nothing was judged), 130 interrupted"""


_UNSANDBOXED = ("run candidate code (tests, jobs) without the OS sandbox, with your rights: local experiments only; "
                "every verdict then says 'unsandboxed'")


def build_parser() -> argparse.ArgumentParser:
    parser = ReturningParser(prog="temper", description="Drive an LLM agent through a milestone; judge every attempt with gates "
                     "it cannot edit.", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ReturningParser, metavar="COMMAND")

    run = sub.add_parser("run", help="run an agent on a milestone until its gates pass or its budget is spent")
    run.add_argument("milestone", help="milestone id (milestones/<id>.toml) or a path to a .toml")
    run.add_argument("--agent", required=True, metavar="SPEC",
                     help="anthropic:<model> | openai:<model> | openai-compatible:<base_url>#<model> | cli:claude-code | "
                          "cli:codex | replay:<trajectory.jsonl>")
    for name, kind, what in (("max-turns", int, "model calls"), ("max-tokens", int, "input + output tokens"),
                             ("max-cost-usd", float, "dollars (unknown prices never count)"),
                             ("max-wall-s", float, "seconds of wall time"), ("max-attempts", int, "judged attempts")):
        run.add_argument(f"--{name}", type=kind, default=None, metavar="N", help=f"budget: {what} (default: the milestone's)")
    run.add_argument("--agent-option", action="append", default=[], metavar="KEY=VALUE",
                     help="a keyword option of the agent backend, e.g. model=opus or executable=/opt/claude "
                          "(VALUE as JSON when it parses, else a string; repeatable)")
    run.add_argument("--max-output-tokens", type=int, default=16_384, metavar="N", help="output limit of each model call")
    run.add_argument("--merge", action="store_true", help="merge the accepted attempt into your checkout's branch")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument("--unsandboxed", action="store_true", help=_UNSANDBOXED)

    gate = sub.add_parser("gate", help="judge your uncommitted changes (or --patch) with a milestone's gates, no agent")
    gate.add_argument("milestone")
    gate.add_argument("--patch", type=Path, default=None, metavar="FILE", help="a diff to judge on the base instead")
    gate.add_argument("--base", default="HEAD", metavar="REV", help="the commit to judge against (default: HEAD)")
    gate.add_argument("--json", action="store_true",
                      help="print the verdict as JSON on stdout (progress stays on stderr; --quiet drops it)")
    gate.add_argument("--quiet", action="store_true", help="no progress lines on stderr (the verdict is still printed)")
    gate.add_argument("--unsandboxed", action="store_true", help=_UNSANDBOXED)
    gate.add_argument("--judge-seed", type=int, default=None, metavar="N",
                      help="replay a judging: its secret (a verdict's \"seed\"): the same draw, held-out windows and secret steps")
    gate.add_argument("--draw", default=None, metavar="FILE|JSON",
                      help="judge with these drawn values (a verdict.json, its \"draw\", or {name: value}) over the secret's draw")

    listing = sub.add_parser("milestones", help="list the milestones: id, the hardware each needs, its goal in one line")
    listing.add_argument("--json", action="store_true", help="print the milestones as JSON on stdout")

    resume = sub.add_parser("resume", help="continue a stopped or crashed run from its records")
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.add_argument("--merge", action="store_true", help="merge the accepted attempt into your checkout's branch")
    resume.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    runs = sub.add_parser("runs", help="list the runs under runs/")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    runs.add_argument("--prune", action="store_true",
                      help="remove the worktrees and temper/<id> branches of finished runs (accepted, rejected, out of "
                           "budget) and say what was removed; records stay, resumable runs are left alone")

    report = sub.add_parser("report", help="write runs/<id>/report.html (self-contained)")
    report.add_argument("run_id", metavar="RUN_ID")

    demo = sub.add_parser("demo", help="the README demo: a replayed agent fails a guard, fixes it, passes every gate")
    demo.add_argument("--quiet", action="store_true", help="no progress lines on stderr")

    doctor = sub.add_parser("doctor", help="preflight: what this machine can run (exit 0 when every required check passes)",
                            description="Checks Python, torch and the engine, git, pytest, the sandbox, GPUs, kernel "
                                        "libraries, NCCL, SLURM and its account, API keys (said set or missing, never "
                                        "printed) and the data folder. The base checks are always required; --requires "
                                        "adds more. Exit 0: every required check passed; 1: one failed; 2: bad usage.")
    doctor.add_argument("--requires", default="", metavar="LIST",
                        help="comma-separated: gpu, slurm, llm, multi-node, data (e.g. --requires gpu,slurm)")
    doctor.add_argument("--json", action="store_true", help="print every check as JSON on stdout")

    guards = sub.add_parser("guards", help="AST red-line checks (same as python -m guards)", add_help=False)
    guards.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _progress(quiet: bool):  # noqa: ANN202 -- harness.progress.Progress, imported lazily
    from harness.progress import Progress

    return Progress(quiet=quiet)


def _print_outcome(outcome) -> int:  # noqa: ANN001
    print(f"run {outcome.run_id}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
    if outcome.discarded:
        print(f"  it did no work: its worktree, branch temper/{outcome.run_id} and records were removed")
        return EXIT_FAILED
    print(f"  records: {outcome.run_dir}")
    if outcome.report is not None:
        print(f"  report:  {outcome.report}")
    if outcome.merged:
        print(f"  merged into your checkout: HEAD is now {outcome.merged[:12]}")
    if outcome.merge_error:
        print(f"  merge: {outcome.merge_error}", file=sys.stderr)
    if outcome.status == "accepted" and not outcome.merge_error:
        return EXIT_OK
    return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    from harness.protocol import LoopOptions
    from harness.session import UsageError, start_run

    budget = {"max_turns": args.max_turns, "max_tokens": args.max_tokens, "max_cost_usd": args.max_cost_usd,
              "max_wall_s": args.max_wall_s, "max_attempts": args.max_attempts}
    options = {}
    for item in args.agent_option:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"--agent-option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    outcome = start_run(args.milestone, args.agent, budget=budget, merge=args.merge, progress=_progress(args.quiet),
                        options=LoopOptions(max_output_tokens=args.max_output_tokens), agent_options=options,
                        unsandboxed=args.unsandboxed)
    return _print_outcome(outcome)


def _resume(args: argparse.Namespace) -> int:
    from harness.session import resume_run

    return _print_outcome(resume_run(args.run_id, merge=args.merge, progress=_progress(args.quiet)))


def _gate(args: argparse.Namespace) -> int:
    from harness.gate import gate_candidate

    verdict, run_dir = gate_candidate(args.milestone, patch=args.patch, base=args.base, progress=_progress(args.quiet),
                                      unsandboxed=args.unsandboxed, judge_seed=args.judge_seed, draw=args.draw)
    from harness.judge import verdict_text
    if args.json:
        print(json.dumps({**verdict.to_json(), "run_dir": str(run_dir)}, indent=2))
    else:
        print(verdict_text(verdict))
        print(f"records and report: {run_dir}")
    return EXIT_OK if verdict.accepted else EXIT_FAILED


def _print_table(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _milestones(args: argparse.Namespace) -> int:
    from harness.judge.hardware import NeedsHardware, check_data, check_requires, probe_machine
    from harness.session import load_spec
    from harness.settings import data_dir, temper_home

    home = temper_home()
    data = data_dir(home)

    def why_not_here(m) -> str:  # noqa: ANN001 -- harness.spec.Milestone
        """"" when this machine can judge the milestone, else why not, as `temper gate` would say it."""
        try:
            check_requires(m.requires, machine)
        except NeedsHardware as err:
            return str(err).partition("; ")[2] or str(err)
        try:
            check_data(m, data)
        except NeedsHardware:
            return f"{data} lacks the data its jobs read (set TEMPER_DATA; temper doctor --requires data)"
        return ""

    rows = [load_spec(p.stem, home) for p in sorted((home / "milestones").glob("*.toml"))]
    # once: the judge's own view (nvidia-smi; sinfo where a milestone needs SLURM), as `temper gate` will see it
    machine = probe_machine(slurm=any(m.requires.slurm for m in rows))
    here = {m.id: why_not_here(m) for m in rows}
    if args.json:
        print(json.dumps([{"id": m.id, "title": m.title, "requires": m.requires.model_dump(), "needs": m.requires.describe(),
                           "runs_here": not here[m.id], "why_not_here": here[m.id], "editable": m.editable}
                          for m in rows], indent=2))
        return EXIT_OK
    _print_table([("MILESTONE", "NEEDS", "HERE", "GOAL")] +
                 [(m.id, m.requires.describe(), "yes" if not here[m.id] else f"no: {here[m.id]}", m.title) for m in rows])
    return EXIT_OK


def _age(started: str, now: float) -> str:
    from datetime import datetime

    try:
        seconds = now - datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{max(int(seconds), 0)}s ago"


def _runs(args: argparse.Namespace) -> int:
    import time

    from harness.records import list_runs

    if args.prune:
        from harness.session import prune_runs

        removed = prune_runs()
        print("\n".join(removed) if removed else "nothing to prune: no finished run left a worktree or branch")
        return EXIT_OK
    rows = list_runs()
    if args.json:
        print(json.dumps([{"id": r.id, "milestone": r.milestone_id, "status": r.status, "agent": r.agent, "started": r.started,
                           "ended": r.ended, "turns": r.turns, "tokens": r.tokens, "cost_usd": r.cost_usd,
                           "attempts": r.attempts, "verdict": r.verdict, "problem": r.problem, "path": str(r.path)}
                          for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print("no runs yet (temper run MILESTONE --agent SPEC, or temper demo)")
        return EXIT_OK
    now = time.time()
    header = ("RUN", "MILESTONE", "STATUS", "ATT", "VERDICT", "AGE", "AGENT", "COST")
    _print_table([header] + [(r.id, r.milestone_id, r.status or "?", str(r.attempts), r.verdict or "-", _age(r.started, now),
                              r.agent, "unknown" if r.cost_usd is None else f"${r.cost_usd:.2f}")
                             if not r.problem else (r.id, "", "unreadable", "", r.problem, "", "", "") for r in rows])
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from harness.report import write_report
    from harness.settings import runs_dir

    folder = Path(args.run_id) if Path(args.run_id).is_dir() else runs_dir() / args.run_id
    if not (folder / "run.json").is_file():
        print(f"temper report: no run {args.run_id!r} under {runs_dir()} (see `temper runs`)", file=sys.stderr)
        return EXIT_USAGE
    print(write_report(folder))
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from harness.demo import run_demo

    return run_demo(progress=_progress(args.quiet))


def _doctor(args: argparse.Namespace) -> int:
    from harness.doctor import main as doctor

    return doctor(args.requires, args.json)


_COMMANDS = {"run": _run, "gate": _gate, "milestones": _milestones, "resume": _resume, "runs": _runs, "report": _report,
             "demo": _demo, "doctor": _doctor}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["guards"]:
        from guards.cli import main as guards_main

        return guards_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except ParserStop as stop:
        return stop.status
    from harness.session import UsageError
    from harness.spec import NeedsHardware  # not from the judge, which imports torch: seconds `temper runs` does not need

    try:
        with _sigterm_raises():
            status = _COMMANDS[args.command](args)
            sys.stdout.flush()  # here, so a closed pipe (`temper doctor --json | head`) is caught below
        return status
    except BrokenPipeError:
        # The reader went away (head, a pager): stop quietly, as a tool killed by SIGPIPE would; point stdout at
        # /dev/null so the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except NeedsHardware as err:
        print(f"temper {args.command}: {err}", file=sys.stderr)
        return EXIT_NEEDS
    except UsageError as err:
        print(f"temper {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated:
        print(f"temper {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"temper {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
