"""All of Temper's git work: one branch and one worktree per run, one commit per attempt, diffs, merges.

The agent works in `runs/<run-id>/worktree`, a git worktree of the user's repository on branch `temper/<run-id>`.
The user's checkout (HEAD, index, files) is never touched, except by `merge_into_user` (`--merge`, after an
accepted verdict; a dirty checkout is refused). Each attempt is one commit (empty when nothing changed) whose
trailers `history()` reads back: Milestone, Run, Attempt, Verdict, MFU. Git runs with hooks, signing and
auto-gc off (the user's hooks must neither block a run nor run code the agent wrote), as `Temper
<temper@localhost>`; a merge uses the user's identity when one is configured.
"""

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.atomic import write_atomic
from harness.settings import child_env

__all__ = ["HELD_OUT_GLOB", "HELD_OUT_PATTERNS", "Workspace", "WorkspaceError", "TRAILER_KEYS", "repo_head", "resolve_commit"]

TRAILER_KEYS = ("Milestone", "Run", "Attempt", "Verdict", "MFU")
_QUIET = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgsign=false",
    "-c", "gc.auto=0",
    "-c", "core.quotepath=false",
)
_TEMPER_IDENTITY = ("-c", "user.name=Temper", "-c", "user.email=temper@localhost")
_DIFF_OPTS = ("--no-color", "--no-ext-diff", "--no-renames", "--src-prefix=a/", "--dst-prefix=b/")
_RECORD = "workspace.json"


class WorkspaceError(Exception):
    """A git problem the user can act on; the message says what and how."""


def _git(cwd: Path, *args: str, env: Mapping[str, str] | None = None, strip: bool = True) -> str:
    """`git ARGS` in `cwd` (hooks off, see _QUIET): its stdout, or WorkspaceError with git's own message.

    Ctrl-C or SIGTERM (Terminated) while git runs: git is let finish, then the interruption goes on. Killing it
    would not stop the processes it started: `git worktree add` checks the tree out in a child `git reset --hard`,
    which went on writing the worktree after its parent was killed and the cleanup had removed it, leaving the
    entry locked and the folder behind."""
    try:
        proc = subprocess.Popen(["git", *_QUIET, *args], cwd=cwd, env=child_env(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="surrogateescape")
    except OSError as e:  # cwd missing or not a folder
        raise WorkspaceError(f"git {' '.join(args[:3])} cannot run in {cwd}: {e.strerror}") from e
    with proc:
        try:
            stdout, stderr = proc.communicate()
        except KeyboardInterrupt:
            proc.communicate()  # git's output read to its end, so a full pipe cannot hold it up
            raise
    if proc.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args[:3])} failed in {cwd}: {stderr.strip() or f'exit {proc.returncode}'}")
    return stdout.removesuffix("\n") if strip else stdout


def _git_path(cwd: Path, *rev_parse_args: str) -> Path:
    """An absolute path from `git rev-parse` (which may answer relative to cwd; git < 2.31 has no
    --path-format=absolute)."""
    return (cwd / _git(cwd, "rev-parse", *rev_parse_args)).resolve()


def _top(path: Path) -> Path:
    """The top folder of the checkout holding `path`; WorkspaceError for no repository or a bare one."""
    try:
        bare = _git(path, "rev-parse", "--is-bare-repository") == "true"
    except WorkspaceError as e:
        raise WorkspaceError(f"{path} is not inside a git repository") from e
    if bare:
        raise WorkspaceError(f"{path} is a bare repository; point Temper at a checkout")
    return Path(_git(path, "rev-parse", "--show-toplevel")).resolve()


