"""The bubblewrap sandbox (harness.jobs.sandbox) around local jobs and the shell tool: what a
sandboxed job can write, read and reach, torchrun with gloo inside it, and probe()'s failures."""

import socket
import stat
import sys
from pathlib import Path

import pytest

from harness.jobs import JobError, JobSpec, launch
from harness.jobs.sandbox import Sandbox, probe
from harness.tools.shell import run_shell

__all__: list[str] = []

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
NO_SANDBOX = probe()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=str(NO_SANDBOX))


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    out = {name: tmp_path / name for name in ("job", "records", "logs")}
    for path in out.values():
        path.mkdir()
    (out["records"] / "secret.txt").write_text("the judge's answer\n")
    return out


def _run(dirs: dict[str, Path], code: str, name: str = "boxed", **kw):  # type: ignore[no-untyped-def]
    box = Sandbox(writable=(dirs["job"],), hidden=(dirs["records"],))
    spec = JobSpec(name=name, argv=[PY, "-c", code], cwd=dirs["job"], log_path=dirs["logs"] / f"{name}.log",
                   sandbox=box, timeout_s=120, **kw)
    return launch(spec).wait(poll_s=0.05)


WRITES = """
import os, sys
def attempt(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        return "ok"
    except OSError as err:
        return type(err).__name__
print("job", attempt("out.txt"))
print("repo", attempt(sys.argv[1] + "/planted_by_job.py"))
print("hidden", attempt(sys.argv[2] + "/forged.json"))
print("tmp", attempt("/tmp/scratch"))
"""


@needs_sandbox
def test_a_sandboxed_job_writes_only_in_its_folder(dirs: dict[str, Path]) -> None:
    code = WRITES.replace("sys.argv[1]", repr(str(REPO))).replace("sys.argv[2]", repr(str(dirs["records"])))
    result = _run(dirs, code)
    log = result.read_log()
    assert result.ok and result.sandboxed, log
    assert "job ok" in log and "repo OSError" in log and "hidden OSError" in log and "tmp ok" in log, log
    assert (dirs["job"] / "out.txt").read_text() == "x"
    assert not (REPO / "planted_by_job.py").exists()
    assert sorted(p.name for p in dirs["records"].iterdir()) == ["secret.txt"]
    assert result.to_json()["sandboxed"] is True


@needs_sandbox
def test_a_sandboxed_job_cannot_read_hidden_paths(dirs: dict[str, Path]) -> None:
    hidden_file = dirs["logs"].parent / "reference.bin"
    hidden_file.write_bytes(b"reference data")
    secret = dirs["records"] / "secret.txt"
    code = (f"import os\nprint('listing', os.listdir({str(dirs['records'])!r}))\n"
            f"try:\n    print('file', repr(open({str(hidden_file)!r}, 'rb').read()))\n"
            f"except OSError as err:\n    print('file', type(err).__name__)\n"
            f"try:\n    open({str(secret)!r}).read()\nexcept OSError as err:\n    print('secret', type(err).__name__)\n")
    box = Sandbox(writable=(dirs["job"],), hidden=(dirs["records"], hidden_file))
    spec = JobSpec(name="peek", argv=[PY, "-c", code], cwd=dirs["job"], log_path=dirs["logs"] / "peek.log",
                   sandbox=box, timeout_s=120)
    result = launch(spec).wait(poll_s=0.05)
    log = result.read_log()
    assert result.ok, log
    assert "listing []" in log and "secret FileNotFoundError" in log, log
    assert "reference data" not in log and ("file b''" in log or "file PermissionError" in log), log


@needs_sandbox
def test_a_sandboxed_job_has_no_network(dirs: dict[str, Path]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
                f"    print('connected')\nexcept OSError as err:\n    print('refused', type(err).__name__)\n")
        result = _run(dirs, code, name="net")
    assert result.ok and "refused" in result.read_log() and "connected" not in result.read_log()


