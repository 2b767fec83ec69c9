"""The `temper` command. Each subcommand imports its module lazily so `temper guards check` stays fast.

Exit codes: 0 success / accepted, 1 rejected or failed, 2 bad usage or bad spec.
"""

import sys

__all__ = ["main"]

_USAGE = """usage: temper <command> [args]

commands:
  guards check [PATH ...]   AST red-line checks (ssot, dag, public-surface, fail-fast)
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "guards":
        from guards.cli import main as guards_main

        return guards_main(rest)
    print(f"temper: unknown command {command!r}\n{_USAGE}", file=sys.stderr)
    return 2
