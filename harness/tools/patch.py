"""Parse and apply patches written by a model. Pure text in, text out: the file tools do the I/O.

Three formats are accepted, because models are trained on all three:
- unified diffs (`diff -u` / `git diff`), several files per patch, new and deleted files, renames;
- aider's search/replace blocks (a file path line, `<<<<<<< SEARCH`, `=======`, `>>>>>>> REPLACE`);
- the `*** Begin Patch` envelope of OpenAI's apply_patch tool (`*** Update File:`, `@@ anchor`).

Models get line numbers and hunk counts wrong and drift whitespace, so (as aider does) the header
numbers of a hunk are only a hint, counts are ignored, and a hunk's old lines are searched for first
exactly, then ignoring trailing whitespace, then ignoring all whitespace differences (added lines are
then re-indented by the same offset). A hunk that matches nowhere raises `HunkFailed`, whose message
shows the closest real lines of the file (difflib), so the model can copy them and retry.
"""

import difflib
import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PatchError", "HunkFailed", "Hunk", "FilePatch", "parse_patch", "apply_hunks"]

_SEARCH = re.compile(r"^\s*<{5,9} ?SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9} ?REPLACE\s*$")
_HUNK_HEADER = re.compile(r"^@@+ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@+")
_GIT_HEADER = re.compile(r"^diff --git (?:a/)?(.+?) (?:b/)?(.+)$")
_NUMBERED = re.compile(r"^\s*\d+\t")
_V4A_FILE = re.compile(r"^\*\*\* (Update|Add|Delete) File: (.+)$")
_EXTENDED = ("new file mode", "deleted file mode", "index ", "similarity index", "dissimilarity index",
             "rename from ", "rename to ", "copy from ", "copy to ", "old mode", "new mode")


class PatchError(Exception):
    """The patch cannot be used as sent; the message tells the model what to fix."""


class HunkFailed(PatchError):
    """One hunk's old lines were not found; the message carries the closest lines of the file."""


@dataclass
class Hunk:
    """One edit: `ops` are (op, line) with op ' ' (context), '-' (removed) or '+' (added).

    old_start/old_count come from a unified `@@` header (a hint only); `anchor` from an OpenAI
    `@@ def f` line; `unique` (search/replace) means the old lines must occur exactly once.
    eof_newline: True/False when a '\\ No newline at end of file' marker fixes whether the result
    ends with a newline, None to keep the file's own.
    """

    ops: list[tuple[str, str]]
    label: str
    old_start: int | None = None
    old_count: int | None = None
    anchor: str = ""
    unique: bool = False
    eof_newline: bool | None = None

    @property
    def before(self) -> list[str]:
        return [text for op, text in self.ops if op != "+"]

    @property
    def after(self) -> list[str]:
        return [text for op, text in self.ops if op != "-"]


@dataclass
class FilePatch:
    """The edits to one file. kind 'update' with `new_path` set is a rename."""

    kind: Literal["update", "create", "delete"]
    path: str
    hunks: list[Hunk] = field(default_factory=list)
    new_path: str | None = None
    fmt: Literal["unified", "search-replace", "openai"] = "unified"


# ---------------------------------------------------------------------------------------- parsing


def parse_patch(text: str) -> list[FilePatch]:
    """Split a patch into per-file edits; PatchError when it is none of the accepted formats."""
    if not isinstance(text, str) or not text.strip():
        raise PatchError("the patch is empty")
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if any(_SEARCH.match(line) for line in lines):
        return _parse_search_replace(lines)
    if any(line.strip() == "*** Begin Patch" or _V4A_FILE.match(line) for line in lines):
        return _parse_openai(lines)
    if any(line.startswith(("--- ", "+++ ", "@@", "diff --git ")) for line in lines):
        return _parse_unified(lines)
    raise PatchError(
        "the patch is not in a recognized format. Send a unified diff ('--- a/path', '+++ b/path', "
        "'@@ ... @@' hunks) or search/replace blocks (the file path on its own line, then "
        "'<<<<<<< SEARCH', the exact old lines, '=======', the new lines, '>>>>>>> REPLACE')"
    )


