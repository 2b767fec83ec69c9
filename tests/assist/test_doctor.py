"""`temper doctor` as a user runs it (a real process of this checkout): what it finds is held against the machine
as this test process sees it independently (sys.version, torch, package metadata), keys are never printed,
exit 0 / 1 / 2, and one line with a fix for each required check that fails."""

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-ant-doctor-test-0123456789abcdef"


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "TEMPER_DATA")}
    full.update({"TEMPER_HOME": str(REPO), **env})
    return subprocess.run([sys.executable, "-m", "harness", "doctor", *args], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def checks(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def test_doctor_reports_this_machine_and_never_prints_a_key(tmp_path: Path) -> None:
    proc = doctor("--json", ANTHROPIC_API_KEY=SECRET)
    found = checks(proc)
    assert list(found) == ["python", "torch", "git", "pytest", "sandbox", "gpu", "kernels", "nccl", "slurm", "account",
                           "nodes", "llm", "data"]
    # Exit status and the required failures agree (base checks only: nothing was asked for).
    failed = [n for n, c in found.items() if c["required"] and not c["ok"]]
    assert proc.returncode == (1 if failed else 0) and json.loads(proc.stdout)["ok"] is (not failed)
    assert {n for n, c in found.items() if c["required"]} == {"python", "torch", "git", "pytest", "sandbox"}  # not slurm, gpu...
    # What it says matches what this process sees by itself.
    assert found["python"]["ok"] and found["python"]["detail"].startswith(".".join(map(str, sys.version_info[:3])))
    assert found["torch"]["detail"].startswith(f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}")
    assert found["gpu"]["ok"] is torch.cuda.is_available()
    for lib in ("nvidia-cutlass-dsl", "quack-kernels", "flash-attn-4"):
        assert f"{lib} {_version(lib)}" in found["kernels"]["detail"]
    # The key is said to be set, never shown, in either format.
    assert SECRET not in proc.stdout + proc.stderr and "ANTHROPIC_API_KEY set" in found["llm"]["detail"]
    text = doctor(ANTHROPIC_API_KEY=SECRET)
    assert SECRET not in text.stdout + text.stderr and "ANTHROPIC_API_KEY set" in text.stdout
    assert text.returncode == proc.returncode


def test_required_checks_fail_with_one_line_each_naming_the_fix(tmp_path: Path) -> None:
    """--requires gpu,data on this machine: every required check that fails gets exactly one stderr line with its fix,
    and the exit status says so. The data folder is an empty one here, so that check fails on any machine."""
    empty = tmp_path / "data"
    empty.mkdir()
    proc = doctor("--requires", "gpu,data", TEMPER_DATA=str(empty))
    rows = [line.split(maxsplit=2) for line in proc.stdout.splitlines()[1:-1]]  # "  FAIL  gpu  no GPU: ..."
    failed = [name for status, name, _ in rows if status == "FAIL"]
    assert "data" in failed and ("gpu" in failed) is (not torch.cuda.is_available())
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == failed and all(". Fix: " in line for line in lines), proc.stderr
    assert f"{empty} lacks corpus, tokenizers/minicpm4" in proc.stderr and "set TEMPER_DATA" in proc.stderr
    assert f"{len(failed)} required check(s) failed" in proc.stdout
    (empty / "corpus").mkdir()
    (empty / "tokenizers" / "minicpm4").mkdir(parents=True)
    assert checks(doctor("--requires", "data", "--json", TEMPER_DATA=str(empty)))["data"]["ok"]


def test_bad_requirements_are_a_usage_error() -> None:
    proc = doctor("--requires", "gpu,quantum")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("temper doctor: --requires 'gpu,quantum': unknown 'quantum'; "
                                   "choose from gpu,slurm,llm,multi-node,data")


def test_slurm_tools_missing_from_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip())
    no_slurm = checks(doctor("--requires", "slurm", "--json", PATH=str(bin_dir)))
    assert not no_slurm["slurm"]["ok"] and no_slurm["slurm"]["required"]
    assert no_slurm["slurm"]["detail"] == "sinfo and sbatch not on PATH"
    local = REPO.parent / "shared" / "slurm" / "start-local-slurm"  # named only where this machine has it
    assert ("start-local-slurm" in no_slurm["slurm"]["fix"]) is local.is_file()


def test_slurm_with_a_real_controller(slurm: None) -> None:
    """Against the single-node SLURM of ../shared/slurm/start-local-slurm (partition `debug`, one node)."""
    found = checks(doctor("--requires", "slurm", "--json"))
    assert found["slurm"]["ok"] and found["slurm"]["required"]
    assert "partition debug* up, 1 node(s)" in found["slurm"]["detail"]
    assert not found["nodes"]["ok"] and "1 node(s)" in found["nodes"]["detail"]  # one node: no multi-node here
    multi = doctor("--requires", "multi-node")
    assert multi.returncode == 1 and any(line.startswith("nodes: ") for line in multi.stderr.splitlines())


def test_doctor_names_only_files_that_exist_and_no_placeholder(tmp_path: Path) -> None:
    """The fixes name the sbatch script only where this Temper home has one (an installed package ships none),
    and no raw `{data}` placeholder reaches the reader."""
    bare = tmp_path / "home"  # a home without scripts/ (as beside an installed package)
    bare.mkdir()
    found = checks(doctor("--json", TEMPER_HOME=str(bare), TEMPER_DATA=str(tmp_path / "none")))
    assert "{data}" not in json.dumps(found)
    assert ".sbatch" not in found["nodes"]["fix"] and "torchrun --nnodes N" in found["nodes"]["fix"]
    for word in (w.strip(",;()") for c in found.values() for w in (c["fix"] + " " + c["detail"]).split()):
        if word.endswith(".sbatch") or "start-local-slurm" in word:
            assert Path(word).is_absolute() and Path(word).is_file(), word