def resolve_commit(repo_dir: Path, rev: str) -> str:
    """The sha `rev` names in the repository at `repo_dir`; WorkspaceError when it names no commit."""
    try:
        return _git(repo_dir, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except WorkspaceError as e:
        raise WorkspaceError(f"{rev!r} is not a commit of the repository at {repo_dir}") from e


def repo_head(repo: Path) -> str:
    """HEAD's sha of the git checkout at `repo`; WorkspaceError saying what to do when there is none."""
    try:
        _git(repo, "rev-parse", "--is-inside-work-tree")
    except WorkspaceError:
        raise WorkspaceError(f"{repo} is not a git checkout; Temper runs agents in git worktrees of it. "
                             "Run `git init && git add -A && git commit -m init` there first") from None
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except WorkspaceError:
        raise WorkspaceError(f"the git repository at {repo} has no commits yet; commit the project first "
                             "(`git add -A && git commit -m init`): runs start from HEAD") from None


def _check_run_id(repo_dir: Path, run_id: str) -> str:
    if not run_id or "/" in run_id or run_id.strip() != run_id or run_id.startswith("."):
        raise WorkspaceError(f"run id {run_id!r} must be one non-empty path segment without '/' or spaces")
    branch = f"temper/{run_id}"
    try:
        _git(repo_dir, "check-ref-format", "--branch", branch)
    except WorkspaceError as e:
        raise WorkspaceError(f"run id {run_id!r} cannot be part of a git branch name ({branch})") from e
    return branch


def _branch_exists(repo_dir: Path, branch: str) -> bool:
    return bool(_git(repo_dir, "branch", "--list", branch).strip())


# Milestones' held-out material (acceptance tests, references) never appears in an agent's worktree:
# the judge copies it into the checkout it judges. A sparse checkout of this worktree alone leaves
# those paths out (skip-worktree: not "deleted" in the agent's diff); the user's checkout is untouched.
HELD_OUT_GLOB = "milestones/*/hidden"
HELD_OUT_PATTERNS = ("/*", f"!/{HELD_OUT_GLOB}/")


def _hide_held_out(worktree: Path) -> None:
    _git(worktree, "sparse-checkout", "set", "--no-cone", *HELD_OUT_PATTERNS)


def _one_line(name: str, value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"{name} must be one line for a commit trailer, got {value!r}")
    return value.strip()


@dataclass(frozen=True)
class Workspace:
    """A run's worktree. `repo` is the user's repository, `branch` None for a scratch worktree."""

    repo: Path
    worktree: Path
    base: str
    branch: str | None
    run_id: str

    # ---------------------------------------------------------------------------- lifecycle

    @staticmethod
    def create(repo: Path, *, base: str, run_id: str, root: Path) -> "Workspace":
        """Branch `temper/<run_id>` at `base` and its worktree at root/<run_id>/worktree."""
        repo_dir = _top(Path(repo))
        branch = _check_run_id(repo_dir, run_id)
        base_sha = resolve_commit(repo_dir, base)
        if _branch_exists(repo_dir, branch):
            raise WorkspaceError(f"branch {branch} already exists; resume that run or pick another run id")
        run_dir = Path(root).resolve() / run_id
        worktree = run_dir / "worktree"
        if worktree.exists():
            raise WorkspaceError(f"{worktree} already exists; resume that run or pick another run id")
        run_dir.mkdir(parents=True, exist_ok=True)
        _git(repo_dir, "worktree", "add", "-q", "-b", branch, str(worktree), base_sha)
        _hide_held_out(worktree)
        ws = Workspace(repo=repo_dir, worktree=worktree, base=base_sha, branch=branch, run_id=run_id)
        record = {"repo": str(repo_dir), "base": base_sha, "branch": branch, "worktree": str(worktree)}
        write_atomic(run_dir / _RECORD, json.dumps(record, indent=2) + "\n")
        return ws

    @staticmethod
    def open(repo: Path, *, run_id: str, root: Path) -> "Workspace":
        """Re-open a run's workspace (resume). A worktree folder that was deleted is re-created
        from the branch, so only committed attempts survive that."""
        repo_dir = _top(Path(repo))
        branch = _check_run_id(repo_dir, run_id)
        run_dir = Path(root).resolve() / run_id
        record_path = run_dir / _RECORD
        if not record_path.exists():
            raise WorkspaceError(f"no workspace record at {record_path}; was run {run_id!r} started here?")
        record = json.loads(record_path.read_text())
        if not _branch_exists(repo_dir, branch):
            raise WorkspaceError(f"branch {branch} no longer exists; run {run_id!r} cannot be resumed")
        worktree = run_dir / "worktree"
        if not (worktree / ".git").exists():
            _git(repo_dir, "worktree", "prune")
            _git(repo_dir, "worktree", "add", "-q", str(worktree), branch)
            _hide_held_out(worktree)
        return Workspace(repo=repo_dir, worktree=worktree, base=record["base"], branch=branch, run_id=run_id)

    @staticmethod
    @contextlib.contextmanager
    def scratch(repo: Path, base: str) -> Iterator["Workspace"]:
        """A throw-away detached worktree at `base` (for `temper gate --patch`), removed on exit
        whether or not the body raised."""
        repo_dir = _top(Path(repo))
        base_sha = resolve_commit(repo_dir, base)
        # Neutral names: a random temp folder holding a checkout named as the user's own (a clone's name), so
        # nothing in the judged checkout's path says it is being judged.
        holder = Path(tempfile.mkdtemp())
        worktree = holder / (repo_dir.name or "repo")
        try:
            _git(repo_dir, "worktree", "add", "-q", "--detach", str(worktree), base_sha)
            yield Workspace(repo=repo_dir, worktree=worktree, base=base_sha, branch=None, run_id="scratch")
        finally:
            # Deleting the folder and pruning cannot fail on a dirty or half-created worktree the
            # way `git worktree remove` can, so cleanup never masks the body's own exception.
            shutil.rmtree(holder, ignore_errors=True)
            _git(repo_dir, "worktree", "prune")
            # A `git worktree add` cut short (SIGTERM or Ctrl-C while it ran: subprocess.run kills it) leaves its
            # entry locked ("initializing"), which prune skips; a double --force removes a locked, missing one.
            if str(worktree) in _git(repo_dir, "worktree", "list", "--porcelain"):
                _git(repo_dir, "worktree", "remove", "--force", "--force", str(worktree))

    @staticmethod
    def discard(repo: Path, *, run_id: str, root: Path) -> list[str]:
        """Remove whatever exists of a run's worktree and branch (`temper demo` leaves the repository as it found
        it, also when it stops half-way); returns what it removed. The run's records under root/<run_id> stay."""
        repo_dir = _top(Path(repo))
        branch = _check_run_id(repo_dir, run_id)
        worktree = Path(root).resolve() / run_id / "worktree"
        removed = [f"worktree {worktree}"] * worktree.exists() + [f"branch {branch}"] * _branch_exists(repo_dir, branch)
        Workspace(repo=repo_dir, worktree=worktree, base="", branch=branch, run_id=run_id).remove(delete_branch=True)
        return removed

    def remove(self, *, delete_branch: bool = False) -> None:
        """Delete the worktree folder and its registration; the branch (the run's history) stays
        unless `delete_branch`."""
        if (self.worktree / ".git").exists():
            _git(self.repo, "worktree", "remove", "--force", str(self.worktree))
        elif self.worktree.exists():
            shutil.rmtree(self.worktree)
        _git(self.repo, "worktree", "prune")
        if delete_branch and self.branch is not None and _branch_exists(self.repo, self.branch):
            _git(self.repo, "branch", "-D", self.branch)

    # ------------------------------------------------------------------------------ attempts

    def commit_attempt(
        self, attempt: int, *, milestone: str, run_id: str, verdict: str, mfu: float | None, message: str
    ) -> str:
        """Commit the whole worktree (new files too, .gitignore respected) as one attempt; empty
        attempts get an empty commit so there is exactly one commit per attempt. Returns the sha."""
        trailers = {
            "Milestone": _one_line("milestone", milestone),
            "Run": _one_line("run_id", run_id),
            "Attempt": str(int(attempt)),
            "Verdict": _one_line("verdict", verdict),
            "MFU": "n/a" if mfu is None else f"{mfu:.4f}",
        }
        subject = message.strip() or f"attempt {attempt}"
        text = subject + "\n\n" + "\n".join(f"{k}: {v}" for k, v in trailers.items()) + "\n"
        _git(self.worktree, "add", "-A")
        # --cleanup=whitespace keeps lines starting with '#' (markdown headings in agent messages).
        _git(self.worktree, *_TEMPER_IDENTITY, "commit", "-q", "--allow-empty", "--no-verify",
             "--cleanup=whitespace", "-m", text)
        return _git(self.worktree, "rev-parse", "HEAD")

    def history(self) -> list[tuple[str, dict[str, str]]]:
        """(sha, trailers) of the commits since the base, oldest first."""
        out = _git(self.worktree, "log", "--reverse", "-z", "--format=%H%n%(trailers:only,unfold)",
                   f"{self.base}..HEAD")
        entries = []
        for chunk in filter(None, (c.strip("\n") for c in out.split("\0"))):
            sha, _, body = chunk.partition("\n")
            trailers = {}
            for line in body.splitlines():
                key, sep, value = line.partition(":")
                if sep:
                    trailers[key.strip()] = value.strip()
            entries.append((sha, trailers))
        return entries

    def head(self) -> str:
        return _git(self.worktree, "rev-parse", "HEAD")

    # --------------------------------------------------------------------------------- diffs

    @contextlib.contextmanager
    def _snapshot_index(self) -> Iterator[dict[str, str]]:
        """An env whose GIT_INDEX_FILE is a copy of the worktree's index with everything added,
        so untracked files show in diffs without touching the real index."""
        index = _git_path(self.worktree, "--git-path", "index")
        with tempfile.TemporaryDirectory(prefix="temper-index-") as tmp:
            copy = Path(tmp) / "index"
            if index.exists():
                # copy2 keeps the index's mtime: git trusts an entry's stat data only when the file's mtime is
                # older than the index's ("racy git"), so a fresh mtime on the copy would pass a same-size edit
                # made in the checkout's clock tick as unchanged and drop it from the diff.
                shutil.copy2(index, copy)
            env = {"GIT_INDEX_FILE": str(copy)}
            _git(self.worktree, "add", "-A", env=env)
            yield env

    def diff(self, base: str | None = None, *, binary: bool = True) -> str:
        """The worktree (committed or not, untracked files included) against `base` (default: the
        run's base commit), as a patch `git apply` and `apply_patch_file` accept."""
        rev = resolve_commit(self.worktree, base or self.base)
        with self._snapshot_index() as env:
            args = ["diff", "--cached", *_DIFF_OPTS, *(["--binary"] if binary else []), rev]
            return _git(self.worktree, *args, env=env, strip=False)

    def contains_patch(self, path: Path) -> bool:
        """Whether the worktree already holds the patch (it applies in reverse)."""
        try:
            _git(self.worktree, "apply", "--reverse", "--check", str(Path(path).resolve()))
        except WorkspaceError:
            return False
        return True

    def apply_patch_file(self, path: Path) -> None:
        """Apply a patch file (as written by `diff`) to the worktree, all or nothing."""
        patch = Path(path).resolve()
        if not patch.is_file():
            raise WorkspaceError(f"patch file {path} does not exist")
        try:
            _git(self.worktree, "apply", "--check", "--whitespace=nowarn", str(patch))
        except WorkspaceError as e:
            raise WorkspaceError(f"patch {path} does not apply to {self.base[:12]}: {e}") from e
        _git(self.worktree, "apply", "--whitespace=nowarn", str(patch))

    # --------------------------------------------------------------------------------- merge

    def merge_into_user(self, checkout: Path, *, sha: str | None = None) -> str:
        """Merge the run's result (default: its branch tip) into the branch checked out at
        `checkout`: a fast-forward when possible, else a merge commit. Refuses a dirty checkout,
        a detached HEAD, or a merge in progress; a conflicting merge is aborted. Returns the new
        HEAD of the user's branch."""
        user_dir = _top(Path(checkout))
        ours = _git_path(self.repo, "--git-common-dir")
        theirs = _git_path(user_dir, "--git-common-dir")
        if ours != theirs:
            raise WorkspaceError(f"{user_dir} is not a checkout of the repository at {self.repo}")
        try:
            _git(user_dir, "symbolic-ref", "-q", "HEAD")
        except WorkspaceError:
            raise WorkspaceError(f"{user_dir} has a detached HEAD; check out the branch to merge into first")
        for marker in ("MERGE_HEAD", "REBASE_HEAD", "CHERRY_PICK_HEAD", "rebase-merge", "rebase-apply"):
            if _git_path(user_dir, "--git-path", marker).exists():
                raise WorkspaceError(f"{user_dir} has a merge, rebase or cherry-pick in progress; finish it first")
        status = _git(user_dir, "status", "--porcelain", "--untracked-files=no").splitlines()
        if status:
            listing = "\n  ".join(status[:10]) + ("\n  ..." if len(status) > 10 else "")
            raise WorkspaceError(
                f"{user_dir} has uncommitted changes; commit or stash them, then merge again:\n  {listing}"
            )
        target = resolve_commit(self.repo, sha or self.branch or self.head())
        # The user's own identity signs the merge; Temper's only where none is configured.
        has_identity = bool(_git(user_dir, "config", "--default", "", "--get", "user.email"))
        identity = () if has_identity else _TEMPER_IDENTITY
        label = self.branch or target[:12]
        try:
            message = f"Merge {label} (Temper run {self.run_id})"
            _git(user_dir, *identity, "merge", "-q", "--no-verify", "--no-edit", "-m", message, target)
        except WorkspaceError as e:
            merge_head = _git_path(user_dir, "--git-path", "MERGE_HEAD")
            if merge_head.exists():
                conflicts = _git(user_dir, "diff", "--name-only", "--diff-filter=U").splitlines()
                _git(user_dir, "merge", "--abort")
                raise WorkspaceError(
                    f"merging {label} into {user_dir} conflicts in {', '.join(conflicts) or 'some files'}; "
                    f"the merge was aborted and your checkout is unchanged. Merge by hand: git merge {label}"
                ) from e
            raise
        return _git(user_dir, "rev-parse", "HEAD")
