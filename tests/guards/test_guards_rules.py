"""Every rule against fixtures that must be flagged (line by line) and fixtures that must stay clean."""

import pytest
from guards_testkit import FIXTURES, actual_findings, check_fixture, expected_findings

BAD = ["ssot_bad", "dag_bad", "surface_bad", "failfast_bad", "isolation_bad", "execroute_bad", "recognition_bad"]
CLEAN = ["ssot_clean", "dag_clean", "surface_clean", "failfast_clean", "isolation_clean", "execroute_clean",
         "recognition_clean"]
RULE_IDS = ("ssot", "dag", "public-surface", "fail-fast", "isolation", "exec-route", "recognition")


@pytest.mark.parametrize("fixture", BAD)
def test_bad_fixture_flags_exactly_the_marked_lines(fixture):
    expected = expected_findings(fixture)
    assert expected, "a bad fixture without markers would test nothing"
    findings = check_fixture(fixture)
    actual = actual_findings(findings)
    missing = expected - actual
    extra = actual - expected
    assert not missing and not extra, (
        f"missing: {sorted(missing)}\nextra: {sorted(extra)}\n" + "\n".join(f.to_text() for f in findings))


@pytest.mark.parametrize("fixture", CLEAN)
def test_clean_fixture_has_no_findings(fixture):
    assert not expected_findings(fixture)
    findings = check_fixture(fixture)
    assert findings == [], "\n".join(f.to_text() for f in findings)


@pytest.mark.parametrize("fixture,rule", [("ssot_bad", "ssot"), ("dag_bad", "dag"), ("surface_bad", "public-surface"),
                                          ("failfast_bad", "fail-fast"), ("isolation_bad", "isolation"),
                                          ("recognition_bad", "recognition")])
def test_each_bad_fixture_is_about_its_own_rule(fixture, rule):
    """The bad fixtures break only the rule they are for, so a rule that goes quiet cannot hide behind another."""
    findings = check_fixture(fixture)
    assert {f.rule for f in findings} == {rule}
    others = [r for r in RULE_IDS if r != rule]
    assert check_fixture(fixture, others) == []


def test_aliasing_tricks_are_caught():
    """The tricks the design notes name, checked by message as well as by place."""
    by_line = {(f.path, f.line): f for f in check_fixture("ssot_bad")}
    reader = (FIXTURES / "ssot_bad/engine/reader.py").read_text().splitlines()
    for trick in ('E["RANK"]', 'getattr(os, "environ")', 'o.environ.get("RANK")'):
        line = next(i for i, text in enumerate(reader, 1) if trick in text)
        assert "outside engine/env.py" in by_line[("engine/reader.py", line)].message

    dag = {(f.path, f.line): f.message for f in check_fixture("dag_bad")}
    config = (FIXTURES / "dag_bad/engine/config.py").read_text().splitlines()
    for trick, target in (('importlib.import_module("engine.train")', "engine.train"),
                          ('load(".model.layers", __package__)', "engine.model.layers"),
                          ("from . import train", "engine.train"),
                          ('importlib.import_module(f"engine.model.{name}")', "engine.model (layer 3)")):
        line = next(i for i, text in enumerate(config, 1) if trick in text)
        assert f"imports {target}" in dag[("engine/config.py", line)]


def test_cycle_message_names_the_cycle_path():
    messages = [f.message for f in check_fixture("dag_bad") if "cycle" in f.message]
    assert sorted(m.split(";")[0] for m in messages) == [
        "import cycle engine.cyc.a -> engine.cyc.b -> engine.cyc.a",
        "import cycle engine.cyc.c -> engine.cyc.d -> engine.cyc.c",
    ]  # e <-> g is a cycle too, but its lazy edge carries `# guard: allow dag -- ...`


def test_duplicate_constant_names_the_other_site():
    messages = {(f.path, f.line): f.message for f in check_fixture("ssot_bad") if "MAX_RETRIES" in f.message}
    assert messages[("engine/limits_a.py", 3)].startswith("MAX_RETRIES = 3 here, but engine/limits_b.py:5 sets MAX_RETRIES = 5")
    assert messages[("engine/limits_b.py", 5)].startswith("MAX_RETRIES = 5 here, but engine/limits_a.py:3 sets MAX_RETRIES = 3")
