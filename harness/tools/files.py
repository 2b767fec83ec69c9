"""The agent's file tools: list, read, search, write, apply_patch. Every path goes through
`harness.tools.paths.resolve`; every write is atomic, and a patch writes all of its files or none."""

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.atomic import write_atomic
from harness.tools.context import ToolContext, ToolError
from harness.tools.patch import PatchError, apply_hunks, parse_patch
from harness.tools.paths import ResolvedPath, is_hidden, matches_glob, resolve

__all__ = ["list_dir", "read_file", "search", "write_file", "apply_patch", "atomic_write"]

# Listed but not expanded: caches and environments are noise to a model and can be huge.
_NOT_EXPANDED = {"__pycache__", ".venv", "venv", "node_modules", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_MAX_LIST_ENTRIES = 2000
_MAX_READ_LINES = 2000
_MAX_LINE_CHARS = 2000
_MAX_SEARCH_LINE_CHARS = 300
_MAX_SEARCH_FILE_BYTES = 4 << 20
_BINARY_SNIFF = 8192


def _is_binary(data: bytes) -> bool:
    return b"\x00" in data[:_BINARY_SNIFF]


def _read_text(rp: ResolvedPath) -> str:
    """The text of a file; ToolError when it is missing, a directory or binary."""
    if not rp.real.exists():
        raise ToolError(f"{rp.rel}: no such file")
    if rp.real.is_dir():
        raise ToolError(f"{rp.rel} is a directory; use list_dir")
    if not rp.real.is_file():
        raise ToolError(f"{rp.rel} is not a regular file")
    try:
        data = rp.real.read_bytes()
    except OSError as e:
        raise ToolError(f"{rp.rel}: cannot read ({e.strerror})") from e
    if _is_binary(data):
        raise ToolError(f"{rp.rel} is a binary file ({len(data)} bytes); inspect it with the run tool")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ToolError(f"{rp.rel} is not UTF-8 text ({e.reason} at byte {e.start})") from e


def atomic_write(real: Path, data: bytes) -> None:
    """Write through a temp file in the same folder + fsync + os.replace (harness.atomic); an
    existing file keeps its mode, a new one gets 0o666 minus the umask, like any editor's."""
    write_atomic(real, data, mode=0o666, keep_mode=True, mkdir=True)


# ------------------------------------------------------------------------------------------ list


def list_dir(ctx: ToolContext, path: str = ".", depth: int = 2) -> str:
    rp = resolve(ctx, path)
    if not rp.real.exists():
        raise ToolError(f"{rp.rel}: no such directory")
    if not rp.real.is_dir():
        raise ToolError(f"{rp.rel} is a file, not a directory; use read_file")
    depth = max(1, min(depth, 10))
    root_real = Path(os.path.realpath(ctx.root))
    out: list[str] = []
    truncated = False

    def walk(real_dir: Path, rel_dir: str, level: int) -> None:
        nonlocal truncated
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))
        except OSError as e:  # guard: allow fail-fast -- shown to the model in the listing
            out.append(f"{'  ' * level}[cannot list: {e.strerror}]")
            return
        for entry in entries:
            if entry.name == ".git":
                continue
            if len(out) >= _MAX_LIST_ENTRIES:
                truncated = True
                return
            rel = entry.name if rel_dir == "." else f"{rel_dir}/{entry.name}"
            indent = "  " * level
            protected = any(matches_glob(rel, p) for p in ctx.protected)
            tag = "  [read-only]" if protected else ""
            if entry.is_symlink():
                target = os.readlink(entry.path)
                inside = Path(os.path.realpath(entry.path))
                within = inside == root_real or root_real in inside.parents
                if within and is_hidden(inside.relative_to(root_real).as_posix()):
                    continue  # a link into .git is as invisible as .git itself
                where = "" if within else "  [outside the worktree]"
                out.append(f"{indent}{entry.name} -> {target}{where}{tag}")
            elif entry.is_dir():
                if entry.name in _NOT_EXPANDED:
                    out.append(f"{indent}{entry.name}/  [not expanded]")
                elif level + 1 < depth:
                    out.append(f"{indent}{entry.name}/{tag}")
                    walk(Path(entry.path), rel, level + 1)
                else:
                    try:
                        n = sum(1 for e in os.scandir(entry.path) if e.name != ".git")
                    except OSError:  # guard: allow fail-fast -- unreadable folder: count unknown, listed as 0
                        n = 0
                    out.append(f"{indent}{entry.name}/  ({n} entries){tag}")
            else:
                try:
                    size = entry.stat(follow_symlinks=False).st_size
                except OSError:  # guard: allow fail-fast -- vanished while listing: size unknown
                    size = 0
                out.append(f"{indent}{entry.name}  ({size} bytes){tag}")

    walk(rp.real, rp.rel, 0)
    header = f"{rp.rel}/" if rp.rel != "." else "./"
    body = "\n".join(out) if out else "(empty)"
    note = f"\n[listing stopped after {_MAX_LIST_ENTRIES} entries; list a subdirectory]" if truncated else ""
    return f"{header}\n{body}{note}"


