"""`python -m guards check [PATH ...]` (also `temper guards check ...`).

Exit codes: 0 no findings, 1 findings, 2 bad usage or a missing / malformed guards.toml or whitelist.
Without PATHs it checks the project's engine/, harness/ and guards/ next to the guards.toml found
by walking up from the working folder (or the one --config names).
"""

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from guards.config import GuardsConfigError, find_config, load_config
from guards.report import FORMATS, summary
from guards.rules import RULES
from guards.runner import DEFAULT_PACKAGES, check_paths

__all__ = ["main", "build_parser", "ParserStop", "ReturningParser"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class ParserStop(Exception):
    """argparse wanted to exit (help or a usage error); main() returns the status instead."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class ReturningParser(argparse.ArgumentParser):
    """argparse that raises ParserStop instead of calling sys.exit, so main() returns the status
    (the `temper` CLI uses it too). Usage errors are exit status 2."""

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:  # type: ignore[override]
        if message:
            sys.stderr.write(message)
        raise ParserStop(status)

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ReturningParser(prog="python -m guards", description="AST guards for the engine's red lines.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ReturningParser)
    check = sub.add_parser("check", help="check files and folders (default: engine harness guards)",
                           description="Report every broken red line as `path:line:col: <rule-id> <message>`. "
                                       "Suppress one line with `# guard: allow <rule-id> -- <reason>`.")
    check.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to check")
    check.add_argument("--format", choices=sorted(FORMATS), default="text", help="output format (default: text)")
    check.add_argument("--rules", default="", metavar="R1,R2",
                       help=f"only these rules (default: all of {', '.join(RULES)})")
    check.add_argument("--config", default="", metavar="GUARDS.TOML",
                       help="config file (default: the nearest guards.toml in the working folder or a parent)")
    sub.add_parser("rules", help="list the rule ids and what each checks")
    return parser


def _fail(message: str) -> int:
    print(f"guards: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(Path(args.config) if args.config else find_config(Path.cwd()))
    except GuardsConfigError as err:
        return _fail(str(err))
    rule_ids = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in rule_ids if r not in RULES]
    if unknown:
        return _fail(f"unknown rule {', '.join(map(repr, unknown))} in --rules; choose from {', '.join(RULES)}")
    if args.paths:
        paths = [Path(p) for p in args.paths]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            return _fail(f"no such file or folder: {', '.join(missing)}")
    else:
        paths = [config.root / name for name in DEFAULT_PACKAGES if (config.root / name).is_dir()]
        if not paths:
            return _fail(f"none of {', '.join(DEFAULT_PACKAGES)} exists next to {config.path}; pass PATHs to check")
    started = time.perf_counter()
    result = check_paths(paths, config, rule_ids or None)
    sys.stdout.write(FORMATS[args.format](result.findings))
    files_with = len({f.path for f in result.findings})
    print(f"guards: {summary(len(result.findings), files_with, result.files)} ({time.perf_counter() - started:.2f} s)",
          file=sys.stderr)
    return EXIT_FINDINGS if result.findings else EXIT_CLEAN


def _list_rules() -> int:
    for rule_id, rule in RULES.items():
        print(f"{rule_id:15} {rule.summary}")
    print(f"{'suppression':15} `# guard: allow <rule-id> -- <reason>` comments that lack a reason or name no rule")
    print(f"{'parse-error':15} files that cannot be read or parsed (never skipped silently)")
    return EXIT_CLEAN


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except ParserStop as stop:
        return stop.status
    if args.command == "rules":
        return _list_rules()
    return _check(args)
