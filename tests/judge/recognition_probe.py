"""What a process can learn about how it was started, printed as one JSON line (`python -m tests.judge.recognition_probe`).

Run once as a user runs the engine and once through the judge's launch path, the two answers must agree on
every fact but the few docs/HARNESS.md names (tests/judge/test_recognition.py). Each fact is a shape, not a
value that differs between any two runs (a pid's size, not the pid). Standard library only, and it imports
`engine` (stdlib-only at import) to see where that module's bytecode went.
"""

import json
import os
import resource
import socket
import stat
import sys
import tempfile
from pathlib import Path

__all__ = ["facts"]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _status(field: str) -> str:
    for line in _read("/proc/self/status").splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def _can_create_in(folder: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def _kind(fd: int) -> str:
    mode = os.fstat(fd).st_mode
    return "tty" if os.isatty(fd) else "pipe" if stat.S_ISFIFO(mode) else "chr" if stat.S_ISCHR(mode) else "file"


def facts() -> dict[str, object]:
    import importlib.util

    import engine

    cwd = Path.cwd()
    pids = [name for name in os.listdir("/proc") if name.isdigit()]
    pycache = Path(importlib.util.cache_from_source(engine.__file__))
    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags) if not name.startswith("_")
             and not callable(getattr(sys.flags, name))}
    return {
        # process identity
        "pid_below_100": os.getpid() < 100,
        "ppid_is_1": os.getppid() == 1,
        "pid_namespaces": len(_status("NSpid").split()),
        "processes_below_20": len(pids) < 20,
        "pid1_comm": _read("/proc/1/comm").strip(),
        "parent_comm": _read(f"/proc/{os.getppid()}/comm").strip(),
        "session_leader": os.getsid(0) == os.getpid(),
        # users and namespaces
        "uid_gid": [os.getuid(), os.getgid(), os.geteuid(), os.getegid()],
        "uid_map": " ".join(_read("/proc/self/uid_map").split()),
        "hostname": socket.gethostname(),
        "cgroup": _read("/proc/self/cgroup"),
        "no_new_privs": _status("NoNewPrivs"),
        "seccomp": _status("Seccomp"),
        "cap_eff": _status("CapEff"),
        # network
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "sys_class_net": len(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else -1,
        # filesystem
        "cwd_is_checkout": (cwd / "engine" / "__init__.py").is_file(),
        "engine_from_cwd": Path(engine.__file__).parent.parent == cwd,
        "cwd_writable": _can_create_in(cwd),
        "cwd_name_is_12_hex": len(cwd.name) == 12 and all(c in "0123456789abcdef" for c in cwd.name),
        "home_writable": _can_create_in(Path.home()),
        "tempdir": tempfile.gettempdir(),
        "tempdir_writable": _can_create_in(Path(tempfile.gettempdir())),
        "dev_entries_below_30": len(os.listdir("/dev")) < 30,
        "mounts": len(_read("/proc/self/mounts").splitlines()),
        "umask": os.umask(os.umask(0o022)),
        # interpreter
        "flags": flags,
        "pycache_prefix": sys.pycache_prefix,
        "dont_write_bytecode": sys.dont_write_bytecode,
        "engine_bytecode_next_to_it": pycache.is_file(),
        "engine_pycache_writable": _can_create_in(pycache.parent) if pycache.parent.is_dir() else None,
        "sys_path": [("<cwd>" if p in ("", str(cwd)) else p) for p in sys.path],
        "stdout_write_through": getattr(sys.stdout, "write_through", None),
        "stdin": _kind(0),
        "stdout": _kind(1),
        "env_names": sorted(os.environ),
        "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_AS",
                                                                         "RLIMIT_MEMLOCK")},
    }


if __name__ == "__main__":
    print("PROBE " + json.dumps(facts(), sort_keys=True), flush=True)


def test_facts() -> None:
    """Collected only when named (`pytest tests/judge/recognition_probe.py -s`): the facts as a test process sees them."""
    print("\nPROBE " + json.dumps(facts(), sort_keys=True), flush=True)