def _unquote_git_path(path: str) -> str:
    """git writes unusual names as C strings with octal escapes of their UTF-8 bytes."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    out = bytearray()
    body = path[1:-1]
    i = 0
    simple = {"n": 10, "t": 9, '"': 34, "\\": 92, "a": 7, "b": 8, "f": 12, "r": 13, "v": 11}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1 and re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
        out.extend(c.encode())
        i += 1
    return out.decode("utf-8", errors="replace")


def _header_path(raw: str) -> str | None:
    path = raw.split("\t", 1)[0].rstrip()
    path = _unquote_git_path(path)
    return None if path == "/dev/null" else path


def _strip_git_prefixes(old: str | None, new: str | None) -> tuple[str | None, str | None]:
    """Drop git's a/ and b/ prefixes where the header uses them the way git does, or where only one
    side has its prefix and the two paths are otherwise the same ('--- a/x', '+++ x')."""
    old_bare = old[2:] if old is not None and old.startswith("a/") else old
    new_bare = new[2:] if new is not None and new.startswith("b/") else new
    if (old is None or old.startswith("a/")) and (new is None or new.startswith("b/")):
        return old_bare, new_bare
    if old_bare == new:
        return new, new
    if new_bare == old:
        return old, old
    return old, new


def _read_hunk_body(lines: list[str], i: int) -> tuple[list[tuple[str, str]], bool | None, int]:
    """Collect one hunk's lines from index i; ignores the header's counts (models get them wrong).

    Returns (ops, eof_newline, index after the hunk). Blank lines count as blank context lines
    (editors strip the lone space), except trailing ones, which are usually just patch spacing.
    """
    ops: list[tuple[str, str]] = []
    from_blank: list[bool] = []
    old_no_newline = new_no_newline = False
    while i < len(lines):
        line = lines[i]
        if line.startswith(("@@", "diff --git ", "*** ")):
            break
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            break
        if line == "":
            ops.append((" ", ""))
            from_blank.append(True)
        elif line[0] in " +-":
            ops.append((line[0], line[1:]))
            from_blank.append(False)
        elif line[0] == "\\":
            if ops and ops[-1][0] == "-":
                old_no_newline = True
            elif ops:
                new_no_newline = True
        else:
            break
        i += 1
    while from_blank and from_blank[-1]:
        ops.pop()
        from_blank.pop()
    eof_newline = False if new_no_newline else (True if old_no_newline else None)
    return ops, eof_newline, i


def _parse_unified(lines: list[str]) -> list[FilePatch]:
    files: list[FilePatch] = []
    current: FilePatch | None = None
    git: dict[str, str] | None = None  # extended header of a 'diff --git' section

    def close_git_section() -> None:
        # A 'diff --git' section without ---/+++ lines: empty new file, deletion, pure rename.
        if git is None or git.get("body"):
            return
        if "deleted" in git:
            files.append(FilePatch("delete", git["old"]))
        elif "new" in git:
            files.append(FilePatch("create", git["new_path"]))
        elif "rename_from" in git and "rename_to" in git:
            files.append(FilePatch("update", git["rename_from"], new_path=git["rename_to"]))

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            close_git_section()
            m = _GIT_HEADER.match(line)
            git = {"old": m.group(1), "new_path": m.group(2)} if m else {}
            current = None
            i += 1
            continue
        if git is not None and not git.get("body") and line.startswith(_EXTENDED):
            if line.startswith("deleted file mode"):
                git["deleted"] = "1"
            elif line.startswith("new file mode"):
                git["new"] = "1"
            elif line.startswith("rename from "):
                git["rename_from"] = _unquote_git_path(line[len("rename from ") :])
            elif line.startswith("rename to "):
                git["rename_to"] = _unquote_git_path(line[len("rename to ") :])
            i += 1
            continue
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchError("binary patches are not supported; use write_file or the run tool for binary files")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip_git_prefixes(_header_path(line[4:]), _header_path(lines[i + 1][4:]))
            if git is not None:
                git["body"] = "1"
            if old is None and new is None:
                raise PatchError(f"file header at line {i + 1} names /dev/null on both sides")
            if old is None:
                current = FilePatch("create", new or "")
            elif new is None:
                current = FilePatch("delete", old)
            else:
                current = FilePatch("update", old, new_path=new if new != old else None)
            files.append(current)
            i += 2
            continue
        if line.startswith("@@"):
            if current is None:
                raise PatchError(
                    f"hunk header at line {i + 1} ({line.strip()!r}) comes before any file header; "
                    "start each file with '--- a/path' and '+++ b/path' lines"
                )
            m = _HUNK_HEADER.match(line)
            ops, eof_newline, i_next = _read_hunk_body(lines, i + 1)
            label = f"hunk {len(current.hunks) + 1} ({line.strip()[:60]})"
            if not ops:
                raise PatchError(f"{current.path}: {label} has no lines")
            current.hunks.append(
                Hunk(
                    ops,
                    label,
                    old_start=int(m.group(1)) if m else None,
                    old_count=(int(m.group(2)) if m.group(2) is not None else 1) if m else None,
                    eof_newline=eof_newline,
                )
            )
            i = i_next
            continue
        i += 1  # prose, code fences, 'index' lines
    close_git_section()
    if not files:
        raise PatchError("no file headers found; a unified diff needs '--- a/path' and '+++ b/path' lines")
    for fp in files:
        if fp.kind == "update" and not fp.hunks and fp.new_path is None:
            raise PatchError(f"{fp.path}: the file header has no hunks ('@@ ... @@' followed by lines)")
    return files


def _filename_before(lines: list[str], i: int) -> str | None:
    """The file path on the lines just before a SEARCH marker (fences and blank lines skipped);
    None when the previous block's path applies."""
    for j in range(i - 1, max(-1, i - 4), -1):
        text = lines[j].strip()
        if not text:
            continue
        if text.startswith("```"):
            rest = text[3:].strip()
            if rest and " " not in rest and ("/" in rest or "." in rest):
                return rest
            continue
        if _REPLACE.match(text):
            return None
        name = text.strip("`*\"' ").rstrip(":").strip("`*\"' ")
        if name.lower().startswith(("file:", "path:")):
            name = name.split(":", 1)[1].strip()
        return name if name and " " not in name else None
    return None