# ------------------------------------------------------------------------------------------ read


def read_file(ctx: ToolContext, path: str, start_line: int = 1, end_line: int | None = None) -> str:
    rp = resolve(ctx, path)
    text = _read_text(rp)
    lines = text.splitlines()
    total = len(lines)
    if total == 0:
        return f"{rp.rel} is empty."
    start = max(1, start_line)
    if start > total:
        raise ToolError(f"start_line {start_line} is past the end of {rp.rel} ({total} lines)")
    end = total if end_line is None or end_line <= 0 else min(end_line, total)
    if end < start:
        raise ToolError(f"end_line {end_line} is before start_line {start_line}")
    budget = max(ctx.output_limit - 300, 1000)
    width = len(str(end))
    out: list[str] = []
    used = 0
    last = start - 1
    for n in range(start, end + 1):
        line = lines[n - 1]
        if len(line) > _MAX_LINE_CHARS:
            line = line[:_MAX_LINE_CHARS] + f" [... {len(line) - _MAX_LINE_CHARS} characters of this line omitted]"
        entry = f"{n:>{width}}\t{line}"
        if out and (used + len(entry) + 1 > budget or n - start >= _MAX_READ_LINES):
            break
        out.append(entry)
        used += len(entry) + 1
        last = n
    result = "\n".join(out)
    if last < end:
        result += (
            f"\n[output truncated: showing lines {start}-{last} of {total}; "
            f"call read_file with start_line={last + 1} to continue]"
        )
    elif start > 1 or end < total:
        result += f"\n[lines {start}-{end} of {total}]"
    return result


# ---------------------------------------------------------------------------------------- search


def _has_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _candidate_files(ctx: ToolContext, root_real: Path, base: ResolvedPath) -> list[str]:
    """Worktree-relative files under `base`, honouring .gitignore when the worktree is a git
    checkout (like ripgrep), else every file except caches."""
    if (root_real / ".git").exists():
        proc = subprocess.run(
            ["git", "--literal-pathspecs", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
             "--", base.rel],
            cwd=root_real,
            capture_output=True,
        )
        if proc.returncode == 0:
            names = sorted(set(n.decode("utf-8", "surrogateescape") for n in proc.stdout.split(b"\0") if n))
            return names
    found: list[str] = []
    start = base.real
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and d not in _NOT_EXPANDED)
        rel_dir = Path(dirpath).relative_to(root_real).as_posix()
        for name in sorted(filenames):
            found.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    return found


def search(
    ctx: ToolContext,
    pattern: str,
    path: str = ".",
    glob: str = "",
    max_results: int = 100,
    ignore_case: bool = False,
) -> str:
    try:
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise ToolError(f"pattern {pattern!r} is not a valid Python regular expression: {e}") from e
    max_results = max(1, min(max_results, 1000))
    root_real = Path(os.path.realpath(ctx.root))
    if _has_glob(path):  # `path` may itself be a glob such as "engine/**/*.py"
        path_glob = path
        base = resolve(ctx, ".")
    else:
        path_glob = ""
        base = resolve(ctx, path)
        if not base.real.exists():
            raise ToolError(f"{base.rel}: no such file or directory")
    if base.real.is_file():
        files = [base.rel]
    else:
        files = _candidate_files(ctx, root_real, base)
    results: list[str] = []
    skipped_binary = skipped_large = 0
    matched_files = 0
    more = False
    for rel in files:
        if is_hidden(rel):
            continue
        if path_glob and not matches_glob(rel, path_glob):
            continue
        if glob and not (matches_glob(rel, glob) or matches_glob(rel.rsplit("/", 1)[-1], glob)):
            continue
        real = root_real / rel
        resolved = Path(os.path.realpath(real))
        if root_real not in resolved.parents or is_hidden(resolved.relative_to(root_real).as_posix()):
            continue  # a symlink leaving the worktree or into .git: not searched
        if not resolved.is_file():
            continue
        try:
            size = resolved.stat().st_size
            if size > _MAX_SEARCH_FILE_BYTES:
                skipped_large += 1
                continue
            data = resolved.read_bytes()
        except OSError:  # guard: allow fail-fast -- vanished or unreadable since listing: nothing to search
            continue
        if _is_binary(data):
            skipped_binary += 1
            continue
        text = data.decode("utf-8", errors="replace")
        hit = False
        for n, line in enumerate(text.splitlines(), 1):
            if rx.search(line):
                if len(results) >= max_results:
                    more = True
                    break
                hit = True
                if len(line) > _MAX_SEARCH_LINE_CHARS:
                    line = line[:_MAX_SEARCH_LINE_CHARS] + " [...]"
                results.append(f"{rel}:{n}:{line}")
        matched_files += hit
        if more:
            break
    notes = []
    if more:
        notes.append(f"[stopped at max_results={max_results}; narrow the pattern or the path]")
    if skipped_binary:
        notes.append(f"[{skipped_binary} binary files skipped]")
    if skipped_large:
        notes.append(f"[{skipped_large} files over {_MAX_SEARCH_FILE_BYTES >> 20} MiB skipped]")
    if not results:
        return "\n".join(["No matches."] + notes)
    summary = f"[{len(results)} matches in {matched_files} files]"
    return "\n".join(results + notes + [summary])


