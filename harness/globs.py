"""The one glob matcher for repository paths (milestone editable / protected sets, the agent's tools).

Semantics (root-anchored, '/'-separated, whole path):
- `*` and `?` match within one path segment (never '/'); `[abc]` / `[!abc]` one character of a
  segment (a ']' right after '[' or '[!' is literal);
- `**/` matches zero or more whole segments (`**/conftest.py` matches `conftest.py`), a trailing
  `/**` one or more levels below (`engine/**` matches `engine/a.py`, not `engine`), and `**`
  elsewhere any characters including '/'.

`tree=True` adds what a *directory* glob means to the agent's file tools: a glob that names a
folder covers everything below it (`tests` and `tests/` protect `tests/a/b.py`) and `dir/**` also
names `dir` itself; the pattern is also normalised (surrounding blanks, a leading '/' or './', a
trailing '/'). It is a flag of this matcher rather than a second matcher so that the tools' view of
a protected set can only be wider than the judge's, never different: every path the judge's
semantics matches, `tree=True` matches too.
"""

import re
from functools import lru_cache

__all__ = ["glob_match", "glob_regex"]


def _translate(pat: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")  # zero or more whole segments
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = i + 1
            if j < len(pat) and pat[j] == "!":
                j += 1
            end = pat.find("]", j + 1)  # a ']' first in the set is literal
            if end == -1:
                out.append(re.escape(c))
                i += 1
                continue
            body = pat[j:end].replace("\\", "\\\\").replace("[", "\\[")
            neg = "^" if pat[i + 1] == "!" else ""
            out.append(f"(?!/)[{neg}{body}]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@lru_cache(maxsize=1024)
def glob_regex(pattern: str, tree: bool = False) -> re.Pattern[str]:
    """The compiled regex for `pattern` (fullmatch it against a path)."""
    if not tree:
        return re.compile(_translate(pattern), re.DOTALL)
    pat = pattern.strip().lstrip("/")
    while pat.startswith("./"):
        pat = pat[2:]
    pat = pat.rstrip("/")
    if not pat:
        return re.compile(".*", re.DOTALL)
    body = _translate(pat)
    if pat.endswith("/**"):  # "dir/**" names "dir" too
        body = _translate(pat[:-3])
    return re.compile(f"(?:{body})(?:/.*)?", re.DOTALL)


def glob_match(pattern: str, path: str, *, tree: bool = False) -> bool:
    """True when the repo-relative POSIX `path` matches `pattern` (see the module docstring)."""
    return glob_regex(pattern, tree).fullmatch(path) is not None