def _parse_search_replace(lines: list[str]) -> list[FilePatch]:
    files: list[FilePatch] = []
    last_path: str | None = None
    count = 0
    i = 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        count += 1
        path = _filename_before(lines, i) or last_path
        if path is None:
            raise PatchError(
                f"search/replace block {count} has no file path; put the path on its own line right "
                "before '<<<<<<< SEARCH'"
            )
        j = i + 1
        while j < len(lines) and not _DIVIDER.match(lines[j]):
            if _SEARCH.match(lines[j]) or _REPLACE.match(lines[j]):
                break
            j += 1
        if j >= len(lines) or not _DIVIDER.match(lines[j]):
            raise PatchError(f"search/replace block {count} ({path}) has no '=======' line after its SEARCH part")
        k = j + 1
        while k < len(lines) and not _REPLACE.match(lines[k]):
            if _SEARCH.match(lines[k]) or _DIVIDER.match(lines[k]):
                break
            k += 1
        if k >= len(lines) or not _REPLACE.match(lines[k]):
            raise PatchError(f"search/replace block {count} ({path}) does not end with '>>>>>>> REPLACE'")
        ops = [("-", s) for s in lines[i + 1 : j]] + [("+", r) for r in lines[j + 1 : k]]
        hunk = Hunk(ops, f"search/replace block {count}", unique=True)
        if files and files[-1].path == path:
            files[-1].hunks.append(hunk)
        else:
            files.append(FilePatch("update", path, [hunk], fmt="search-replace"))
        last_path = path
        i = k + 1
    return files


def _parse_openai(lines: list[str]) -> list[FilePatch]:
    files: list[FilePatch] = []
    current: FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _V4A_FILE.match(line)
        if m:
            kind = {"Update": "update", "Add": "create", "Delete": "delete"}[m.group(1)]
            current = FilePatch(kind, m.group(2).strip(), fmt="openai")  # type: ignore[arg-type]
            files.append(current)
            i += 1
            continue
        if line.startswith("*** Move to: ") and current is not None:
            current.new_path = line[len("*** Move to: ") :].strip()
            i += 1
            continue
        if current is None or line.startswith("*** "):  # Begin/End Patch, End of File
            i += 1
            continue
        anchor = ""
        if line.startswith("@@"):
            anchor = line[2:].strip()
            i += 1
        elif not line.startswith((" ", "+", "-")):
            i += 1
            continue
        ops, eof_newline, i = _read_hunk_body(lines, i)
        if current.kind == "create":
            ops = [("+", text) for _, text in ops]
        if ops:
            current.hunks.append(Hunk(ops, f"chunk {len(current.hunks) + 1}", anchor=anchor, eof_newline=eof_newline))
    if not files:
        raise PatchError("no '*** Update File:', '*** Add File:' or '*** Delete File:' lines found")
    for fp in files:
        if fp.kind == "update" and not fp.hunks and fp.new_path is None:
            raise PatchError(f"{fp.path}: '*** Update File:' has no changes")
    return files


# --------------------------------------------------------------------------------------- applying


def _collapse(line: str) -> str:
    return " ".join(line.split())


