"""`# guard: allow <rule> -- <reason>` and what happens when it is malformed; parse errors never crash a run."""

from guards_testkit import FIXTURES, actual_findings, check_fixture, expected_findings, line_of

MARKED = FIXTURES / "suppressions/engine/marked.py"


def _findings_by_line():
    found: dict[int, list[str]] = {}
    for f in check_fixture("suppressions"):
        assert f.path == "engine/marked.py"
        found.setdefault(f.line, []).append(f.rule)
    return {line: sorted(rules) for line, rules in found.items()}


def test_suppressions_with_a_reason_silence_their_line_or_the_next():
    found = _findings_by_line()
    assert line_of(MARKED, "top-level crash reporter") not in found  # trailing comment, same line
    assert line_of(MARKED, "best-effort cleanup") + 1 not in found  # comment-only line covers the next
    assert line_of(MARKED, "both ids are known") not in found  # `allow ssot, fail-fast`


def test_suppression_without_reason_is_a_finding_and_suppresses_nothing():
    line = next(i for i, text in enumerate(MARKED.read_text().splitlines(), 1) if text.endswith("# guard: allow fail-fast"))
    assert _findings_by_line()[line] == ["fail-fast", "suppression"]


def test_suppression_naming_an_unknown_rule_is_a_finding():
    line = line_of(MARKED, "allow fail-slow")
    assert _findings_by_line()[line] == ["fail-fast", "suppression"]
    message = next(f.message for f in check_fixture("suppressions") if f.line == line and f.rule == "suppression")
    assert "'fail-slow'" in message and "fail-fast" in message


def test_malformed_suppression_is_a_finding():
    assert _findings_by_line()[line_of(MARKED, "allow-all please")] == ["suppression"]


def test_suppression_only_covers_the_rule_it_names_and_its_own_place():
    found = _findings_by_line()
    assert found[line_of(MARKED, "names the wrong rule")] == ["fail-fast"]
    assert found[line_of(MARKED, "covers only its own line") + 1] == ["fail-fast"]


def test_exactly_these_findings():
    assert len(check_fixture("suppressions")) == 7


def test_unparsable_files_are_findings_and_the_rest_is_still_checked():
    expected = expected_findings("parse_error")
    assert sum(1 for (_, _, rule) in expected if rule == "parse-error") == 5
    assert actual_findings(check_fixture("parse_error")) == expected  # latin1_ok.py (declared cookie) is clean
