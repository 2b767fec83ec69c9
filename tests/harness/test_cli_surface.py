"""The `temper` command's surface as a user meets it: every option says what it does in --help, and a reader that
closes the pipe early (`temper doctor --json | head`) ends the command quietly, not in a traceback."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from harness.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def test_every_option_of_every_subcommand_has_help():
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [f"temper {name} {'/'.join(action.option_strings) or action.dest}"
               for name, command in sub.choices.items() if name != "guards"  # guards forwards to python -m guards
               for action in command._actions
               if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
               and action.option_strings]
    assert missing == []


def test_a_closed_pipe_ends_the_command_without_a_traceback(tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", "milestones", "--json"], stdout=write, cwd=REPO,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO), "TEMPER_RUNS_DIR": str(tmp_path)})
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr  # 128 + SIGPIPE, as a shell reports such a tool
