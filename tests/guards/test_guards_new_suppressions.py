"""suppressions() / new_suppressions(): what the judge uses to refuse suppressions a candidate adds."""

import pytest
from guards.suppression import new_suppressions, suppressions

BASE = '''import os


def f():
    try:
        return 1
    except Exception:  # guard: allow fail-fast -- top-level crash reporter
        raise
'''
OLD = "    except Exception:  # guard: allow fail-fast -- top-level crash reporter\n"


def test_comments_count_string_literals_do_not():
    source = ('"""Docs: write # guard: allow ssot -- why."""\n'
              'X = "# guard: allow ssot -- in a string"\n'
              'Y = f"{1} # guard: allow ssot -- in an f-string"\n'
              'Z = 1  # guard: allow ssot -- a real one\n'
              '#GUARD :   Allow fail-fast -- odd spacing and case\n'
              'W = 2  # noqa: E501 # guard: allow dag -- after other comment text\n')
    assert [line for line, _ in suppressions(source)] == [4, 5, 6]


def test_unchanged_file_and_shifted_lines_add_nothing():
    assert new_suppressions({"engine/a.py": BASE}, {"engine/a.py": BASE}) == []
    shifted = BASE.replace("import os\n", "import os\nimport sys\n\n")
    assert new_suppressions({"engine/a.py": BASE}, {"engine/a.py": shifted}) == []


def test_added_suppression_is_reported_with_file_and_line():
    candidate = BASE + "\n\ndef g():\n    return os.environ['X']  # guard: allow ssot -- mine\n"
    [violation] = new_suppressions({"engine/a.py": BASE}, {"engine/a.py": candidate})
    assert violation.startswith("engine/a.py:12: adds a guard suppression (# guard: allow ssot -- mine)")


def test_duplicate_of_an_existing_suppression_is_reported():
    candidate = BASE + "\n\ndef g():\n    try:\n        return 2\n" + OLD + "        raise\n"
    assert len(new_suppressions({"engine/a.py": BASE}, {"engine/a.py": candidate})) == 1


def test_suppression_moved_onto_other_code_is_reported():
    candidate = BASE.replace(OLD, "    except Exception:\n").replace(
        "        return 1\n", "        return 1  # guard: allow fail-fast -- top-level crash reporter\n")
    assert len(new_suppressions({"engine/a.py": BASE}, {"engine/a.py": candidate})) == 1


def test_moved_or_renamed_file_counts_as_new():
    assert len(new_suppressions({"engine/a.py": BASE}, {"engine/b.py": BASE})) == 1
    assert len(new_suppressions({"engine/a.py": BASE}, {"engine/a.py": BASE, "engine/b.py": BASE})) == 1


def test_own_line_comment_in_any_form_is_reported():
    candidate = BASE.replace(OLD, "    #guard:ALLOW   fail-fast -- hidden above\n    except Exception:\n")
    [violation] = new_suppressions({"engine/a.py": BASE.replace(OLD, "    except Exception:\n")},
                                   {"engine/a.py": candidate})
    assert "engine/a.py:7:" in violation


def test_removing_suppressions_is_fine_and_non_python_files_are_ignored():
    assert new_suppressions({"engine/a.py": BASE}, {"engine/a.py": BASE.replace(OLD, "    except ValueError:\n")}) == []
    assert new_suppressions({}, {"docs/x.md": "# guard: allow ssot -- prose"}) == []


def test_untokenizable_candidate_is_a_violation():
    [violation] = new_suppressions({}, {"engine/a.py": 'x = """never closed\n'})
    assert violation.startswith("engine/a.py: cannot be tokenized")


@pytest.mark.parametrize("base", ['x = """never closed\n', None])
def test_base_without_readable_suppressions_makes_all_candidate_ones_new(base):
    base_files = {} if base is None else {"engine/a.py": base}
    assert len(new_suppressions(base_files, {"engine/a.py": BASE})) == 1