@needs_sandbox
def test_torchrun_with_gloo_runs_inside_the_sandbox(dirs: dict[str, Path]) -> None:
    box = Sandbox(writable=(dirs["job"],), hidden=(dirs["records"],))
    spec = JobSpec(name="gloo", argv=[str(FIXTURES / "gloo_allreduce.py")], torchrun=True, nproc=2,
                   cwd=dirs["job"], log_path=dirs["logs"] / "gloo.log", sandbox=box, timeout_s=240)
    result = launch(spec).wait(poll_s=0.1)
    log = result.read_log()
    assert result.ok, log
    assert "rank=0 world=2 sum=3" in log and "rank=1 world=2 sum=3" in log


@needs_sandbox
def test_kill_pattern_sigterm_reaches_the_job_inside_the_sandbox(dirs: dict[str, Path]) -> None:
    box = Sandbox(writable=(dirs["job"],))
    spec = JobSpec(name="killstep", argv=[PY, str(FIXTURES / "stepper.py"), "50"], cwd=dirs["job"],
                   log_path=dirs["logs"] / "k.log", sandbox=box, timeout_s=120, kill_pattern=r"^step 3\b")
    result = launch(spec).wait(poll_s=0.05)
    log = result.read_log()
    assert result.state == "completed" and result.exit_code == 0, log  # it checkpointed and exited 0
    assert (result.signal_sent, result.signal_line) == ("SIGTERM", 3) and "checkpoint at step" in log