_LEVELS = (
    ("", lambda s: s),
    ("ignoring trailing whitespace", str.rstrip),
    ("ignoring whitespace", _collapse),
)


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _indent_change(patch_line: str, file_line: str) -> tuple[str, str] | None:
    """('add', X) when the file's line is indented by X more than the patch's, ('remove', X) when
    by X less, None when equal or not a prefix relation (tabs against spaces)."""
    p, f = _leading(patch_line), _leading(file_line)
    if p == f or not patch_line.strip():
        return None
    if f.endswith(p):
        return "add", f[: len(f) - len(p)]
    if p.endswith(f):
        return "remove", p[: len(p) - len(f)]
    return None


def _local_indent_changes(hunk: Hunk, matched: list[str]) -> list[tuple[str, str] | None]:
    """For each op, the indentation shift its added line needs: that of the nearest old line
    before it (after it, for added lines at the top), so a replaced line takes the indentation of
    the line it replaces even when the model got the hunk's indentation wrong only in places."""
    per_old: list[tuple[str, str] | None] = []
    old_index: list[int | None] = []
    j = 0
    for op, text in hunk.ops:
        if op == "+":
            old_index.append(None)
            continue
        old_index.append(j if text.strip() else None)
        per_old.append(_indent_change(text, matched[j]))
        j += 1
    out: list[tuple[str, str] | None] = []
    for k, (op, _) in enumerate(hunk.ops):
        if op != "+":
            out.append(None)
            continue
        near = next((old_index[b] for b in range(k - 1, -1, -1) if old_index[b] is not None), None)
        if near is None:
            near = next((old_index[a] for a in range(k + 1, len(hunk.ops)) if old_index[a] is not None), None)
        out.append(per_old[near] if near is not None else None)
    return out


def _shift(line: str, change: tuple[str, str] | None) -> str:
    if change is None or not line.strip():
        return line
    kind, prefix = change
    if kind == "add":
        return prefix + line
    return line[len(prefix) :] if line.startswith(prefix) else line


def _find(lines: list[str], hunk: Hunk, hint: int | None, pos: int, path: str) -> tuple[int, int] | None:
    """(start index, level) of the hunk's old lines in `lines`, preferring matches at or after
    `pos` (hunks come in file order) and nearest to `hint`."""
    before = hunk.before
    m = len(before)
    for level, (_, norm) in enumerate(_LEVELS):
        want = [norm(x) for x in before]
        have = [norm(x) for x in lines]
        cands = [s for s in range(len(lines) - m + 1) if have[s] == want[0] and have[s : s + m] == want]
        if not cands:
            continue
        if hunk.unique and len(cands) > 1:
            where = ", ".join(str(c + 1) for c in cands[:10])
            raise PatchError(
                f"{path}: {hunk.label}: the SEARCH lines occur {len(cands)} times (at lines {where}); "
                "include more surrounding lines so they match exactly one place"
            )
        if hint is None:
            later = [c for c in cands if c >= pos]
            return (later or cands)[0], level
        return min(cands, key=lambda c: (c < pos, abs(c - hint))), level
    return None


def _closest(lines: list[str], before: list[str]) -> tuple[int, int, float] | None:
    """(start, end, similarity) of the window of the file most like `before` (difflib).

    Cheap line-level scores pick candidate windows, then a character-level ratio ranks them, so
    this stays fast on files of thousands of lines.
    """
    if not lines or not before:
        return None
    w = min(len(before), len(lines))
    want = [_collapse(x) for x in before]
    have = [_collapse(x) for x in lines]
    want_set = set(x for x in want if x)
    starts = range(len(lines) - w + 1)
    hits = [1 if x in want_set else 0 for x in have]
    window_hits = []
    running = sum(hits[:w])
    for s in starts:
        window_hits.append(running)
        if s + w < len(hits):
            running += hits[s + w] - hits[s]
    cands = set(sorted(starts, key=lambda s: -window_hits[s])[:30])
    # Also anchor on the longest line of the hunk, in case every line differs a little.
    k = max(range(len(want)), key=lambda j: len(want[j]))
    by_line = sorted(
        range(len(have)),
        key=lambda j: -difflib.SequenceMatcher(None, want[k], have[j], autojunk=False).quick_ratio(),
    )[:30]
    cands.update(min(max(j - k, 0), len(lines) - w) for j in by_line)
    target = "\n".join(want)
    best = max(
        cands,
        key=lambda s: (difflib.SequenceMatcher(None, target, "\n".join(have[s : s + w]), autojunk=False).ratio(), -s),
    )
    ratio = difflib.SequenceMatcher(None, target, "\n".join(have[best : best + w]), autojunk=False).ratio()
    return best, best + w, ratio


