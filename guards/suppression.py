"""Inline suppressions: `# guard: allow <rule-id>[, <rule-id>] -- <reason>`.

A trailing comment covers its own line; a comment on a line by itself covers the next line too (the
line directly above a finding). A suppression without a reason, naming an unknown rule, or not in
the `allow ... -- ...` form is itself a finding (rule id `suppression`) and suppresses nothing:
a silent exception to a red line is exactly what the guards exist to prevent.
"""

import io
import re
import tokenize

from guards.findings import Finding
from guards.source import PARSE_ERROR, SourceModule

__all__ = ["SUPPRESSION", "scan_suppressions"]

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