@needs_sandbox
def test_a_sandboxed_job_killed_by_a_signal_reports_it(dirs: dict[str, Path]) -> None:
    result = _run(dirs, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", name="selfkill")
    assert (result.state, result.signal, result.exit_code) == ("failed", 9, 137)


@needs_sandbox
def test_the_shell_tool_runs_in_the_sandbox(dirs: dict[str, Path]) -> None:
    box = Sandbox(writable=(dirs["job"],), hidden=(dirs["records"],))
    res = run_shell(f"echo hi > mine.txt && cat mine.txt; ls {dirs['records']}; touch {REPO}/x 2>&1 || echo denied",
                    cwd=dirs["job"], timeout_s=60, output_limit=10_000, sandbox=box)
    assert res.exit_code == 0 and res.output.split() [:1] == ["hi"] and "denied" in res.output, res.output
    assert "secret.txt" not in res.output and not (REPO / "x").exists()


def test_wrap_orders_mounts_and_keeps_the_job_signalable(tmp_path: Path) -> None:
    inner = tmp_path / "records" / "job"
    inner.mkdir(parents=True)
    box = Sandbox(writable=(inner,), hidden=(tmp_path / "records",), bwrap="/x/bwrap")
    argv = box.wrap(["true"], cwd=tmp_path)
    assert argv[:3] == ["/x/bwrap", "--ro-bind", "/"] and argv[-2:] == ["--", "true"]
    text = " ".join(argv)
    # shallow first: the hidden folder, then the writable folder inside it, then the read-only remount
    assert text.index(f"--tmpfs {tmp_path / 'records'}") < text.index(f"--bind {inner}") < text.index("--remount-ro")
    assert "--new-session" not in argv and "--unshare-net" in argv and "--unshare-pid" in argv and "--unshare-user" in argv
    assert "--unshare-all" not in argv and "--unshare-cgroup" not in argv  # a user's run shows the same cgroup
    assert "--dev" in argv and "--dev-bind" not in argv and "/dev/shm" in argv
    assert ["--chdir", str(tmp_path)] == argv[argv.index("--chdir"):argv.index("--chdir") + 2]
    gpu = Sandbox(writable=(inner,), network=True, gpus=True, bwrap="/x/bwrap").wrap(["true"])
    assert "--dev-bind" in gpu and "--unshare-net" not in gpu and "GLOO_SOCKET_IFNAME" not in gpu
    with pytest.raises(ValueError, match="does not exist"):
        Sandbox(writable=(tmp_path / "missing",), bwrap="/x/bwrap").wrap(["true"])


OVERLAID = """
import os
from pathlib import Path
def attempt(what, path):
    try:
        what(path)
        return "ok"
    except OSError as err:
        return type(err).__name__
print("write", attempt(lambda p: Path(p).write_text("mine"), "tree/new.py"))
print("edit", attempt(lambda p: Path(p).write_text("changed"), "tree/kept.py"))
print("delete", attempt(os.unlink, "tree/gone.py"))
print("reads", Path("tree/new.py").read_text(), Path("tree/kept.py").read_text())
print("pycache", attempt(lambda p: Path(p).write_bytes(b"x"), "tree/__pycache__/kept.cpython-311.pyc"))
print("home", attempt(lambda p: Path(p).write_text("x"), str(Path.home() / "HOME_PROBE")))
"""


@needs_sandbox
def test_an_overlaid_folder_is_seen_writable_and_the_changes_are_reported_not_made(dirs: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    """A judged checkout is writable as a user's is (harness/judge/bytecode.py, docs/HARNESS.md): the writes go to
    the caller's `changes` folder, which overlay_changes reads; the folder itself and a read-only folder inside it
    do not change; the home is writable too, its writes discarded."""
    from harness.jobs.sandbox import overlay_changes

    tree = dirs["job"] / "tree"
    (tree / "__pycache__").mkdir(parents=True)
    (tree / "kept.py").write_text("base")
    (tree / "gone.py").write_text("base")
    changes = tmp_path / "changes"
    box = Sandbox(writable=(dirs["job"],), readonly=(tree / "__pycache__",), overlaid=((tree, changes),), home=True)
    home_probe = Path.home() / f".temper-sandbox-{tmp_path.name}"
    spec = JobSpec(name="overlay", argv=[PY, "-c", OVERLAID.replace("HOME_PROBE", home_probe.name)], cwd=dirs["job"], log_path=dirs["logs"] / "overlay.log",
                   sandbox=box, timeout_s=120)
    result = launch(spec).wait(poll_s=0.05)
    log = result.read_log()
    assert result.ok, log
    assert "write ok" in log and "edit ok" in log and "delete ok" in log and "reads mine changed" in log, log
    assert "pycache OSError" in log and "home ok" in log, log
    assert sorted(p.name for p in tree.iterdir()) == ["__pycache__", "gone.py", "kept.py"]
    assert (tree / "kept.py").read_text() == "base" and not any((tree / "__pycache__").iterdir())
    assert overlay_changes(changes) == {"gone.py": "deleted", "kept.py": "written", "new.py": "written"}
    assert not home_probe.exists()


def test_probe_names_a_missing_binary(tmp_path: Path) -> None:
    why = probe(Sandbox(bwrap=str(tmp_path / "no-bwrap")))
    assert why is not None and why.startswith("sandbox unavailable") and "no-bwrap" in why and "--unsandboxed" in why


def test_probe_names_a_refused_user_namespace(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    why = probe(Sandbox(bwrap=str(fake)))
    assert why is not None and "No permissions to create new namespace" in why


def test_a_job_whose_sandbox_cannot_be_built_is_a_clear_error(tmp_path: Path) -> None:
    box = Sandbox(writable=(tmp_path / "not-there",), bwrap="/x/bwrap")
    with pytest.raises(JobError, match="sandbox"):
        launch(JobSpec(name="nobox", argv=["true"], cwd=tmp_path, log_path=tmp_path / "l.log", sandbox=box))


def test_slurm_jobs_refuse_a_sandbox(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not supported under SLURM"):
        JobSpec(name="s", argv=["true"], launcher="slurm", log_path=tmp_path / "l.log", sandbox=Sandbox())


@needs_sandbox
def test_probe_succeeds_here() -> None:
    assert probe() is None
