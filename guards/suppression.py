"""Inline suppressions: `# guard: allow <rule-id>[, <rule-id>] -- <reason>`.

A trailing comment covers its own line; a comment on a line by itself covers the next line too (the
line directly above a finding). A suppression without a reason, naming an unknown rule, or not in
the `allow ... -- ...` form is itself a finding (rule id `suppression`) and suppresses nothing:
a silent exception to a red line is exactly what the guards exist to prevent.

The judge asks a different question: which suppressions did a candidate add? `suppressions()` and
`new_suppressions()` answer it from the files themselves (base and candidate), never from a diff's
text, so no diff dialect, rename, move or string literal changes the answer.
"""

import io
import re
import tokenize
from collections import Counter
from collections.abc import Mapping

from guards.findings import Finding
from guards.source import PARSE_ERROR, SourceModule

__all__ = ["SUPPRESSION", "scan_suppressions", "suppressions", "new_suppressions", "is_suppression_comment"]

SUPPRESSION = "suppression"
_MARK = re.compile(r"#\s*guard:(?P<body>.*)$")
_ALLOW = re.compile(r"\s*allow\s+(?P<rules>[A-Za-z0-9_-]+(?:\s*,\s*[A-Za-z0-9_-]+)*)\s*(?:--(?P<reason>.*))?")
_FORM = "`# guard: allow <rule-id> -- <reason>`"


def scan_suppressions(module: SourceModule, known_rules: frozenset[str]) -> tuple[dict[int, frozenset[str]], list[Finding]]:
    """(line -> rule ids allowed there, findings about malformed suppressions)."""
    if module.text is None:
        return {}, []
    allowed: dict[int, set[str]] = {}
    problems: list[Finding] = []
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(module.text).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError) as err:
        return {}, [module.finding(PARSE_ERROR, f"comments cannot be read ({err}); fix the file so suppressions can be checked")]
    for token in tokens:
        mark = _MARK.search(token.string)
        if mark is None:
            continue
        line, col = token.start[0], token.start[1] + 1
        allow = _ALLOW.fullmatch(mark.group("body"))
        if allow is None:
            problems.append(module.finding(SUPPRESSION, f"malformed suppression; write {_FORM}", line=line, col=col))
            continue
        rules = [r.strip() for r in allow.group("rules").split(",")]
        unknown = [r for r in rules if r not in known_rules]
        reason = (allow.group("reason") or "").strip()
        if unknown:
            problems.append(module.finding(
                SUPPRESSION, f"suppression names unknown rule {', '.join(map(repr, unknown))}; use one of "
                             f"{', '.join(sorted(known_rules))}", line=line, col=col))
            continue
        if not reason:
            problems.append(module.finding(
                SUPPRESSION, f"suppression of {', '.join(rules)} has no reason; write {_FORM} saying why this is fine",
                line=line, col=col))
            continue
        own_line = not token.line[: token.start[1]].strip()
        for covered in (line, line + 1) if own_line else (line,):
            allowed.setdefault(covered, set()).update(rules)
    return {line: frozenset(rules) for line, rules in allowed.items()}, problems


def _normalized(comment: str) -> str:
    """Lower case, no whitespace: `#GUARD :  Allow x` and `# guard: allow x` are one suppression."""
    return "".join(comment.split()).lower()


def is_suppression_comment(comment: str) -> bool:
    """A comment token that is, or may be read as, a guard directive.

    Broader on purpose than what scan_suppressions honours (any case, any spacing, anywhere in the
    comment): the judge must never miss one the runner would honour, and a near-miss is still an
    attempt a reviewer should see.
    """
    return "guard:allow" in _normalized(comment)


def suppressions(source: str) -> list[tuple[int, str]]:
    """Every suppression comment in a Python source text, as (1-based line, comment text), in order.

    Found with `tokenize`, so only real comments count: `"# guard: allow"` inside a string literal
    (docstrings included) is not one, while any comment form (trailing, own line, after other
    comment text) is. Raises tokenize.TokenError / SyntaxError when the text cannot be tokenized:
    then nobody can say which comments it holds, and the caller must refuse rather than guess.
    """
    return [(line, text) for line, text, _ in _suppressions_with_place(source)]


def _suppressions_with_place(source: str) -> list[tuple[int, str, str]]:
    """(line, comment, the code it covers): the code before a trailing comment, else the next line's."""
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or not is_suppression_comment(token.string):
            continue
        line = token.start[0]
        before = token.line[: token.start[1]]
        covered = before if before.strip() else (lines[line] if line < len(lines) else "")
        found.append((line, token.string, covered))
    return found


def new_suppressions(base_files: Mapping[str, str], candidate_files: Mapping[str, str]) -> list[str]:
    """Violations, one per suppression the candidate has beyond the base's, each naming file and line.

    Contract (what the judge relies on):
    * Both mappings are repository-relative posix path -> full decoded text of that file. Pass every
      `.py` file of the candidate (at least every one that differs from the base); other paths are
      ignored, because the guards read only `.py` files.
    * Per path, suppressions are counted by key: the normalized comment text (case and whitespace
      folded) plus the normalized code it covers (the code before a trailing comment, else the next
      line). The candidate's count of a key above the base's is new: an added comment, a copy of an
      existing one, one moved onto other code or into another file. Line numbers do not matter, so
      edits above an untouched suppression do not report it.
    * A renamed or new file has no base entry, so all of its suppressions are new.
    * A candidate `.py` file that cannot be tokenized is itself a violation: its comments are unknown.
      A base file that cannot be tokenized counts as having no suppressions (fail closed).
    * An empty list means no suppression was added. Removing suppressions is always fine.
    """
    violations = []
    for path in sorted(candidate_files):
        if not path.endswith(".py"):
            continue
        try:
            found = _suppressions_with_place(candidate_files[path])
        except (tokenize.TokenError, SyntaxError) as err:
            violations.append(f"{path}: cannot be tokenized ({err}), so its guard suppressions cannot be checked; "
                              "fix the file")
            continue
        remaining = Counter(_key(comment, covered) for _, comment, covered in _base_suppressions(base_files.get(path)))
        for line, comment, covered in found:
            key = _key(comment, covered)
            if remaining[key] > 0:
                remaining[key] -= 1
                continue
            violations.append(f"{path}:{line}: adds a guard suppression ({comment.strip()[:120]}); suppressions are "
                              "a reviewer's decision, fix the code instead")
    return violations


def _key(comment: str, covered: str) -> tuple[str, str]:
    return _normalized(comment), _normalized(covered)


def _base_suppressions(text: str | None) -> list[tuple[int, str, str]]:
    if text is None:
        return []
    try:
        return _suppressions_with_place(text)
    except (tokenize.TokenError, SyntaxError):
        return []  # unknown comments: every suppression of the candidate's version is then new
