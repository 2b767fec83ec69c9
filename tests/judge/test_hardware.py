"""What the judge learns from the machine itself (nvidia-smi, sinfo), never from the candidate.

A stand-in `nvidia-smi` on PATH answers the two queries the judge makes, as the real one formats them
(`--format=csv,noheader`): GPU names, and the pid / GPU uuid of every process with a CUDA context.
"""

import os
import stat
import sys
from pathlib import Path

import pytest

from harness.jobs import JobSpec, launch
from harness.judge.hardware import Machine, NeedsHardware, check_requires, gpu_processes, probe_machine, wait_watching_gpus
from harness.spec import Requires

__all__: list[str] = []


def fake_smi(folder: Path, names: list[str], marker: str = "") -> None:
    """nvidia-smi answering --query-gpu=name with `names`, --query-compute-apps with every process whose
    command line holds `marker` (all on GPU-0)."""
    script = folder / "nvidia-smi"
    lines = "\n".join(f"echo '{n}'" for n in names)
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=name) {lines or 'true'} ;;
  --query-compute-apps=*) [ -n "{marker}" ] && for p in $(pgrep -f "{marker}"); do echo "$p, GPU-0"; done ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_requires_is_held_against_what_the_machine_has() -> None:
    two_h100 = Machine(gpus=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"), slurm=False)
    assert check_requires(Requires(), Machine(gpus=(), slurm=False)) == "cpu"
    assert check_requires(Requires(device="cuda", gpus=2, gpu_types=["H100", "H200"]), two_h100) == "cuda"
    assert check_requires(Requires(device="any", gpus=1), Machine(gpus=(), slurm=False)) == "cpu"
    with pytest.raises(NeedsHardware, match=r"needs 8 x H100/H200 GPUs; this machine has 2"):
        check_requires(Requires(device="cuda", gpus=8, gpu_types=["H100", "H200"]), two_h100)
    with pytest.raises(NeedsHardware, match="needs 1 x A100 GPU"):
        check_requires(Requires(device="cuda", gpus=1, gpu_types=["A100"]), two_h100)
    with pytest.raises(NeedsHardware, match="SLURM"):
        check_requires(Requires(slurm=True), two_h100)


def test_the_machine_is_asked_through_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, ["NVIDIA H200", "NVIDIA H200"])
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert probe_machine(slurm=False).gpus == ("NVIDIA H200", "NVIDIA H200")


def test_slurm_is_asked_only_when_a_milestone_needs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the SLURM client is installed but no controller runs, `sinfo` takes seconds to fail; every `temper
    gate` of a CPU milestone paid that (9 s a judging on a CI-like machine) before it was asked only for SLURM."""
    asked = tmp_path / "asked"
    for tool in ("sinfo", "sbatch"):
        (tmp_path / tool).write_text(f"#!/bin/sh\necho {tool} >> {asked}\nexit 1\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert check_requires(Requires()) == "cpu" and check_requires(Requires(device="any", gpus=1)) in ("cpu", "cuda")
    assert not asked.exists()
    with pytest.raises(NeedsHardware, match="SLURM"):
        check_requires(Requires(slurm=True))
    assert asked.read_text().split() == ["sinfo"]


def test_the_judge_sees_which_gpus_a_jobs_processes_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"gpu-watch-{os.getpid()}"
    fake_smi(tmp_path, ["NVIDIA H100"], marker=marker)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    job = launch(JobSpec(name="w", argv=(sys.executable, "-c", f"import time; time.sleep(3)  # {marker}"),
                         log_path=tmp_path / "log", timeout_s=60))
    result, seen = wait_watching_gpus(job, sample_s=0.5)
    assert result.exit_code == 0 and seen == {"GPU-0"}
    assert gpu_processes() == {}  # the job is gone, and with it its (stand-in) CUDA context