# ----------------------------------------------------------------------------------------- write


def write_file(ctx: ToolContext, path: str, content: str) -> str:
    rp = resolve(ctx, path, write=True)
    if rp.real.is_dir():
        raise ToolError(f"{rp.rel} is a directory")
    existed = rp.real.exists()
    data = content.encode("utf-8")
    try:
        atomic_write(rp.real, data)
    except OSError as e:
        raise ToolError(f"cannot write {rp.rel}: {e.strerror}") from e
    n_lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    verb = "Overwrote" if existed else "Created"
    return f"{verb} {rp.rel} ({len(data)} bytes, {n_lines} lines)."


# ----------------------------------------------------------------------------------------- patch


@dataclass
class _Pending:
    rp: ResolvedPath
    original: bytes | None  # None: did not exist
    content: str | None  # None: delete


def _current(pending: dict[Path, _Pending], rp: ResolvedPath) -> str | None:
    if rp.real in pending:
        return pending[rp.real].content
    if not rp.real.exists():
        return None
    return _read_text(rp)


def _stage(pending: dict[Path, _Pending], rp: ResolvedPath, content: str | None) -> None:
    if rp.real not in pending:
        if rp.real.is_dir():
            raise ToolError(f"{rp.rel} is a directory")
        original = rp.real.read_bytes() if rp.real.exists() else None
        pending[rp.real] = _Pending(rp, original, content)
    else:
        pending[rp.real].content = content


def apply_patch(ctx: ToolContext, patch: str) -> str:
    try:
        file_patches = parse_patch(patch)
    except PatchError as e:
        raise ToolError(f"apply_patch failed; no file was changed.\n{e}") from e
    pending: dict[Path, _Pending] = {}
    summary: list[str] = []
    notes: list[str] = []
    try:
        for fp in file_patches:
            rp = resolve(ctx, fp.path, write=True)
            current = _current(pending, rp)
            if fp.kind == "delete":
                if current is None:
                    raise ToolError(f"cannot delete {rp.rel}: no such file")
                _stage(pending, rp, None)
                summary.append(f"D {rp.rel}")
                continue
            if fp.kind == "create" and current not in (None, ""):
                raise ToolError(
                    f"cannot create {rp.rel}: it already exists; send a diff against its current "
                    f"content ('--- a/{rp.rel}' / '+++ b/{rp.rel}') or use write_file"
                )
            new, fuzzy = apply_hunks(current, fp.hunks, rp.rel) if fp.hunks else (current or "", [])
            notes.extend(fuzzy)
            if fp.new_path is not None:
                dest = resolve(ctx, fp.new_path, write=True)
                if _current(pending, dest) is not None and dest.real != rp.real:
                    raise ToolError(f"cannot rename {rp.rel} to {dest.rel}: the destination exists")
                _stage(pending, rp, None)
                _stage(pending, dest, new)
                summary.append(f"R {rp.rel} -> {dest.rel}")
            else:
                _stage(pending, rp, new)
                letter = "A" if current is None else "M"
                summary.append(f"{letter} {rp.rel}" + (f" ({len(fp.hunks)} hunks)" if len(fp.hunks) > 1 else ""))
    except PatchError as e:
        raise ToolError(
            f"apply_patch failed; no file was changed.\n{e}\n"
            "Fix that part (copy the old lines exactly as read_file shows them, without the line "
            "numbers) and send the whole patch again."
        ) from e
    except ToolError as e:
        raise ToolError(f"apply_patch failed; no file was changed.\n{e}") from e
    except OSError as e:
        raise ToolError(f"apply_patch failed; no file was changed: {e}") from e
    _commit(pending)
    text = "Applied patch:\n" + "\n".join(summary)
    if notes:
        text += "\nNotes:\n" + "\n".join(notes)
    return text


def _commit(pending: dict[Path, _Pending]) -> None:
    """Write every staged file; if one write fails, put the ones already written back."""
    done: list[_Pending] = []
    try:
        for item in pending.values():
            if item.content is None:
                if item.original is not None:
                    item.rp.real.unlink()
            else:
                atomic_write(item.rp.real, item.content.encode("utf-8"))
            done.append(item)
    except OSError as e:
        for item in reversed(done):
            if item.original is None:
                item.rp.real.unlink(missing_ok=True)
            else:
                atomic_write(item.rp.real, item.original)
        raise ToolError(f"apply_patch failed while writing {item.rp.rel} ({e.strerror}); no file was changed") from e