def _failure(path: str, hunk: Hunk, lines: list[str]) -> HunkFailed:
    before = hunk.before
    shown = "\n".join("    " + x for x in before[:40]) + ("\n    ..." if len(before) > 40 else "")
    what = "the SEARCH lines" if hunk.unique else "the context and '-' lines"
    parts = [f"{path}: {hunk.label} did not apply: {what} of your patch are not in the file:\n{shown}"]
    close = _closest(lines, before)
    if close is None:
        parts.append("The file is empty.")
    else:
        start, end, ratio = close
        width = len(str(end))
        numbered = "\n".join(f"{n + 1:>{width}}\t{lines[n]}" for n in range(start, end))
        parts.append(f"The closest lines in the file are {start + 1}-{end} (similarity {ratio:.2f}):\n{numbered}")
        delta = list(difflib.unified_diff(before, lines[start:end], "your patch", "the file", lineterm="", n=1))
        if delta:
            parts.append("Differences (- your patch, + the file):\n" + "\n".join(delta[2:60]))
    if before and sum(bool(_NUMBERED.match(x)) for x in before) > len(before) // 2:
        parts.append("Your lines start with line numbers copied from read_file; leave those out.")
    return HunkFailed("\n".join(parts))


def apply_hunks(content: str | None, hunks: list[Hunk], path: str) -> tuple[str, list[str]]:
    """Apply `hunks` in order to `content` (None: the file does not exist yet).

    Returns (new content, notes about fuzzy matches). Line endings (LF or CRLF) and the final
    newline of the file are kept unless a '\\ No newline' marker says otherwise.
    """
    if content is None:
        first = hunks[0] if hunks else None
        creatable = first is None or (not first.before and (first.unique or first.old_start in (None, 0)))
        if not creatable:
            raise PatchError(f"{path}: no such file (to create one, use '--- /dev/null' and '+++ b/{path}')")
        content = ""
    crlf = content.count("\r\n") > content.count("\n") // 2 and "\r\n" in content
    body = content.replace("\r\n", "\n") if crlf else content
    trailing_newline = body.endswith("\n") or body == ""
    lines = body.split("\n")
    if body.endswith("\n") or body == "":
        lines.pop()
    notes: list[str] = []
    offset = 0
    pos = 0
    for hunk in hunks:
        before = hunk.before
        level = 0
        if not before:
            if not lines:
                start = 0
            elif hunk.unique:
                start = len(lines)  # an empty SEARCH appends, as in aider
            elif hunk.old_start is not None:
                at = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
                start = min(max(at + offset, 0), len(lines))
            else:
                raise PatchError(
                    f"{path}: {hunk.label} has only added lines, so there is nowhere to put them; "
                    "include a few unchanged lines around the change"
                )
        else:
            hint = None if hunk.old_start is None else max(hunk.old_start - 1 + offset, 0)
            if hunk.anchor:
                anchor = _collapse(hunk.anchor)
                found = [j for j in range(pos, len(lines)) if anchor and anchor in _collapse(lines[j])]
                if not found:
                    found = [j for j in range(len(lines)) if anchor and anchor in _collapse(lines[j])]
                hint = found[0] if found else hint
                pos = max(pos, found[0]) if found else pos
            match = _find(lines, hunk, hint, pos, path)
            if match is None:
                raise _failure(path, hunk, lines)
            start, level = match
            if level:
                notes.append(f"{path}: {hunk.label} matched at line {start + 1} {_LEVELS[level][0]}")
        matched = lines[start : start + len(before)]
        changes = _local_indent_changes(hunk, matched) if level == 2 else [None] * len(hunk.ops)
        new_block: list[str] = []
        j = 0
        for (op, text), change in zip(hunk.ops, changes, strict=True):
            if op == " ":
                new_block.append(matched[j] if level else text)
                j += 1
            elif op == "-":
                j += 1
            else:
                new_block.append(_shift(text, change))
        lines[start : start + len(before)] = new_block
        pos = start + len(new_block)
        offset += len(new_block) - len(before)
        if hunk.eof_newline is not None and pos == len(lines):
            trailing_newline = hunk.eof_newline
    out = "\n".join(lines) + ("\n" if lines and trailing_newline else "")
    return (out.replace("\n", "\r\n") if crlf else out), notes
