"""The sbatch script rendered from harness/jobs/templates/sbatch.sh.j2 (no SLURM needed: the
launcher's behaviour against a real SLURM is in test_jobs_slurm.py)."""

import subprocess
from pathlib import Path

import pytest

from harness.jobs import JobSpec
from harness.jobs.slurm import render_sbatch, slurm_time_seconds

__all__: list[str] = []


def test_multi_node_script_rendezvous_at_the_first_node(tmp_path: Path) -> None:
    spec = JobSpec(name="big", argv=["-m", "engine", "pretrain", "--preset", "minicpm4-8b"], launcher="slurm",
                   torchrun=True, nproc=8, nodes=4, gpus_per_node=8, partition="gpu", time_limit="1-00:00:00",
                   requeue=True, sbatch_extra=["--exclusive"], log_path=tmp_path / "big %j.log".replace(" ", "_"),
                   cwd=tmp_path)
    script = render_sbatch(spec)
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --time=1-00:00:00", "#SBATCH --partition=gpu", "#SBATCH --signal=B:USR1@120",
                 "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --exclusive",
                 f"#SBATCH --output={tmp_path}/big_%%j.log",  # a literal % must reach SLURM as %%
                 'scontrol show hostnames "$SLURM_JOB_NODELIST"', "--nnodes=4 --nproc-per-node=8",
                 '--rdzv-endpoint="$head_node:$rdzv_port"', "-m engine pretrain --preset minicpm4-8b",
                 "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", 'scontrol requeue "$SLURM_JOB_ID"'):
        assert line in script, line
    path = tmp_path / "big.sbatch"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_short_time_limits_drop_the_preemption_signal(tmp_path: Path) -> None:
    # SLURM may signal up to 60 s early: with a 2-minute limit, @120 would fire at start.
    spec = JobSpec(name="short", argv=["true"], launcher="slurm", timeout_s=30, log_path=tmp_path / "s.log")
    script = render_sbatch(spec)
    assert "#SBATCH --time=2" in script and "#SBATCH --signal" not in script and "trap '" not in script


@pytest.mark.parametrize(("value", "seconds"), [("5", 300), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400),
                                                 ("1-02:03", 93780), ("0-0:0:7", 7), ("UNLIMITED", None)])
def test_slurm_time_seconds(value: str, seconds: int | None) -> None:
    assert slurm_time_seconds(value) == seconds
