"""`python -m guards check` as a real subprocess: exit codes, both output formats, defaults, delegation."""

import json
import re
from collections import Counter

from guards_testkit import FIXTURES, REPO, actual_findings, check_fixture, run_cli

LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<rule>[a-z-]+) (?P<message>\S.*)$")


def test_text_output_one_line_per_finding_exit_1():
    root = FIXTURES / "dag_bad"
    proc = run_cli(["check", ".", "--config", "guards.toml"], cwd=root)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    from_cli = Counter((m["path"], int(m["line"]), m["rule"]) for m in parsed)
    assert from_cli == actual_findings(check_fixture("dag_bad"))


def test_json_output_is_a_list_of_findings():
    root = FIXTURES / "failfast_bad"
    proc = run_cli(["check", "engine", "--format", "json"], cwd=root)
    assert proc.returncode == 1, proc.stderr
    findings = json.loads(proc.stdout)
    assert isinstance(findings, list) and len(findings) == len(check_fixture("failfast_bad"))
    for item in findings:
        assert list(item) == ["rule", "path", "line", "col", "message"]
        assert item["rule"] == "fail-fast" and item["path"] == "engine/handlers.py"
        assert isinstance(item["line"], int) and isinstance(item["col"], int) and item["message"]


def test_clean_tree_exits_0_in_both_formats():
    root = FIXTURES / "surface_clean"
    text = run_cli(["check"], cwd=root)  # default PATHs: engine/ harness/ guards/ next to guards.toml
    assert (text.returncode, text.stdout) == (0, ""), text.stderr
    as_json = run_cli(["check", "--format", "json"], cwd=root / "engine" / "ops")  # guards.toml found upward
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []


def test_the_summary_line_says_how_many_files_were_checked_and_what_was_found():
    """The last line a person reads: "N files checked, no findings", or the findings with the files they are in."""
    clean = run_cli(["check"], cwd=FIXTURES / "surface_clean")
    checked = len(list((FIXTURES / "surface_clean").rglob("*.py")))
    assert re.fullmatch(rf"guards: {checked} files? checked, no findings \(\d+\.\d\d s\)\n", clean.stderr), clean.stderr
    bad = run_cli(["check", "engine", "--format", "json"], cwd=FIXTURES / "failfast_bad")
    found = json.loads(bad.stdout)
    files_with = len({f["path"] for f in found})
    scanned = len(list((FIXTURES / "failfast_bad" / "engine").rglob("*.py")))
    assert re.fullmatch(rf"guards: {len(found)} findings? in {files_with} of {scanned} files? checked \(\d+\.\d\d s\)\n",
                        bad.stderr), bad.stderr


def test_default_paths_from_a_subfolder():
    proc = run_cli(["check", "--format", "json"], cwd=FIXTURES / "dag_bad" / "engine" / "model")
    assert proc.returncode == 1
    assert any(f["path"].endswith("engine/stray.py") and f["rule"] == "dag" for f in json.loads(proc.stdout))


def test_rules_filter():
    root = FIXTURES / "ssot_bad"
    assert run_cli(["check", "--rules", "fail-fast,dag"], cwd=root).returncode == 0
    only = run_cli(["check", "--rules", "ssot", "--format", "json"], cwd=root)
    assert only.returncode == 1 and {f["rule"] for f in json.loads(only.stdout)} == {"ssot"}


def test_bad_usage_and_config_exit_2(tmp_path):
    root = FIXTURES / "ssot_bad"
    cases = {
        "unknown rule": (["check", "--rules", "nope"], root),
        "missing path": (["check", "no/such/dir"], root),
        "missing config": (["check", "--config", str(tmp_path / "missing.toml")], root),
        "no config upward": (["check"], tmp_path),
        "bad format": (["check", "--format", "xml"], root),
        "no command": ([], root),
    }
    for name, (args, cwd) in cases.items():
        proc = run_cli(args, cwd=cwd)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert "error" in proc.stderr and "Traceback" not in proc.stderr, (name, proc.stderr)
    (tmp_path / "guards.toml").write_text('[ssot]\nenv_whitelist = "ENV_WHITELIST.md"\n')
    (tmp_path / "ENV_WHITELIST.md").write_text("| name |\n| --- |\n| RANK |\n")
    proc = run_cli(["check", str(root)], cwd=tmp_path)
    assert proc.returncode == 2 and "ENV_WHITELIST.md:3" in proc.stderr and "backticks" in proc.stderr


def test_help_exits_0():
    proc = run_cli(["check", "--help"], cwd=REPO)
    assert proc.returncode == 0 and "--rules" in proc.stdout


def test_temper_guards_check_delegates():
    root = FIXTURES / "failfast_bad"
    proc = run_cli(["guards", "check", "--config", str(root / "guards.toml"), str(root / "engine")], cwd=REPO,
                   module="harness")
    assert proc.returncode == 1 and "fail-fast" in proc.stdout
    clean = run_cli(["guards", "check"], cwd=FIXTURES / "failfast_clean", module="harness")
    assert clean.returncode == 0, clean.stdout + clean.stderr
